"""`vLLMRollout.generate_token_lists` / `generation_context` on a fake `vllm` module (no GPU here):
the token prompts sent, the SamplingParams mapping, stop ids and per-request budgets, per-request
seeds, the sampled token's log-prob, and an agent-loop trajectory with a tool call through
`AgentRollout` on this engine."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from conftest import load_build_script

from verl.protocol import DataProto
from verl.workers.config import MultiTurnConfig, RolloutConfig
from verl.workers.rollout.agent_rollout import AgentRollout

MODEL_EOS = 9999  # the fake model's own EOS (vLLM stops on it too unless ignore_eos)


@dataclass
class Logprob:
    logprob: float


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class FakeLLM:
    """Records `generate` calls; continues each prompt with `respond(prompt_ids)` and cuts the
    continuation the way vLLM does (first stop id or model EOS kept, then `max_tokens`). The
    log-prob entry of position j holds a decoy token at -9 (first) and the sampled token at -0.1*(j+1)."""

    respond = None

    def __init__(self, **kwargs):
        self.init_kwargs, self.calls, self.events = kwargs, [], []

    def sleep(self, level=1):
        self.events.append("sleep")

    def wake_up(self):
        self.events.append("wake_up")

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        self.calls.append((prompts, params))
        outputs = []
        for prompt, p in zip(prompts, params, strict=True):
            ids, finish = [], "length"
            for tok in FakeLLM.respond(prompt["prompt_token_ids"]):
                if len(ids) == p.max_tokens:
                    break
                ids.append(tok)
                if not p.ignore_eos and (tok == MODEL_EOS or tok in (p.stop_token_ids or [])):
                    finish = "stop"
                    break
            lps = [{tok + 100000: Logprob(-9.0), tok: Logprob(-0.1 * (j + 1))} for j, tok in enumerate(ids)]
            completion = types.SimpleNamespace(token_ids=tuple(ids), logprobs=lps, finish_reason=finish)
            outputs.append(types.SimpleNamespace(outputs=[completion]))
        return outputs


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = FakeLLM, FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    yield
    FakeLLM.respond = None


def _engine(**cfg):
    from verl.workers.rollout.vllm_rollout import vLLMRollout

    return vLLMRollout("/fake/model", RolloutConfig(prompt_length=16, response_length=16, **cfg))


GREEDY = {"do_sample": False, "temperature": 0.7, "top_k": 5, "top_p": 0.9}


def test_token_prompts_stop_ids_budgets_and_log_probs(fake_vllm):
    FakeLLM.respond = lambda p: {3: [10, 11, 2, 12], 1: [13, 14, 15], 7: [16, MODEL_EOS, 17]}[len(p)]
    engine = _engine()
    prompts = [[5, 6, 7], [8], [1, 2, 3, 4, 5, 6, 7]]
    with engine.generation_context():
        out = engine.generate_token_lists(prompts, [4, 2, 5], GREEDY, eos_ids=[2, 4], pad_id=0)
    ((sent, params),) = engine.llm.calls
    assert sent == [{"prompt_token_ids": p} for p in prompts]  # the id lists, unchanged
    # do_sample=False -> greedy whatever the temperature; one SamplingParams per request
    for p, budget in zip(params, [4, 2, 5], strict=True):
        assert (p.n, p.temperature, p.top_k, p.top_p) == (1, 0.0, -1, 1.0)
        assert (p.max_tokens, p.stop_token_ids, p.logprobs, p.detokenize) == (budget, [2, 4], 0, False)
        assert p.seed is None and p.ignore_eos is False
    # stopped on an eos id (kept), cut by the budget, stopped on the model's own EOS
    assert [o.token_ids for o in out] == [[10, 11, 2], [13, 14], [16, MODEL_EOS]]
    assert [o.stop_reason for o in out] == ["eos", "length", "eos"]
    # the sampled token's log-prob at each position, not the decoy's
    assert out[0].log_probs == pytest.approx([-0.1, -0.2, -0.3])
    assert out[1].log_probs == pytest.approx([-0.1, -0.2])


def test_sampling_mapping_seeds_and_errors(fake_vllm):
    FakeLLM.respond = lambda p: [20, 21, 22]
    engine = _engine()
    sampling = {"do_sample": True, "temperature": 0.7, "top_k": 0, "top_p": 0.9}

    def seeds(seed):
        engine.llm.calls.clear()
        gen = torch.Generator().manual_seed(seed)
        engine.generate_token_lists([[1], [1], [1, 2]], [3, 3, 3], sampling, [2], 0, gen)
        ((_, params),) = engine.llm.calls
        assert [(p.temperature, p.top_k, p.top_p) for p in params] == [(0.7, -1, 0.9)] * 3
        return [p.seed for p in params]

    a = seeds(0)
    assert a == seeds(0) and a != seeds(1)  # reproducible per seed
    assert len(set(a)) == 3  # repeated prompts get different seeds
    engine.llm.calls.clear()
    engine.generate_token_lists([[1]], [3], {**sampling, "top_k": 4}, [2], 0)
    assert engine.llm.calls[0][1][0].top_k == 4 and engine.llm.calls[0][1][0].seed is None

    # a zero budget returns an empty turn without asking vLLM (which rejects max_tokens=0)
    engine.llm.calls.clear()
    out = engine.generate_token_lists([[1], [2]], [0, 2], sampling, [2], 0)
    assert [len(p) for p, _ in engine.llm.calls] == [1]
    assert (out[0].token_ids, out[0].stop_reason) == ([], "length") and out[1].token_ids == [20, 21]
    with pytest.raises(ValueError, match="temperature > 0"):
        engine.generate_token_lists([[1]], [3], {**sampling, "temperature": 0.0}, [2], 0)
    with pytest.raises(ValueError, match="2 prompts but 1 max_tokens"):
        engine.generate_token_lists([[1], [2]], [3], sampling, [2], 0)
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate_token_lists([[]], [3], sampling, [2], 0)


def test_ignore_eos_and_generation_context_wakes_the_engine(fake_vllm):
    FakeLLM.respond = lambda p: [2, 2, 2, 2]
    engine = _engine(ignore_eos=True, free_cache_engine=True)
    assert engine.llm.events == ["sleep"]  # asleep after construction
    with engine.generation_context():
        assert engine.llm.events == ["sleep", "wake_up"]
        (out,) = engine.generate_token_lists([[1]], [3], GREEDY, [2], 0)
    p = engine.llm.calls[0][1][0]
    assert p.ignore_eos is True and p.stop_token_ids is None  # vLLM would still stop on stop ids
    assert (out.token_ids, out.stop_reason) == ([2, 2, 2], "length")


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


CALC_TOOLS = """
tools:
  - class_name: verl.tools.calculator_tool.CalculatorTool
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: calculator
        description: c
        parameters: {type: object, properties: {expression: {type: string}}, required: [expression]}
