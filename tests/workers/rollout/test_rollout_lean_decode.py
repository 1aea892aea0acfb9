"""The hf rollout's lean Llama decoding step (`lean_decode.LlamaDecodeStep`): the same tokens and
bitwise the same log-probs as calling the transformers model at every step (sampling with a seed,
greedy, padded and unpadded prompts, rows dropped on EOS, micro-batched decoding), logits equal to
the model's own forward at each step, and the plain model call wherever the equivalence is not
known to hold (hooks, other attention, training mode, a cache without the rollout's buffers)."""

from __future__ import annotations

import pytest
import torch
from test_workers_common import PROMPTS, build_tiny_llama, make_batch

import verl.workers.rollout.hf_rollout as hf
from verl.protocol import DataProto
from verl.workers.config import RolloutConfig
from verl.workers.rollout.lean_decode import LlamaDecodeStep

REAL_BUILD = LlamaDecodeStep.build.__func__


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    path = build_tiny_llama(str(tmp_path_factory.mktemp("tiny_lean")))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    return path, tok, model


def _prompts(tok, prompts):
    # prompt width = the longest prompt: equal prompts have no padding at all
    width = max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    b = make_batch(tok, prompts, ["1"] * len(prompts), prompt_len=width, resp_len=1)
    keys = ("input_ids", "attention_mask", "position_ids")
    return DataProto.from_dict(tensors={k: b[k][:, :width] for k in keys})


def _rollout(model, tok, prompts, lean: bool, monkeypatch, steps: list | None = None, **cfg):
    def build(cls, *args):
        step = REAL_BUILD(cls, *args) if lean else None
        if step is not None and steps is not None:
            inner = step.step

            def counted(*a):
                steps.append(1)
                return inner(*a)

            step.step = counted
        return step

    monkeypatch.setattr(LlamaDecodeStep, "build", classmethod(build))
    base = {"response_length": 12, "n": 1}
    base.update(cfg)
    ro = hf.HFRollout(model, RolloutConfig(**base))
    d = _prompts(tok, prompts)
    # eos = a frequent character too, so that rows finish at different steps and are dropped
    d.meta_info = {
        "eos_token_id": [tok.eos_token_id, tok.convert_tokens_to_ids("1")],
        "pad_token_id": tok.pad_token_id,
        "seed": 11,
    }
    return ro.generate_sequences(d).batch


@pytest.mark.parametrize(
    "do_sample, prompts, cfg",
    [
        (True, PROMPTS * 3, {}),
        (False, PROMPTS * 3, {}),
        (True, PROMPTS * 3, {"micro_batch_size": 5}),
        (True, ["12+34="] * 6, {"ignore_eos": True}),  # no padding: transformers passes no mask
        (True, PROMPTS * 2, {"ignore_eos": True}),
    ],
)
def test_lean_step_gives_the_same_rollout(tiny, monkeypatch, do_sample, prompts, cfg):
    _, tok, model = tiny
    steps: list = []
    ref = _rollout(model, tok, prompts, False, monkeypatch, do_sample=do_sample, **cfg)
    out = _rollout(model, tok, prompts, True, monkeypatch, steps=steps, do_sample=do_sample, **cfg)
    assert steps  # the lean path ran
    if not cfg.get("ignore_eos"):
        lengths = ref["response_mask"].sum(-1)
        assert lengths.min() < lengths.max()  # rows of different lengths: the drop path ran
    assert torch.equal(ref["responses"], out["responses"])
    assert torch.equal(ref["response_mask"], out["response_mask"])
    assert torch.equal(ref["rollout_log_probs"], out["rollout_log_probs"])
    # the lean loop runs in inference mode; its outputs must stay usable by autograd (the update
    # gathers log-probs at `responses`, which saves them for the backward)
    assert not any(out[k].is_inference() for k in out.keys())
    logits = torch.zeros(*out["responses"].shape, 50, requires_grad=True)
    logits.gather(-1, out["responses"].unsqueeze(-1)).sum().backward()


@pytest.mark.parametrize("padded", [True, False])
def test_lean_logits_equal_the_model_forward(tiny, padded):
    _, tok, model = tiny
    d = _prompts(tok, PROMPTS if padded else ["13+4="] * 4)
    ids, mask, pos = (d.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    assert bool((mask == 0).any()) == padded
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        ref_cache = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True).past_key_values
        cache = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True).past_key_values
        assert hf._preallocate_cache(cache, ids.shape[1] + 4) == model.config.num_hidden_layers
        step = LlamaDecodeStep.build(model, cache, hf._buffered_layer_class())
        assert step is not None
        last = pos[:, -1]
        for _ in range(4):
            tok_t = torch.randint(0, len(tok), (ids.shape[0],), generator=gen)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            last = last + 1
            ref = model(
                input_ids=tok_t[:, None],
                attention_mask=mask,
                position_ids=last[:, None],
                past_key_values=ref_cache,
                use_cache=True,
            ).logits[:, -1]
            assert torch.equal(step.step(tok_t, mask, last), ref)


def test_lean_step_only_where_it_is_known_exact(tiny, tmp_path):
    from transformers import AutoModelForCausalLM, DynamicCache

    path, tok, model = tiny
    d = _prompts(tok, PROMPTS)
    with torch.no_grad():
        cache = model(**{k: d.batch[k] for k in ("input_ids", "attention_mask")}, use_cache=True).past_key_values
    buffered = hf._buffered_layer_class()
    assert LlamaDecodeStep.build(model, cache, buffered) is None  # plain DynamicLayers, not buffers
    hf._preallocate_cache(cache, 20)
    assert LlamaDecodeStep.build(model, cache, buffered) is not None
    assert LlamaDecodeStep.build(model, DynamicCache(), buffered) is None
    handle = model.model.layers[0].mlp.register_forward_hook(lambda *a: None)  # e.g. FSDP2, peft
    try:
        assert LlamaDecodeStep.build(model, cache, buffered) is None
    finally:
        handle.remove()
    model.train()
    try:
        assert LlamaDecodeStep.build(model, cache, buffered) is None
    finally:
        model.eval()
    eager = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    assert LlamaDecodeStep.build(eager, cache, buffered) is None


def test_lean_step_with_the_built_models_default_attention(tiny, monkeypatch):
    """The workers build models with `GROUPED_SDPA` attention; the lean step applies there too."""
    from verl.utils.model import GROUPED_SDPA, build_causal_lm

    path, tok, _ = tiny
    model = build_causal_lm(path).eval()
    assert model.config._attn_implementation == GROUPED_SDPA
    steps: list = []
    ref = _rollout(model, tok, PROMPTS * 2, False, monkeypatch, do_sample=True)
    out = _rollout(model, tok, PROMPTS * 2, True, monkeypatch, steps=steps, do_sample=True)
    assert steps
    assert torch.equal(ref["responses"], out["responses"])
    assert torch.equal(ref["rollout_log_probs"], out["rollout_log_probs"])
