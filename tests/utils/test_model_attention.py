"""The default attention of the built models (`verl.utils.model.GROUPED_SDPA`): transformers' sdpa
with grouped-query key/value heads given to torch unrepeated on CPU. Logits must equal plain sdpa
bitwise (padded, unpadded/causal, with a KV cache as the prefix grouper and the rollout use it),
gradients within float rounding, and `attn_implementation=sdpa` must still select the plain one."""

from __future__ import annotations

import pytest
import torch

from verl.utils.model import GROUPED_SDPA, build_causal_lm, compute_position_id_with_mask


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: 2 query heads per key/value head
        max_position_embeddings=64,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    path = str(tmp_path_factory.mktemp("gqa_model"))
    model.save_pretrained(path)
    grouped = build_causal_lm(path)
    plain = build_causal_lm(path, {"attn_implementation": "sdpa"})
    return grouped, plain


def _inputs(padded: bool, b: int = 6, t: int = 11):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 40, (b, t), generator=gen)
    mask = torch.ones(b, t, dtype=torch.long)
    if padded:
        for i in range(b):
            mask[i, : i % 4] = 0  # left padding of 0..3 tokens
    return ids, mask, compute_position_id_with_mask(mask)


def test_default_is_grouped_and_sdpa_stays_selectable(pair):
    grouped, plain = pair
    assert grouped.config._attn_implementation == GROUPED_SDPA
    assert plain.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("padded", [True, False])
def test_logits_bitwise_and_gradients_close(pair, padded):
    grouped, plain = pair
    ids, mask, pos = _inputs(padded)
    grads = []
    logits = []
    for model in (grouped, plain):
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, attention_mask=mask if padded else None, position_ids=pos).logits
        logits.append(out.detach())
        torch.log_softmax(out, -1)[..., 3].sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert torch.equal(logits[0], logits[1])
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-5, msg=name)


def test_cached_continuation_and_one_token_decoding_bitwise(pair):
    """A multi-token continuation on a KV cache (the prefix grouper's second forward) and a
    one-token step (decoding, where transformers' own function runs)."""
    grouped, plain = pair
    ids, mask, pos = _inputs(True)
    outs = []
    with torch.no_grad():
        for model in (grouped, plain):
            first = model(input_ids=ids[:, :7], attention_mask=mask[:, :7], position_ids=pos[:, :7], use_cache=True)
            cache = first.past_key_values
            cont = model(
                input_ids=ids[:, 7:10], attention_mask=mask[:, :10], position_ids=pos[:, 7:10], past_key_values=cache
            )
            step = model(
                input_ids=ids[:, 10:],
                attention_mask=mask,
                position_ids=pos[:, 10:],
                past_key_values=cont.past_key_values,
            )
            outs.append((first.logits, cont.logits, step.logits))
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)


def test_grouped_path_runs_for_multi_token_queries_only(pair, monkeypatch):
    import transformers.integrations.sdpa_attention as sa

    grouped, _ = pair
    seen = []
    real = sa.sdpa_attention_forward

    def spy(module, query, *a, **k):
        seen.append(query.shape[2])
        return real(module, query, *a, **k)

    monkeypatch.setattr(sa, "sdpa_attention_forward", spy)
    ids, mask, pos = _inputs(True)
    with torch.no_grad():
        out = grouped(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=pos[:, :-1], use_cache=True)
        assert seen == []  # 10-token queries: torch's grouped-query SDPA, transformers' function not called
        grouped(
            input_ids=ids[:, -1:], attention_mask=mask, position_ids=pos[:, -1:], past_key_values=out.past_key_values
        )
    assert seen == [1, 1]  # one-token decoding: transformers' function, once per layer
