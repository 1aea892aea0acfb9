"""The hf rollout's preallocated KV cache: decoding writes in place into a buffer instead of
re-concatenating the cache, with the same tokens and log-probs as the dynamic cache (sampling
with a seed, greedy, rows dropped on EOS), and a buffer that grows when a caller goes past it."""

from __future__ import annotations

import pytest
import torch
from test_workers_common import PROMPTS, build_tiny_llama, make_batch

import verl.workers.rollout.hf_rollout as hf
from verl.protocol import DataProto
from verl.workers.config import RolloutConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    path = build_tiny_llama(str(tmp_path_factory.mktemp("tiny_static")))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    return tok, model


def _prompts(tok, repeat=3):
    b = make_batch(tok, PROMPTS * repeat, ["1"] * (len(PROMPTS) * repeat), prompt_len=8, resp_len=1)
    return DataProto.from_dict(tensors={k: b[k][:, :8] for k in ("input_ids", "attention_mask", "position_ids")})


@pytest.mark.parametrize("do_sample", [True, False])
def test_preallocated_cache_gives_the_same_rollout(tiny, monkeypatch, do_sample):
    tok, model = tiny
    calls = []
    real = hf._preallocate_cache

    def counting(cache, capacity):
        calls.append(real(cache, capacity))
        return calls[-1]

    outs = {}
    for variant in ("dynamic", "preallocated"):
        monkeypatch.setattr(
            hf, "_preallocate_cache", counting if variant == "preallocated" else (lambda cache, capacity: 0)
        )
        ro = hf.HFRollout(model, RolloutConfig(response_length=12, do_sample=do_sample, n=1))
        d = _prompts(tok)
        # eos = a frequent character, so that rows finish at different steps and are dropped
        d.meta_info = {
            "eos_token_id": [tok.eos_token_id, tok.convert_tokens_to_ids("1")],
            "pad_token_id": tok.pad_token_id,
            "seed": 7,
        }
        outs[variant] = ro.generate_sequences(d)
    assert calls and all(c == model.config.num_hidden_layers for c in calls)
    a, b = outs["dynamic"].batch, outs["preallocated"].batch
    lengths = a["response_mask"].sum(-1)
    assert lengths.min() < lengths.max()  # rows of different lengths: the drop path ran
    assert torch.equal(a["responses"], b["responses"]) and torch.equal(a["response_mask"], b["response_mask"])
    torch.testing.assert_close(a["rollout_log_probs"], b["rollout_log_probs"], atol=1e-6, rtol=0)


def test_buffer_grows_and_selects_rows(tiny):
    from transformers import DynamicCache

    cache = DynamicCache()
    k = torch.randn(3, 2, 4, 5)
    cache.update(k, k + 1, 0)
    assert hf._preallocate_cache(cache, capacity=5) == 1
    layer = cache.layers[0]
    new = torch.randn(3, 2, 3, 5)
    keys, values = layer.update(new, new + 1)  # 4 + 3 > 5: the buffer grows
    assert torch.equal(keys, torch.cat([k, new], dim=-2)) and torch.equal(values, torch.cat([k, new], dim=-2) + 1)
    assert cache.get_seq_length() == 7
    cache.batch_select_indices(torch.tensor([2, 0]))
    assert torch.equal(cache.layers[0].keys, torch.cat([k, new], dim=-2)[[2, 0]])
    step = torch.randn(2, 2, 1, 5)
    keys, _ = cache.layers[0].update(step, step)
    assert keys.shape == (2, 2, 8, 5) and torch.equal(keys[:, :, -1:], step)
