"""DataParallelPPOActor on one process: log-probs equal a plain transformers forward, gradient
accumulation is exact for every aggregation mode and micro-batch split, the first update has
ratio 1, KL/entropy terms, non-finite guards."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from conftest import end_spawned_rank, load_tiny_llama
from test_workers_common import PROMPTS, RESPONSES, make_batch, reference_log_probs

from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config import ActorConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_tiny_llama(str(tmp_path_factory.mktemp("tiny_actor")))


def _data(tok, advantages_seed=0, n_groups=4):
    batch = make_batch(tok, PROMPTS, RESPONSES, prompt_len=8, resp_len=6)
    g = torch.Generator().manual_seed(advantages_seed)
    batch["advantages"] = torch.randn(batch["responses"].shape, generator=g) * batch["response_mask"]
    uid = np.array([f"p{i % n_groups}" for i in range(len(PROMPTS))], dtype=object)
    return batch, uid


def _actor(model, lr=1.0, optimizer="sgd", **cfg):
    model = copy.deepcopy(model)
    base = dict(
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=8,
        use_dynamic_bsz=False,
        loss_scale_factor=6.0,
        grad_clip=1e9,
        clip_ratio=0.2,
    )
    base.update(cfg)
    config = ActorConfig(**base)
    opt = (
        torch.optim.SGD(model.parameters(), lr=lr)
        if optimizer == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=lr)
    )
    return DataParallelPPOActor(config, model, opt), model


def _proto(batch, uid, **meta):
    return DataProto.from_dict(tensors=dict(batch), non_tensors={"uid": uid}, meta_info=meta)


@pytest.mark.parametrize("use_remove_padding", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_compute_log_prob_matches_plain_forward(tiny, use_remove_padding, temperature):
    _, tok, model = tiny
    batch, uid = _data(tok)
    actor, _ = _actor(model)
    actor.engine.use_remove_padding = use_remove_padding
    data = _proto(batch, uid, micro_batch_size=3, temperature=temperature)
    lp, ent = actor.compute_log_prob(data, calculate_entropy=True)
    ref = reference_log_probs(model, batch, temperature)
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=0)
    assert ent.shape == lp.shape and torch.all(ent[batch["response_mask"] == 0] == 0)
    assert torch.all(ent[batch["response_mask"] == 1] > 0)
    if use_remove_padding:
        # compacting removes most padding: 8 rows of 2..12 valid tokens in a 14-wide layout
        assert actor.infer(data).padding["padding_waste"] < 0.25


def test_logits_are_projected_only_from_the_first_response_predictor(tiny):
    _, tok, model = tiny
    batch, uid = _data(tok)
    actor, m = _actor(model)
    assert actor.engine.logits_to_keep  # transformers' Llama takes logits_to_keep
    seen = []
    handle = m.lm_head.register_forward_hook(lambda _mod, inp, _out: seen.append(inp[0].shape[1]))
    try:
        lp, _ = actor.compute_log_prob(_proto(batch, uid, micro_batch_size=8))
    finally:
        handle.remove()
    widest = int(batch["attention_mask"].sum(-1).max())
    assert seen and seen[0] < widest  # the prompt-only positions were not projected
    actor.engine.logits_to_keep = False
    full, _ = actor.compute_log_prob(_proto(batch, uid, micro_batch_size=8))
    torch.testing.assert_close(lp, full, atol=1e-5, rtol=0)


def test_dynamic_batch_log_prob_matches_and_restores_order(tiny):
    _, tok, model = tiny
    batch, uid = _data(tok)
    actor, _ = _actor(model)
    data = _proto(batch, uid, use_dynamic_bsz=True, max_token_len=20)
    out = actor.infer(data)
    torch.testing.assert_close(out.outputs["log_probs"], reference_log_probs(model, batch), atol=1e-5, rtol=0)
    assert out.padding["num_micro_batches"] >= 3


def _reference_step(model, batch, uid, mode, lr=1.0, entropy_coeff=0.0, kl_coef=0.0, ref_lp=None):
    """Parameters after one SGD step on the full-batch loss computed with a plain padded forward."""
    model = copy.deepcopy(model)
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits
    resp_logits = logits[:, -batch["responses"].shape[1] - 1 : -1]
    lp = torch.log_softmax(resp_logits, -1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    mask = batch["response_mask"]
    group_tokens = core_algos.compute_group_num_tokens(mask, uid) if mode == "prompt-mean" else None
    cfg = ActorConfig(loss_scale_factor=6.0, loss_agg_mode=mode)
    if mode == "prompt-mean":  # the full batch: D_g of each row, number of groups from the rows
        cfg.global_batch_info["group_num_tokens"] = group_tokens
    pg_loss, _ = core_algos.compute_policy_loss_vanilla(
        batch["old_log_probs"], lp, batch["advantages"], mask, mode, cfg
    )
    loss = pg_loss
    if entropy_coeff:
        ent = torch.distributions.Categorical(logits=resp_logits).entropy()
        loss = loss - entropy_coeff * core_algos.agg_loss(ent, mask, mode, loss_scale_factor=6.0)
    if kl_coef:
        kl = core_algos.kl_penalty(lp, ref_lp, "low_var_kl")
        loss = loss + kl_coef * core_algos.agg_loss(kl, mask, mode, loss_scale_factor=6.0)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return model


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "prompt-mean"]
)
def test_micro_batch_splits_give_the_same_update(tiny, mode):
    _, tok, model = tiny
    batch, uid = _data(tok)
    batch["old_log_probs"] = (
        reference_log_probs(model, batch) - 0.05 * batch["response_mask"]
    )  # ratio != 1: clip active
    expected = _reference_step(model, batch, uid, mode)
    for split in (
        {"ppo_micro_batch_size_per_gpu": 1},
        {"ppo_micro_batch_size_per_gpu": 4},
        {"ppo_micro_batch_size_per_gpu": 8},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 24},
    ):
        actor, updated = _actor(model, loss_agg_mode=mode, **split)
        metrics = actor.update_policy(_proto(batch, uid, temperature=1.0))
        assert metrics["actor/nonfinite_loss_skipped"] == [0.0]
        for (name, p), q in zip(updated.named_parameters(), expected.parameters(), strict=False):
            # the SGD step moves parameters by up to ~0.6: 5e-6 is fp32 rounding, a wrong share is >1e-2
            torch.testing.assert_close(p, q, atol=5e-6, rtol=0, msg=f"{mode} {split}: parameter {name} differs")


def test_first_update_has_ratio_one_and_no_clipping(tiny):
    _, tok, model = tiny
    batch, uid = _data(tok)
    actor, _ = _actor(model, optimizer="adamw", lr=1e-3, ppo_micro_batch_size_per_gpu=4)
    old, _ = actor.compute_log_prob(_proto(batch, uid, micro_batch_size=4, temperature=1.0))
    batch["old_log_probs"] = old
    metrics = actor.update_policy(_proto(batch, uid, temperature=1.0))
    assert metrics["actor/ppo_kl"] == [0.0]
    assert metrics["actor/pg_clipfrac"] == [0.0]
    assert metrics["actor/pg_clipfrac_lower"] == [0.0]
    assert metrics["actor/grad_norm"][0] > 0 and math.isfinite(metrics["actor/grad_norm"][0])
    assert metrics["actor/lr"] == [1e-3]


def test_use_current_as_old_log_prob_equals_recomputed_old(tiny):
    _, tok, model = tiny
    batch, uid = _data(tok)
    a1, m1 = _actor(model, ppo_micro_batch_size_per_gpu=4)
    old, _ = a1.compute_log_prob(_proto(batch, uid, micro_batch_size=4))
    b1 = dict(batch, old_log_probs=old)
    metrics1 = a1.update_policy(_proto(b1, uid))
    a2, m2 = _actor(model, ppo_micro_batch_size_per_gpu=4)
    out2 = a2.update(_proto(batch, uid, use_current_as_old_log_prob=True))
    metrics2 = out2.metrics
    assert metrics2["actor/ppo_kl"] == [0.0] and metrics2["actor/pg_clipfrac"] == [0.0]
    torch.testing.assert_close(out2.old_log_probs, old, atol=1e-6, rtol=0)
    for p, q in zip(m1.parameters(), m2.parameters(), strict=False):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)
    assert metrics1["actor/pg_loss"][0] == pytest.approx(metrics2["actor/pg_loss"][0], abs=1e-6)


@pytest.mark.parametrize("mode", ["token-mean", "prompt-mean"])
def test_use_current_with_rollout_is_weights_equals_recomputed_old(tiny, mode):
    _, tok, model = tiny
    batch, uid = _data(tok)
    g = torch.Generator().manual_seed(1)
    rollout_lp = (
        reference_log_probs(model, batch)
        - 0.3 * torch.rand(batch["responses"].shape, generator=g) * batch["response_mask"]
    )
    batch["rollout_log_probs"] = rollout_lp
    rc = {"rollout_is": "token", "rollout_is_threshold": 1.1, "rollout_rs": None}  # some weights truncated
    a1, m1 = _actor(model, loss_agg_mode=mode, ppo_micro_batch_size_per_gpu=4)
    old, _ = a1.compute_log_prob(_proto(batch, uid, micro_batch_size=8))
    metrics1 = a1.update_policy(_proto(dict(batch, old_log_probs=old), uid, rollout_correction=rc))
    a2, m2 = _actor(model, loss_agg_mode=mode, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=24)
    metrics2 = a2.update_policy(_proto(batch, uid, rollout_correction=rc, use_current_as_old_log_prob=True))
    for p, q in zip(m1.parameters(), m2.parameters(), strict=False):
        torch.testing.assert_close(p, q, atol=5e-6, rtol=0)
    for name in ("rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_ratio_fraction_high"):
        assert metrics2[name][0] == pytest.approx(metrics1[name][0], rel=1e-5)
    assert 0 < metrics1["rollout_corr/rollout_is_ratio_fraction_high"][0] < 1
    # the shortcut replaces compute_log_prob, so it reports the mismatch under that pass's names
    assert metrics2["rollout_mismatch/kl_k1"][0] == pytest.approx(metrics1["rollout_corr/kl"][0], rel=1e-5)
    assert not any(k.startswith("rollout_mismatch/") for k in metrics1)


def test_use_current_rejects_several_mini_batches(tiny):
    _, tok, model = tiny
    batch, uid = _data(tok)
    actor, _ = _actor(model, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4)
    with pytest.raises(ValueError, match="one mini-batch and one epoch"):
        actor.update_policy(_proto(batch, uid, use_current_as_old_log_prob=True))


def test_entropy_and_kl_terms_match_reference(tiny):
    _, tok, model = tiny
    batch, uid = _data(tok)
    batch["old_log_probs"] = reference_log_probs(model, batch)
    batch["ref_log_prob"] = (
        batch["old_log_probs"] + 0.1 * torch.randn(batch["responses"].shape) * batch["response_mask"]
    )
    expected = _reference_step(
        model, batch, uid, "token-mean", entropy_coeff=0.01, kl_coef=0.5, ref_lp=batch["ref_log_prob"]
    )
    actor, updated = _actor(
        model, ppo_micro_batch_size_per_gpu=3, entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.5
    )
    metrics = actor.update_policy(_proto(batch, uid))
    assert metrics["actor/kl_loss"][0] > 0 and metrics["actor/entropy"][0] > 0
    for p, q in zip(updated.parameters(), expected.parameters(), strict=False):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)


def test_mini_batches_and_epochs_give_one_step_each(tiny):
    _, tok, model = tiny
    batch, uid = _data(tok)
    batch["old_log_probs"] = reference_log_probs(model, batch)
    actor, _ = _actor(
        model, optimizer="adamw", lr=1e-2, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, ppo_epochs=2
    )
    metrics = actor.update_policy(_proto(batch, uid))
    assert len(metrics["actor/grad_norm"]) == 4 and len(metrics["actor/pg_loss"]) == 4
    # after the first step the policy moved: later steps see ratio != 1
    assert abs(metrics["actor/ppo_kl"][0]) < 1e-6 and max(abs(x) for x in metrics["actor/ppo_kl"][1:]) > 1e-4


def test_non_finite_loss_is_skipped_and_counted(tiny):
    _, tok, model = tiny
    batch, uid = _data(tok)
    batch["old_log_probs"] = reference_log_probs(model, batch)
    batch["advantages"][0, 0] = float("nan")
    actor, updated = _actor(model, ppo_micro_batch_size_per_gpu=1)
    metrics = actor.update_policy(_proto(batch, uid))
    assert metrics["actor/nonfinite_loss_skipped"] == [1.0]
    assert all(torch.isfinite(p).all() for p in updated.parameters())
    assert math.isfinite(metrics["actor/grad_norm"][0])


def test_non_finite_grad_norm_skips_the_step(tiny):
    _, tok, model = tiny
    batch, uid = _data(tok)
    batch["old_log_probs"] = reference_log_probs(model, batch)
    actor, updated = _actor(model)
    before = [p.detach().clone() for p in updated.parameters()]
    handle = updated.lm_head.weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    try:
        metrics = actor.update_policy(_proto(batch, uid))
    finally:
        handle.remove()
    assert metrics["actor/nonfinite_grad_skipped_steps"] == [1.0]
    assert all(torch.equal(a, b) for a, b in zip(before, updated.parameters(), strict=False))


def test_rollout_correction_from_meta_info(tiny):
    _, tok, model = tiny
    batch, uid = _data(tok)
    batch["old_log_probs"] = reference_log_probs(model, batch)
    batch["rollout_log_probs"] = (
        batch["old_log_probs"] - 0.3 * batch["response_mask"]
    )  # rollout less likely: IS weight e^0.3
    rc = {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": None}
    actor, updated = _actor(model)
    metrics = actor.update_policy(_proto(batch, uid, rollout_correction=rc))
    assert metrics["rollout_corr/rollout_is_mean"] == [pytest.approx(math.exp(0.3), rel=1e-4)]  # once per call
    # kl = mean(rollout - old) = -0.3
    assert metrics["rollout_corr/kl"] == [pytest.approx(-0.3, abs=1e-5)]
    # same as passing the weights explicitly
    actor2, updated2 = _actor(model)
    batch2 = dict(
        batch, rollout_is_weights=torch.full(batch["responses"].shape, math.exp(0.3)) * batch["response_mask"]
    )
    actor2.update_policy(_proto(batch2, uid))
    for p, q in zip(updated.parameters(), updated2.parameters(), strict=False):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)


def test_grad_clip_scales_the_update(tiny):
    _, tok, model = tiny
    batch, uid = _data(tok)
    batch["old_log_probs"] = reference_log_probs(model, batch) - 0.05 * batch["response_mask"]
    unclipped = _reference_step(model, batch, uid, "token-mean", lr=1.0)
    actor, updated = _actor(model, grad_clip=0.01)
    metrics = actor.update_policy(_proto(batch, uid))
    norm = metrics["actor/grad_norm"][0]
    assert norm > 0.01  # clipping is active
    for p0, p1, q in zip(model.parameters(), updated.parameters(), unclipped.parameters(), strict=False):
        # SGD with lr 1: the applied step is the reference step scaled by 0.01 / norm
        torch.testing.assert_close(p0 - p1, (p0 - q) * (0.01 / norm), atol=1e-7, rtol=1e-4)


def _meter_worker(rank, init_file, out_file):
    import torch.distributed as dist

    from verl.workers.actor.dp_actor import StepMeter

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    meter = StepMeter()
    meter.new_step()
    meter.add_sum("loss", 1.0 + rank)
    if rank == 1:  # a metric only this rank reports (sorts before "loss": misaligned columns)
        meter.add_weighted("a_extra", 4.0, 2.0)
    meter.add_weighted("w", float(rank), 1.0)
    out = meter.reduce(None, 2)
    if rank == 0:
        torch.save(out, out_file)
    end_spawned_rank()


@pytest.mark.slow
def test_step_meter_agrees_on_metric_names_across_ranks(tmp_path):
    import torch.multiprocessing as mp

    out_file = str(tmp_path / "out.pt")
    mp.spawn(_meter_worker, args=(str(tmp_path / "init"), out_file), nprocs=2, join=True)
    out = torch.load(out_file)
    assert out == {"loss": [3.0], "a_extra": [4.0], "w": [0.5]}


def test_bypass_mode_ppo_clip_equals_vanilla_on_rollout_log_probs(tiny):
    # bypass: old_log_probs are the rollout's; with loss_type=ppo_clip and no rejection the update
    # is vanilla PPO against them (IS weights only reported, not applied)
    _, tok, model = tiny
    batch, uid = _data(tok)
    rollout_lp = reference_log_probs(model, batch) - 0.2 * batch["response_mask"]
    batch.update(rollout_log_probs=rollout_lp, old_log_probs=rollout_lp)
    rc = {"bypass_mode": True, "loss_type": "ppo_clip", "rollout_is": "token", "rollout_is_threshold": 2.0}
    a1, m1 = _actor(model, ppo_micro_batch_size_per_gpu=3)
    metrics = a1.update_policy(_proto(batch, uid, rollout_correction=rc))
    a2, m2 = _actor(model)
    a2.update_policy(_proto(batch, uid))
    for p, q in zip(m1.parameters(), m2.parameters(), strict=False):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)
    # the current policy is e^0.2 more likely than the rollout on every token
    assert metrics["rollout_corr/rollout_is_mean"][0] == pytest.approx(math.exp(0.2), rel=1e-4)
    # reinforce: runs and differs from ppo_clip
    a3, m3 = _actor(model)
    a3.update_policy(_proto(batch, uid, rollout_correction=dict(rc, loss_type="reinforce")))
    assert any(not torch.allclose(p, q) for p, q in zip(m1.parameters(), m3.parameters(), strict=False))
    with pytest.raises(ValueError, match="bypass_mode"):
        _actor(model)[0].update_policy(_proto(batch, uid, rollout_correction=rc, use_current_as_old_log_prob=True))


def test_rollout_rejection_applies_before_the_loss_denominators(tiny):
    # rejecting tokens with token_k1 (ratios outside [1/1.5, 1.5]) must equal training on the
    # pre-rejected mask, for any micro-batch split
    _, tok, model = tiny
    batch, uid = _data(tok)
    old = reference_log_probs(model, batch)
    g = torch.Generator().manual_seed(3)
    shift = torch.where(torch.rand(batch["responses"].shape, generator=g) < 0.3, 0.8, 0.1)
    batch.update(old_log_probs=old, rollout_log_probs=old - shift * batch["response_mask"])
    rc = {"rollout_rs": "token_k1", "rollout_rs_threshold": 1.5}
    a1, m1 = _actor(model, ppo_micro_batch_size_per_gpu=3)
    metrics = a1.update_policy(_proto(batch, uid, rollout_correction=rc))
    kept = batch["response_mask"] * (shift < 0.5)
    a2, m2 = _actor(model)
    a2.update_policy(_proto(dict(batch, response_mask=kept), uid))
    for p, q in zip(m1.parameters(), m2.parameters(), strict=False):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)
    share = float((batch["response_mask"] * (shift >= 0.5)).sum() / batch["response_mask"].sum())
    assert metrics["rollout_corr/rollout_rs_masked_fraction"][0] == pytest.approx(share)
