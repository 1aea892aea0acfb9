"""The attention implementation a model is built with: ours (grouped sdpa) where the architecture
supports sdpa, else what it does support (Gemma 2: eager), with one log line; and
`override_config.attn_implementation` honoured as given. The fallback model trains."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from test_workers_common import PROMPTS, RESPONSES, build_tiny_llama, build_tokenizer, make_batch, reference_log_probs

from verl.protocol import DataProto
from verl.utils.model import GROUPED_SDPA, build_causal_lm
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config import ActorConfig


@pytest.fixture(scope="module")
def tiny_gemma2(tmp_path_factory):
    """A random two-layer Gemma 2 (sliding window, logit soft-capping) over the test tokenizer."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    out = str(tmp_path_factory.mktemp("tiny_gemma2"))
    tok = build_tokenizer(out)
    config = Gemma2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        sliding_window=8,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    Gemma2ForCausalLM(config).save_pretrained(out)
    return out, tok


def test_gemma2_falls_back_to_eager_with_one_log_line(tiny_gemma2, caplog):
    path, _ = tiny_gemma2
    with caplog.at_level(logging.INFO, logger="verl.utils.model"):
        model = build_causal_lm(path)
    assert model.config._attn_implementation == "eager"
    lines = [r.getMessage() for r in caplog.records if "attention" in r.getMessage()]
    assert len(lines) == 1 and "Gemma2ForCausalLM" in lines[0] and "eager" in lines[0], lines


def test_override_attn_implementation_is_honoured(tiny_gemma2, tmp_path, caplog):
    path, _ = tiny_gemma2
    with caplog.at_level(logging.INFO, logger="verl.utils.model"):
        assert build_causal_lm(path, {"attn_implementation": "eager"}).config._attn_implementation == "eager"
    assert not [r for r in caplog.records if "attention" in r.getMessage()]
    llama = build_tiny_llama(str(tmp_path))
    assert build_causal_lm(llama).config._attn_implementation == GROUPED_SDPA
    assert build_causal_lm(llama, {"attn_implementation": "eager"}).config._attn_implementation == "eager"
    assert build_causal_lm(llama, {"attn_implementation": "sdpa"}).config._attn_implementation == "sdpa"


def test_gemma2_log_probs_and_one_training_step(tiny_gemma2):
    path, tok = tiny_gemma2
    model = build_causal_lm(path)
    batch = make_batch(tok, PROMPTS, RESPONSES, prompt_len=8, resp_len=6)
    batch["advantages"] = torch.randn(batch["responses"].shape, generator=torch.Generator().manual_seed(0))
    batch["advantages"] *= batch["response_mask"]
    cfg = ActorConfig(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=4, grad_clip=1e9)
    actor = DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=0.5))
    uid = np.array([f"p{i % 4}" for i in range(len(PROMPTS))], dtype=object)
    data = DataProto.from_dict(tensors=dict(batch), non_tensors={"uid": uid}, meta_info={"micro_batch_size": 4})
    log_probs, _ = actor.compute_log_prob(data)
    # the padding-free packed forward equals a plain padded one (sliding window, soft-capping)
    torch.testing.assert_close(log_probs, reference_log_probs(model, batch), atol=1e-5, rtol=0)
    data.batch["old_log_probs"] = log_probs
    before = [p.detach().clone() for p in model.parameters()]
    metrics = actor.update_policy(data)
    assert all(np.isfinite(v).all() for v in metrics.values() if isinstance(v, list) and v)
    assert metrics["actor/nonfinite_loss_skipped"] == [0.0]
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, model.parameters(), strict=True))
    # the update moved the policy: the log-probs changed
    assert not torch.allclose(actor.compute_log_prob(data)[0], log_probs)
