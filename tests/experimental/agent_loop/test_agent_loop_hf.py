"""The agent loop on the real hf engine: batched generation of concurrent trajectories, learner
log-probs equal to the rollout's across turns, exact zero gradient on observation tokens, the
final ids equal to the per-turn concatenation; the batching server does not serialise tool waits;
turn-level GAE and grpo_process on a multi-turn layout with hand-worked numbers."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
import torch
from conftest import build_tiny_model, load_build_script

from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config import ActorConfig, MultiTurnConfig, RolloutConfig
from verl.workers.rollout import HFRollout
from verl.workers.rollout.agent_rollout import AgentRollout
from verl.workers.rollout.async_server import BatchingGenerationServer, TokenOutput


@ToolParser.register("test_always_call")
class AlwaysCallParser(ToolParser):
    """Every finished turn calls echo with its own length: forces multi-turn trajectories from a
    random model."""

    async def extract_tool_calls(self, responses_ids):
        return "", [FunctionCall(name="echo", arguments=json.dumps({"text": "n" * (len(responses_ids) % 5 + 1)}))]


ECHO_TOOLS = """
tools:
  - class_name: test_agent_loop.SlowEcho
    config: {type: native, sleep_s: 0.0}
    tool_schema:
      type: function
      function:
        name: echo
        description: e
        parameters: {type: object, properties: {text: {type: string}}, required: [text]}
