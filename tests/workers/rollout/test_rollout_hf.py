"""HF rollout engine: KV-cached decoding equals transformers `generate`, EOS/padding are exact,
rollout log-probs equal the learner's recomputation, sampling knobs, weight sync of a copy."""

from __future__ import annotations

import copy

import pytest
import torch
from test_workers_common import PROMPTS, build_tiny_llama

from verl.protocol import DataProto
from verl.utils.model import compute_position_id_with_mask
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config import ActorConfig, RolloutConfig
from verl.workers.rollout import HFRollout, get_rollout_class
from verl.workers.rollout.hf_rollout import filter_logits_top_k_top_p


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    path = build_tiny_llama(str(tmp_path_factory.mktemp("tiny_rollout")))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    # make EOS reasonably likely so that sampled responses end at different lengths
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] *= 3.0
    return path, tok, model


def _prompts(tok, prompts=PROMPTS, prompt_len=8, **meta):
    enc = tok(prompts, add_special_tokens=False, padding="max_length", max_length=prompt_len, return_tensors="pt")
    mask = enc["attention_mask"]
    meta = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id, **meta}
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": compute_position_id_with_mask(mask),
        },
        meta_info=meta,
    )


def _rollout(model, **cfg):
    base = dict(response_length=12, prompt_length=8, do_sample=True, temperature=1.0)
    base.update(cfg)
    return HFRollout(model, RolloutConfig(**base))


def test_registry_resolves_hf():
    assert get_rollout_class("hf") is HFRollout
    with pytest.raises(ValueError, match="registered"):
        get_rollout_class("nope")


def test_greedy_equals_transformers_generate(tiny):
    _, tok, model = tiny
    data = _prompts(tok)
    out = _rollout(model, do_sample=False).generate_sequences(data)
    ref = model.generate(
        input_ids=data.batch["input_ids"],
        attention_mask=data.batch["attention_mask"],
        max_new_tokens=12,
        do_sample=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )[:, 8:]
    ref = torch.nn.functional.pad(ref, (0, 12 - ref.shape[1]), value=tok.pad_token_id)
    assert torch.equal(out.batch["responses"], ref)


def test_eos_padding_and_masks_are_exact(tiny):
    _, tok, model = tiny
    torch.manual_seed(0)
    data = _prompts(tok, PROMPTS * 4)
    out = _rollout(model).generate_sequences(data)
    resp, mask = out.batch["responses"], out.batch["response_mask"]
    eos, pad = tok.eos_token_id, tok.pad_token_id
    lengths = mask.sum(-1)
    assert resp.shape == (32, 12)
    assert (lengths < 12).any() and (lengths == 12).any()  # some ended with EOS, some were truncated
    for i in range(32):
        n = int(lengths[i])
        assert torch.all(mask[i, :n] == 1) and torch.all(mask[i, n:] == 0)
        assert torch.all(resp[i, n:] == pad)
        body = resp[i, :n].tolist()
        if n < 12:
            assert body[-1] == eos and eos not in body[:-1]
        else:
            assert eos not in body[:-1]
    assert torch.equal(out.batch["attention_mask"], torch.cat([data.batch["attention_mask"], mask], 1))
    assert torch.equal(out.batch["input_ids"][:, 8:], resp)
    # positions continue after the last prompt token
    pos = out.batch["position_ids"]
    assert torch.equal(pos[:, 8:], pos[:, 7:8] + torch.arange(1, 13))
    assert torch.all(out.batch["rollout_log_probs"][mask == 0] == 0)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_rollout_log_probs_match_learner(tiny, temperature):
    _, tok, model = tiny
    torch.manual_seed(1)
    out = _rollout(model, temperature=temperature).generate_sequences(_prompts(tok, PROMPTS * 2))
    actor = DataParallelPPOActor(
        ActorConfig(ppo_mini_batch_size=16, ppo_micro_batch_size_per_gpu=4, use_dynamic_bsz=False), model
    )
    out.meta_info.update(temperature=temperature, micro_batch_size=4)
    lp, _ = actor.compute_log_prob(out)
    mask = out.batch["response_mask"].bool()
    diff = (lp - out.batch["rollout_log_probs"])[mask]
    assert diff.abs().max() < 1e-5
    # the mismatch KL (k3) is ~0 on CPU fp32
    log_ratio = diff
    k3 = (torch.exp(log_ratio) - 1 - log_ratio).mean()
    assert k3 < 1e-9


def test_repeated_prompts_share_prefill_and_match(tiny):
    _, tok, model = tiny
    data = _prompts(tok, [p for p in PROMPTS for _ in range(3)])  # interleaved repeats, as the trainer does
    single = _prompts(tok, PROMPTS)
    ro = _rollout(model, do_sample=False)
    rep = ro.generate_sequences(data).batch["responses"]
    one = ro.generate_sequences(single).batch["responses"]
    assert torch.equal(rep, one.repeat_interleave(3, dim=0))


def test_micro_batch_size_and_validation_kwargs(tiny):
    _, tok, model = tiny
    greedy = _rollout(model, do_sample=False).generate_sequences(_prompts(tok)).batch["responses"]
    ro = _rollout(model, micro_batch_size=3)  # sampling by default, greedy for validation
    val = ro.generate_sequences(_prompts(tok, validate=True)).batch["responses"]
    assert torch.equal(val, greedy)