"""


def test_agent_rollout_tool_trajectory_on_the_vllm_engine(fake_vllm, tmp_path):
    tok = load_build_script().build_calculator_tokenizer()
    eos = tok.eos_token_id
    turn1 = tok(call("calculator", expression="12*34"), add_special_tokens=False)["input_ids"] + [eos]
    turn2 = tok("408", add_special_tokens=False)["input_ids"] + [eos]
    # first turn: the tool call; once the tool result is in the prompt: the answer
    FakeLLM.respond = lambda p: turn2 if "<|tool|>" in tok.decode(p, skip_special_tokens=False) else turn1
    (tmp_path / "tools.yaml").write_text(CALC_TOOLS)
    mt = MultiTurnConfig(enable=True, format="hermes", tool_config_path=str(tmp_path / "tools.yaml"))
    cfg = RolloutConfig(prompt_length=32, response_length=96, multi_turn=mt)
    from verl.workers.rollout.vllm_rollout import vLLMRollout

    engine = vLLMRollout("/fake/model", cfg)
    rollout = AgentRollout(engine, None, cfg, tok)
    raw = np.empty(1, dtype=object)
    raw[0] = [{"role": "user", "content": "12*34"}]
    data = DataProto.from_dict(
        tensors={"dummy": torch.zeros(1, 1)},
        non_tensors={"raw_prompt": raw, "agent_name": np.array(["tool_agent"], dtype=object)},
        meta_info={"eos_token_id": eos, "pad_token_id": tok.pad_token_id, "seed": 3},
    )
    out = rollout.generate_sequences(data)
    b = out.batch
    obs = tok("<|tool|>408<|end|><|assistant|>", add_special_tokens=False)["input_ids"]
    n = int(b["attention_mask"][0, 32:].sum())
    assert b["responses"][0, :n].tolist() == turn1 + obs + turn2
    assert b["response_mask"][0].tolist() == [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2) + [0] * (96 - n)
    lp = b["rollout_log_probs"][0]
    expected = [-0.1 * (j + 1) for j in range(len(turn1))] + [0.0] * len(obs)
    expected += [-0.1 * (j + 1) for j in range(len(turn2))]
    assert lp[:n].tolist() == pytest.approx(expected)
    # two decoding calls: the second prompt is the trajectory so far, with the budget left
    calls = engine.llm.calls
    assert len(calls) == 2
    prompt = tok("<|bos|><|user|>12*34<|end|><|assistant|>", add_special_tokens=False)["input_ids"]
    assert calls[1][0] == [{"prompt_token_ids": prompt + turn1 + obs}]
    assert [c[1][0].max_tokens for c in calls] == [96, 96 - len(turn1) - len(obs)]
    assert all(c[1][0].seed is not None and c[1][0].stop_token_ids == [eos] for c in calls)
    assert out.non_tensor_batch["agent_trace"][0]["turns"][0]["calls"][0]["result"] == "408"