"""


@pytest.fixture(scope="module")
def tiny_calc(tmp_path_factory):
    torch.set_num_threads(1)
    bs = load_build_script()
    tok = bs.build_calculator_tokenizer()
    model = build_tiny_model(tok, num_heads=4, num_kv_heads=2, max_position_embeddings=512)
    with torch.no_grad():  # make EOS likely so turns end at different lengths
        model.lm_head.weight[tok.eos_token_id] *= 4.0
    path = tmp_path_factory.mktemp("tools") / "tools.yaml"
    path.write_text(ECHO_TOOLS)
    return tok, model, str(path)


def _rollout(tok, model, tools, **mt):
    cfg = RolloutConfig(
        prompt_length=24,
        response_length=48,
        do_sample=True,
        temperature=1.0,
        multi_turn=MultiTurnConfig(
            enable=True, format="test_always_call", tool_config_path=tools, max_assistant_turns=3, **mt
        ),
    )
    return AgentRollout(HFRollout(model, cfg), None, cfg, tok), cfg


def _prompts(tok, users):
    raw = np.empty(len(users), dtype=object)
    for i, u in enumerate(users):
        raw[i] = [{"role": "user", "content": u}]
    return DataProto.from_dict(
        tensors={"dummy": torch.zeros(len(users), 1)},
        non_tensors={"raw_prompt": raw, "agent_name": np.array(["tool_agent"] * len(users), dtype=object)},
        meta_info={"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id},
    )


USERS = ["1+2", "30*4", "7-1", "123*45", "9", "10/5", "11*11", "2+2"]


def test_multi_turn_rollout_matches_learner_and_has_zero_gradient_on_observations(tiny_calc):
    tok, model, tools = tiny_calc
    torch.manual_seed(0)
    ro, cfg = _rollout(tok, model, tools)
    out = ro.generate_sequences(_prompts(tok, USERS))
    b = out.batch
    mask = b["response_mask"].bool()
    obs = b["attention_mask"][:, cfg.prompt_length :].bool() & ~mask
    assert obs.any(), "expected observation tokens between turns"
    assert (out.non_tensor_batch["__num_turns__"] > 2).any()
    # the decoding calls batched the concurrent trajectories
    assert out.meta_info["metrics"]["agent/decode_batch_size/max"] > 1
    # final input_ids = prompt ++ the concatenation of generated and observation ids, per trace
    for i in range(len(USERS)):
        n = int(b["attention_mask"][i, cfg.prompt_length :].sum())
        assert torch.equal(b["input_ids"][i, cfg.prompt_length : cfg.prompt_length + n], b["responses"][i, :n])
        text = tok.decode(b["responses"][i, :n].tolist(), skip_special_tokens=False)
        for turn in out.non_tensor_batch["agent_trace"][i]["turns"]:
            for c in turn["calls"]:
                assert f"<|tool|>{c['result']}<|end|><|assistant|>" in text
    # learner log-probs of the generated tokens = the sampler's, across turns (fp32)
    actor = DataParallelPPOActor(
        ActorConfig(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=4, use_dynamic_bsz=False), model
    )
    out.meta_info.update(temperature=1.0, micro_batch_size=4)
    lp, _ = actor.compute_log_prob(out)
    assert (lp - b["rollout_log_probs"])[mask].abs().max() <= 1e-5
    assert (b["rollout_log_probs"][~mask] == 0).all()

    # gradient of the actor's loss terms (policy, entropy, KL) w.r.t. every observation token is 0
    micro = {k: b[k] for k in ("responses", "input_ids", "attention_mask", "position_ids")}
    entropy, log_prob, _ = actor._forward_micro_batch(micro, 1.0, calculate_entropy=True)
    log_prob.retain_grad()
    entropy.retain_grad()
    adv = torch.randn_like(log_prob)
    m = b["response_mask"]
    pg, _ = core_algos.unpack_policy_loss_output(
        core_algos.get_policy_loss_fn("vanilla")(
            old_log_prob=log_prob.detach(),
            log_prob=log_prob,
            advantages=adv,
            response_mask=m,
            loss_agg_mode="token-mean",
            config=ActorConfig(),
        )
    )
    kl = core_algos.agg_loss(core_algos.kl_penalty(log_prob, log_prob.detach() - 0.1, "low_var_kl"), m, "token-mean")
    loss = pg - 0.01 * core_algos.agg_loss(entropy, m, "token-mean") + 0.1 * kl
    loss.backward()
    assert (log_prob.grad[obs] == 0).all() and (entropy.grad[obs] == 0).all()
    assert (log_prob.grad[mask] != 0).any() and (entropy.grad[mask] != 0).all()


def test_single_turn_agent_equals_plain_rollout_tokens(tiny_calc):
    """With greedy decoding, single_turn_agent on the hf engine gives the plain rollout's ids."""
    tok, model, tools = tiny_calc
    cfg = RolloutConfig(prompt_length=24, response_length=16, do_sample=False, multi_turn=MultiTurnConfig(enable=True))
    ro = AgentRollout(HFRollout(model, cfg), None, cfg, tok)
    data = _prompts(tok, USERS[:4])
    data.non_tensor_batch["agent_name"] = np.array(["single_turn_agent"] * 4, dtype=object)
    out = ro.generate_sequences(data)
    plain = HFRollout(model, cfg)
    for i, u in enumerate(USERS[:4]):
        ids = tok.apply_chat_template([{"role": "user", "content": u}], add_generation_prompt=True, tokenize=False)
        ids = tok(ids, add_special_tokens=False)["input_ids"]
        one = plain.generate_token_lists([ids], [16], {"do_sample": False}, [tok.eos_token_id], tok.pad_token_id)[0]
        n = len(one.token_ids)
        assert out.batch["responses"][i, :n].tolist() == one.token_ids
        assert int(out.batch["response_mask"][i].sum()) == n


# ---------------------------------------------------------------------------------------------
# concurrency of the batching server


def test_batching_server_does_not_serialise_tool_waits():
    """8 trajectories x 2 turns with a 50 ms tool between: about 2 decode calls + one wait, not 8 waits."""
    sizes = []

    def fake_batch(ids, max_tokens, sampling):
        sizes.append(len(ids))
        time.sleep(0.02)  # one decoding call
        return [TokenOutput(token_ids=[1], log_probs=[0.0]) for _ in ids]

    server = BatchingGenerationServer(fake_batch)

    async def trajectory(i):
        await server.generate(f"r{i}", prompt_ids=[1], sampling_params={"max_tokens": 1})
        await asyncio.sleep(0.05)  # the tool
        await server.generate(f"r{i}", prompt_ids=[1, 1], sampling_params={"max_tokens": 1})

    async def main():
        await asyncio.gather(*(trajectory(i) for i in range(8)))

    start = time.perf_counter()
    asyncio.run(main())
    elapsed = time.perf_counter() - start
    server.close()
    assert sizes == [8, 8], sizes
    assert elapsed < 0.3, elapsed  # serial waits alone would be 8 x 0.05 = 0.4 s