def test_top_k_one_and_tiny_top_p_are_greedy(tiny):
    _, tok, model = tiny
    greedy = _rollout(model, do_sample=False).generate_sequences(_prompts(tok)).batch["responses"]
    torch.manual_seed(3)
    assert torch.equal(_rollout(model, top_k=1).generate_sequences(_prompts(tok)).batch["responses"], greedy)
    assert torch.equal(_rollout(model, top_p=1e-6).generate_sequences(_prompts(tok)).batch["responses"], greedy)


def test_filter_top_k_top_p_values():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = filter_logits_top_k_top_p(logits, top_k=2)
    assert torch.isinf(kept[0, 2:]).all() and torch.isfinite(kept[0, :2]).all()
    kept = filter_logits_top_k_top_p(logits, top_p=0.8)  # 0.5 + 0.3 reaches 0.8
    assert torch.isfinite(kept[0, :2]).all() and torch.isinf(kept[0, 2:]).all()
    kept = filter_logits_top_k_top_p(logits, top_p=0.81)
    assert torch.isfinite(kept[0, :3]).all() and torch.isinf(kept[0, 3])


def test_separate_copy_weight_sync_and_probe(tiny):
    _, tok, model = tiny
    actor_model = copy.deepcopy(model)
    copy_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in actor_model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # the actor moved after an update
    ro = HFRollout(copy_model, RolloutConfig(response_length=6, prompt_length=8), owns_module=True)
    assert not ro.shares_weights_with(actor_model)
    probe = _prompts(tok)
    gen = _rollout(actor_model, do_sample=False).generate_sequences(probe)
    args = (gen.batch["input_ids"], gen.batch["attention_mask"], gen.batch["position_ids"], gen.batch["responses"])
    actor = DataParallelPPOActor(
        ActorConfig(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=8, use_dynamic_bsz=False), actor_model
    )
    gen.meta_info["micro_batch_size"] = 8
    actor_lp, _ = actor.compute_log_prob(gen)
    mask = gen.batch["response_mask"].bool()
    assert (ro.probe_log_probs(*args) - actor_lp)[mask].abs().max() > 1e-4  # stale copy
    ro.update_weights(actor_model.state_dict())
    assert (ro.probe_log_probs(*args) - actor_lp)[mask].abs().max() < 1e-5
    bad = dict(actor_model.state_dict())
    bad.pop("lm_head.weight")
    with pytest.raises(RuntimeError, match="missing"):
        ro.update_weights(bad)
    bad = dict(actor_model.state_dict())
    bad["lm_head.weight"] = bad["lm_head.weight"][:-1]
    with pytest.raises(RuntimeError):
        ro.update_weights(bad)


def test_shared_module_needs_no_sync(tiny):
    _, _, model = tiny
    ro = _rollout(model)
    assert ro.shares_weights_with(model)
    ro.update_weights({})  # no-op by design


def test_vllm_rollout_skips_without_vllm():
    from verl.utils.import_utils import is_vllm_available

    if is_vllm_available() and torch.cuda.is_available():
        pytest.skip("vllm present: covered by GPU tests")
    cls = get_rollout_class("vllm")
    with pytest.raises((ImportError, RuntimeError), match="vllm|CUDA"):
        cls(model_path="/nonexistent", config=RolloutConfig())


def test_meta_seed_makes_sampling_reproducible_and_dropping_rows_is_exact(tiny):
    _, tok, model = tiny
    ro = _rollout(model)
    a = ro.generate_sequences(_prompts(tok, PROMPTS * 4, seed=5))
    b = ro.generate_sequences(_prompts(tok, PROMPTS * 4, seed=5))
    c = ro.generate_sequences(_prompts(tok, PROMPTS * 4, seed=6))
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert not torch.equal(a.batch["responses"], c.batch["responses"])
    # rows finished early (so finished rows were dropped from the decoding batch) ...
    lengths = a.batch["response_mask"].sum(-1)
    assert (lengths <= 6).sum() >= 8
    # ... and every row is still exactly what decoding it alone gives
    full = _rollout(model, do_sample=False).generate_sequences(_prompts(tok, PROMPTS * 4)).batch["responses"]
    for i in (0, 5, 17, 30):
        one = _prompts(tok, [(PROMPTS * 4)[i]])
        single = _rollout(model, do_sample=False).generate_sequences(one).batch["responses"][0]
        assert torch.equal(single, full[i])


def test_greedy_with_temperature_zero_matches_learner(tiny):
    """rollout.temperature=0 with do_sample=False is a valid greedy config: the rollout reports
    T=1 log-probs and the learner, given the same temperature 0, must not divide by it."""
    _, tok, model = tiny
    out = _rollout(model, do_sample=False, temperature=0.0).generate_sequences(_prompts(tok))
    actor = DataParallelPPOActor(
        ActorConfig(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=4, use_dynamic_bsz=False), model
    )
    out.meta_info.update(temperature=0.0, micro_batch_size=4)
    lp, _ = actor.compute_log_prob(out)
    mask = out.batch["response_mask"].bool()
    assert torch.isfinite(lp).all()
    assert (lp - out.batch["rollout_log_probs"])[mask].abs().max() < 1e-5


def test_prefill_projects_only_the_last_position(tiny):
    _, tok, model = tiny
    seen = []
    handle = model.lm_head.register_forward_hook(lambda _mod, inp, _out: seen.append(inp[0].shape[1]))
    try:
        _rollout(model, do_sample=False, response_length=3).generate_sequences(_prompts(tok))
    finally:
        handle.remove()
    assert seen and set(seen) == {1}  # prefill and decoding steps: one position each
