"""Chunked training micro-batches on CPU (`DataParallelEngine.train(row_separable=True)`, used by
the actor for the vanilla policy loss): forward + loss + backward per chunk of whole prompt groups
must give the update of the whole micro-batch (parameters within float rounding) and exactly its
metrics (computed once on the whole micro-batch), for every loss aggregation, the on-policy
shortcut and a non-finite micro-batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import load_tiny_llama
from test_prefix_grouper import _actor as _prefix_grouper_actor
from test_prefix_grouper import _grouped_batch
from test_workers_common import reference_log_probs

from verl.protocol import DataProto
from verl.workers.engine.dp_engine import CPU_CHUNK_TOKENS, DataParallelEngine


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_tiny_llama(str(tmp_path_factory.mktemp("tiny_chunks")))


def _batch(tok, seed=0):
    """4 prompts x 4 responses of 1..6 tokens, the groups scattered over the batch."""
    return _grouped_batch(tok, seed=seed, interleave=False)


def _actor(model, chunk_tokens, **cfg):
    actor, model = _prefix_grouper_actor(model, True, **cfg)
    actor.engine.chunk_tokens = chunk_tokens
    return actor, model


def _count_chunked(monkeypatch):
    calls = []
    original = DataParallelEngine._chunked_micro_step

    def spy(self, micro, chunks, *args):
        # each chunk as the prompts of its rows (the micro-batch's row order is the planner's)
        prompt_width = micro["input_ids"].shape[1] - micro["responses"].shape[1]
        prompts = [tuple(row) for row in micro["input_ids"][:, :prompt_width].tolist()]
        calls.append([[prompts[r] for r in c.tolist()] for c in chunks])
        return original(self, micro, chunks, *args)

    monkeypatch.setattr(DataParallelEngine, "_chunked_micro_step", spy)
    return calls


def _update(actor, model, batch, uid, **meta):
    out = actor.update(DataProto.from_dict(tensors=dict(batch), non_tensors={"uid": uid}, meta_info=meta))
    return out, {n: p.detach().clone() for n, p in model.named_parameters()}


def _assert_same_update(plain, chunked):
    (out_a, params_a), (out_b, params_b) = plain, chunked
    assert out_a.metrics.keys() == out_b.metrics.keys()
    for k in out_a.metrics:
        if k != "actor/padding_waste":
            np.testing.assert_allclose(out_b.metrics[k], out_a.metrics[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for n in params_a:
        torch.testing.assert_close(params_b[n], params_a[n], atol=2e-6, rtol=0, msg=n)
    # the padding figures are those of the forwards run: each chunk is cut to its own longest
    # prompt and response, so it computes no more than the whole micro-batch
    assert out_b.padding["valid_tokens"] <= out_a.padding["valid_tokens"]
    assert out_b.padding["token_slots"] <= out_a.padding["token_slots"]


def test_budget_default_and_small_batches_not_chunked(tiny, monkeypatch):
    _, tok, model = tiny
    calls = _count_chunked(monkeypatch)
    batch, uid = _batch(tok)
    batch["old_log_probs"] = reference_log_probs(model, batch)
    actor, _ = _actor(model, CPU_CHUNK_TOKENS)
    assert actor.engine.chunk_tokens == 4096
    _update(actor, actor.actor_module, batch, uid, temperature=1.0)
    assert calls == []  # 4 prompts + 16 short responses: far below the budget


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "prompt-mean", "seq-mean-token-sum-norm"])
def test_chunked_update_equals_the_whole_micro_batch(tiny, monkeypatch, mode):
    _, tok, model = tiny
    batch, uid = _batch(tok, seed=1)
    batch["old_log_probs"] = reference_log_probs(model, batch) - 0.05 * batch["response_mask"]
    plain = _update(*_actor(model, None, loss_agg_mode=mode), batch, uid, temperature=1.0)
    calls = _count_chunked(monkeypatch)
    chunked = _update(*_actor(model, 20, loss_agg_mode=mode), batch, uid, temperature=1.0)
    # one micro-batch of 16 rows, split into chunks of whole prompt groups (4 rows each)
    assert len(calls) == 1 and len(calls[0]) > 1
    assert sum(len(chunk) for chunk in calls[0]) == 16
    prompts_of_chunk = [set(chunk) for chunk in calls[0]]
    assert sum(len(p) for p in prompts_of_chunk) == 4  # no prompt in two chunks
    assert all(len(chunk) == 4 * len(set(chunk)) for chunk in calls[0])
    moved = max(float((plain[1][n] - p.detach()).abs().max()) for n, p in model.named_parameters())
    assert moved > 1e-3  # the step does something
    _assert_same_update(plain, chunked)


def test_on_policy_shortcut_with_entropy_and_kl(tiny, monkeypatch):
    _, tok, model = tiny
    batch, uid = _batch(tok, seed=2)
    ref = reference_log_probs(model, batch)
    batch["ref_log_prob"] = ref + 0.02 * batch["response_mask"]
    batch["rollout_log_probs"] = ref - 0.01 * batch["response_mask"]
    cfg = dict(entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1, ppo_micro_batch_size_per_gpu=8)
    meta = dict(temperature=0.7, use_current_as_old_log_prob=True)
    plain = _update(*_actor(model, None, **cfg), batch, uid, **meta)
    calls = _count_chunked(monkeypatch)
    chunked = _update(*_actor(model, 10, **cfg), batch, uid, **meta)
    assert len(calls) == 2  # both micro-batches of 8 rows
    _assert_same_update(plain, chunked)
    assert {"actor/entropy", "actor/kl_loss", "rollout_mismatch/log_ratio_abs_max"} <= plain[0].metrics.keys()
    torch.testing.assert_close(chunked[0].old_log_probs, plain[0].old_log_probs, atol=2e-6, rtol=0)
    torch.testing.assert_close(chunked[0].entropys, plain[0].entropys, atol=2e-6, rtol=0)


def test_non_finite_micro_batch_is_dropped_whole(tiny, monkeypatch):
    _, tok, model = tiny
    batch, uid = _batch(tok, seed=3)
    batch["old_log_probs"] = reference_log_probs(model, batch)
    batch["advantages"][13, 0] = float("nan")  # row 13 is in the second micro-batch of 8 rows
    cfg = dict(ppo_micro_batch_size_per_gpu=8)
    plain = _update(*_actor(model, None, **cfg), batch, uid, temperature=1.0)
    calls = _count_chunked(monkeypatch)
    chunked = _update(*_actor(model, 10, **cfg), batch, uid, temperature=1.0)
    assert len(calls) == 2
    # row 13 (group 1) is in the first chunk of its micro-batch: the later chunk is not run and
    # the gradients of the first micro-batch alone make the step, as without chunks
    assert plain[0].metrics["actor/nonfinite_loss_skipped"] == [1.0]
    _assert_same_update(plain, chunked)


def test_several_data_parallel_ranks_are_not_chunked(tiny):
    # with FSDP every forward and backward is a collective: ranks with different numbers of
    # chunks would not meet
    _, tok, model = tiny
    batch, uid = _batch(tok, seed=4)
    batch["old_log_probs"] = reference_log_probs(model, batch)
    actor, m = _actor(model, 10)
    micro = DataProto.from_dict(tensors=dict(batch)).batch
    assert actor.engine._train_chunks(micro) is not None
    actor.engine.dp_size = 2
    assert actor.engine._train_chunks(micro) is None


def test_losses_selecting_by_batch_statistics_are_not_chunked(tiny, monkeypatch):
    _, tok, model = tiny
    batch, uid = _batch(tok, seed=4)
    batch["old_log_probs"] = reference_log_probs(model, batch) - 0.05 * batch["response_mask"]
    calls = _count_chunked(monkeypatch)
    actor, m = _actor(model, 10, policy_loss={"loss_mode": "clip_cov"})
    _update(actor, m, batch, uid, temperature=1.0)
    assert calls == []