def test_batching_server_keeps_sampling_settings_apart_and_delivers_errors():
    seen = []

    def fake_batch(ids, max_tokens, sampling):
        seen.append((len(ids), sampling["temperature"]))
        if sampling["temperature"] == 0.5:
            raise RuntimeError("engine failed")
        return [TokenOutput(token_ids=[2] * m, log_probs=[0.0] * m) for m in max_tokens]

    server = BatchingGenerationServer(fake_batch)

    async def main():
        a = server.generate("a", prompt_ids=[1], sampling_params={"max_tokens": 2, "temperature": 1.0})
        b = server.generate("b", prompt_ids=[1], sampling_params={"max_tokens": 3, "temperature": 1.0})
        c = server.generate("c", prompt_ids=[1], sampling_params={"max_tokens": 1, "temperature": 0.5})
        return await asyncio.gather(a, b, c, return_exceptions=True)

    ra, rb, rc = asyncio.run(main())
    server.close()
    assert sorted(seen) == [(1, 0.5), (2, 1.0)]
    assert ra.token_ids == [2, 2] and rb.token_ids == [2, 2, 2]
    assert isinstance(rc, RuntimeError)


# ---------------------------------------------------------------------------------------------
# advantages on a multi-turn layout (turn ids / step ends as the agent loop fills them)


def test_turn_level_gae_on_agent_layout():
    from verl.experimental.agent_loop.agent_loop import derive_turns

    # response: turn 0 (2 tokens), observation (2), turn 1 (2 tokens), padding (1)
    mask = [1, 1, 0, 0, 1, 1, 0]
    tid, _ = derive_turns(mask)
    m = torch.tensor([mask], dtype=torch.float32)
    scores = torch.tensor([[0, 0, 0, 0, 0, 1.0, 0]])
    values = torch.tensor([[0.5, 9, 9, 9, 0.8, 9, 9]])  # only the first action token of a turn counts
    cfg = {"gamma": 0.9, "lam": 0.5, "gae_timestep_unit": "turn"}
    adv, ret = core_algos.compute_gae_advantage_return(
        scores, values, m, config=cfg, turn_ids=torch.tensor([tid]), token_level_scores=scores
    )
    # turn 1: delta = 1 - 0.8 = 0.2 = A_1; turn 0: delta = 0 + 0.9*0.8 - 0.5 = 0.22, A_0 = 0.22 + 0.9*0.5*0.2 = 0.31
    assert torch.allclose(ret[0], torch.tensor([0.81, 0.81, 0, 0, 1.0, 1.0, 0]), atol=1e-6)
    raw = torch.tensor([[0.31, 0.31, 0, 0, 0.2, 0.2, 0]])
    from verl.utils import torch_functional as verl_F

    assert torch.allclose(adv, verl_F.masked_whiten(raw, m) * m, atol=1e-5)


def test_grpo_process_on_agent_layout():
    from verl.experimental.agent_loop.agent_loop import derive_turns

    # trajectory A: two turns (step rewards 0 then 1); trajectory B: one turn (reward 0); one group
    mask_a = [1, 1, 0, 0, 1, 1]
    mask_b = [1, 1, 1, 0, 0, 0]
    ends = torch.tensor([derive_turns(mask_a)[1], derive_turns(mask_b)[1]])
    m = torch.tensor([mask_a, mask_b])
    r = torch.zeros(2, 6)
    r[0, 5] = 1.0
    adv, _ = core_algos.compute_grpo_process_advantage(
        r, m, np.array(["g", "g"], dtype=object), step_end_mask=ends, epsilon=0.0
    )
    # steps (0, 1, 0): mean 1/3, unbiased std sqrt(1/3) -> normalised (-0.57735, 1.1547, -0.57735)
    s = 3**-0.5
    expected = torch.tensor([[s, s, 0, 0, 2 * s, 2 * s], [-s, -s, -s, 0, 0, 0]])
    assert torch.allclose(adv, expected, atol=1e-5)
