"""Policy losses, registries, KL estimators/controllers, value loss and the DAPO overlong penalty."""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.config.algorithm import KLControlConfig
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import (
    LOSS_AGG_MODES,
    POLICY_LOSS_REGISTRY,
    compute_batch_loss_stats,
    get_policy_loss_fn,
    kl_penalty,
    make_global_batch_info,
    register_adv_est,
    register_policy_loss,
    unpack_policy_loss_output,
)
from verl.workers.config.actor import ActorConfig

ALL_LOSSES = ["vanilla", "gspo", "sapo", "cispo", "gpg", "clip_cov", "kl_cov", "geo_mean", "reinforce", "pg"]


# ---------------------------------------------------------------------------------------------
# registries
# ---------------------------------------------------------------------------------------------


def test_every_documented_loss_is_registered():
    assert set(ALL_LOSSES) <= set(POLICY_LOSS_REGISTRY)
    assert get_policy_loss_fn("vanilla") is core_algos.compute_policy_loss_vanilla


def test_unknown_loss_lists_registered_names():
    with pytest.raises(ValueError, match="vanilla") as info:
        get_policy_loss_fn("nope")
    # upstream's first words, then our list of registered names
    assert str(info.value).startswith("Unsupported loss mode: nope.")


def test_registering_a_policy_loss_under_taken_name_overrides_with_a_warning(caplog):
    def other(*args, **kwargs):
        return None

    original = POLICY_LOSS_REGISTRY["vanilla"]
    try:
        with caplog.at_level("WARNING", logger="verl.trainer.ppo.core_algos"):
            register_policy_loss("vanilla")(other)
        assert get_policy_loss_fn("vanilla") is other
        warning = " ".join(r.getMessage() for r in caplog.records)
        assert "other" in warning and "compute_policy_loss_vanilla" in warning
    finally:
        POLICY_LOSS_REGISTRY["vanilla"] = original
    # the same function again is accepted silently (re-import of a user module)
    caplog.clear()
    assert (
        register_policy_loss("vanilla")(core_algos.compute_policy_loss_vanilla)
        is core_algos.compute_policy_loss_vanilla
    )
    assert not caplog.records


def test_registering_a_different_estimator_under_taken_name_raises():
    def other(*args, **kwargs):
        return None

    # upstream keeps estimators from being replaced by accident (unlike losses)
    with pytest.raises(ValueError, match="^Adv estimator grpo has already been registered"):
        register_adv_est("grpo")(other)
    assert core_algos.get_adv_estimator_fn("grpo") is core_algos.compute_grpo_outcome_advantage


def test_unknown_estimator_lists_registered_names():
    with pytest.raises(ValueError, match="grpo") as info:
        core_algos.get_adv_estimator_fn("nope")
    assert str(info.value).startswith("Unknown advantage estimator simply: nope.")
    assert (
        core_algos.get_adv_estimator_fn(core_algos.AdvantageEstimator.RLOO) is core_algos.compute_rloo_outcome_advantage
    )


def test_registry_is_looked_up_at_call_time():
    @register_adv_est("test_registry_lookup_tmp")
    def est(token_level_rewards, response_mask, **kwargs):
        return token_level_rewards, token_level_rewards

    try:
        assert core_algos.get_adv_estimator_fn("test_registry_lookup_tmp") is est
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY.pop("test_registry_lookup_tmp")


def test_unpack_policy_loss_output_accepts_both_forms():
    loss = torch.tensor(1.0)
    assert unpack_policy_loss_output((loss, {"a": 1.0})) == (loss, {"a": 1.0})
    legacy = (loss, torch.tensor(0.5), torch.tensor(0.1), torch.tensor(0.0))
    _, m = unpack_policy_loss_output(legacy)
    assert m == {"actor/pg_clipfrac": 0.5, "actor/ppo_kl": pytest.approx(0.1), "actor/pg_clipfrac_lower": 0.0}
    with pytest.raises(TypeError):
        unpack_policy_loss_output(loss)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _inputs(seed=0, batch=4, length=6, spread=0.3):
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(batch, length, generator=gen) * 0.2 - 1.5
    logp = (old + torch.randn(batch, length, generator=gen) * spread).requires_grad_(True)
    adv = torch.randn(batch, length, generator=gen)
    mask = torch.ones(batch, length)
    mask[0, 3:] = 0
    return old, logp, adv, mask


CFG = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}


# ---------------------------------------------------------------------------------------------
# vanilla PPO
# ---------------------------------------------------------------------------------------------


def test_vanilla_on_policy_is_minus_mean_advantage_and_no_clipping():
    old, _, adv, mask = _inputs()
    logp = old.clone().requires_grad_(True)
    loss, metrics = core_algos.compute_policy_loss_vanilla(old, logp, adv, mask, "token-mean", CFG)
    assert loss.item() == pytest.approx(-(adv * mask).sum().item() / mask.sum().item(), abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == 0.0 and metrics["actor/pg_clipfrac_lower"] == 0.0
    assert metrics["actor/ppo_kl"] == 0.0
    assert all(isinstance(v, float) for v in metrics.values())


def test_vanilla_asymmetric_clip_values():
    old = torch.zeros(1, 4)
    # ratios 1.5 (above 1.28), 0.5 (below 0.8), 1.1, 0.9
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.9]])).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, m = core_algos.compute_policy_loss_vanilla(old, logp, adv, mask, "token-mean", CFG)
    # token losses: A>0 ratio 1.5 -> -1.28 (clipped); A<0 ratio 0.5 -> max(0.5, 0.8) = 0.8 (clipped);
    # -1.1 ; 0.9 (unclipped)
    assert loss.item() == pytest.approx((-1.28 + 0.8 - 1.1 + 0.9) / 4, abs=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5)
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad[0, 0].item() == 0.0 and grad[0, 1].item() == 0.0  # clipped tokens carry no gradient
    assert grad[0, 2].item() == pytest.approx(-1.1 / 4, abs=1e-6)


def test_dual_clip_fires_only_for_negative_advantages():
    old = torch.zeros(1, 2)
    logp = torch.full((1, 2), math.log(10.0)).requires_grad_(True)  # ratio 10 > clip_ratio_c
    adv = torch.tensor([[-1.0, 1.0]])
    loss, m = core_algos.compute_policy_loss_vanilla(old, logp, adv, torch.ones(1, 2), "token-mean", CFG)
    # A<0: min(max(10, 1.28) * 1, 3) = 3 ; A>0: max(-10, -1.28) = -1.28
    assert loss.item() == pytest.approx((3.0 - 1.28) / 2, abs=1e-5)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(0.5)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.equal(grad, torch.zeros(1, 2))
    # same huge ratio with only positive advantages: the dual-clip branch never fires
    _, m_pos = core_algos.compute_policy_loss_vanilla(old, logp, torch.ones(1, 2), torch.ones(1, 2), "token-mean", CFG)
    assert m_pos["actor/pg_clipfrac_lower"] == 0.0


def test_vanilla_accepts_dataclass_dict_and_dictconfig():
    old, logp, adv, mask = _inputs(3)
    results = []
    for cfg in (ActorConfig(clip_ratio_high=0.28), dict(CFG), OmegaConf.create(CFG)):
        loss, metrics = core_algos.compute_policy_loss_vanilla(old, logp, adv, mask, "token-mean", cfg)
        results.append((loss.item(), metrics))
    assert results[0] == results[1] == results[2]


def test_bad_clip_ratio_c_raises():
    old, logp, adv, mask = _inputs()
    with pytest.raises(ValueError, match="clip_ratio_c"):
        core_algos.compute_policy_loss_vanilla(old, logp, adv, mask, "token-mean", {"clip_ratio_c": 1.0})


def test_rollout_is_weights_multiply_the_token_loss():
    old, logp, adv, mask = _inputs(4)
    base, _ = core_algos.compute_policy_loss_vanilla(old, logp, adv, mask, "token-mean", CFG)
    weights = torch.full_like(adv, 2.0)
    weighted, _ = core_algos.compute_policy_loss_vanilla(old, logp, adv, mask, "token-mean", CFG, weights)
    assert weighted.item() == pytest.approx(2 * base.item(), rel=1e-6)


def test_legacy_compute_policy_loss_returns_four_values():
    old, logp, adv, mask = _inputs(5)
    out = core_algos.compute_policy_loss(old, logp, adv, mask, cliprange=0.2, cliprange_high=0.28)
    assert len(out) == 4
    new, _ = core_algos.compute_policy_loss_vanilla(old, logp, adv, mask, "token-mean", CFG)
    assert out[0].item() == pytest.approx(new.item())


# ---------------------------------------------------------------------------------------------
# GSPO, SAPO, CISPO, REINFORCE, GPG
# ---------------------------------------------------------------------------------------------


def test_gspo_token_form_matches_sequence_form_gradient():
    old, logp, _, mask = _inputs(6, spread=0.05)
    seq_adv = torch.tensor([1.0, -0.5, 2.0, -1.0])
    adv = seq_adv.unsqueeze(-1).expand_as(old)
    loss, _ = core_algos.compute_policy_loss_gspo(old, logp, adv, mask, "seq-mean-token-mean", CFG)
    (g_token,) = torch.autograd.grad(loss, logp)

    # sequence form written directly: mean_i max(-A_i s_i, -A_i clip(s_i))
    lengths = mask.sum(-1)
    s = torch.exp(((logp - old) * mask).sum(-1) / lengths)
    seq_loss = torch.maximum(-seq_adv * s, -seq_adv * torch.clamp(s, 0.8, 1.28)).mean()
    (g_seq,) = torch.autograd.grad(seq_loss, logp)
    assert loss.item() == pytest.approx(seq_loss.item(), abs=1e-6)
    torch.testing.assert_close(g_token, g_seq, atol=1e-6, rtol=1e-5)
    assert g_token.abs().sum() > 0


def test_gspo_sequence_clipping():
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0]], requires_grad=True)  # s = e^0.5 and 1
    adv = torch.ones(2, 3)
    loss, m = core_algos.compute_policy_loss_gspo(old, logp, adv, torch.ones(2, 3), "seq-mean-token-mean", CFG)
    assert loss.item() == pytest.approx((-1.28 - 1.0) / 2, abs=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5)


@pytest.mark.parametrize("sign,tau", [(1.0, 1.0), (-1.0, 1.05)])
def test_sapo_value_and_unit_slope_at_ratio_one(sign, tau):
    old = torch.full((1, 3), -1.0)
    logp = old.clone().requires_grad_(True)
    adv = torch.full((1, 3), sign)
    cfg = {**CFG, "policy_loss": {"tau_pos": 1.0, "tau_neg": 1.05}}
    loss, m = core_algos.compute_policy_loss_sapo(old, logp, adv, torch.ones(1, 3), "token-mean", cfg)
    assert loss.item() == pytest.approx(-sign * 2.0 / tau, abs=1e-6)  # gate(1) = 2 / tau
    assert m["actor/sapo_gate_mean"] == pytest.approx(2.0 / tau, abs=1e-6)
    (grad,) = torch.autograd.grad(loss, logp)
    # d gate / d ratio = 1 at ratio 1, d ratio / d logp = 1 -> d loss / d logp = -A / N
    torch.testing.assert_close(grad, torch.full((1, 3), -sign / 3))


def test_sapo_gate_saturates_for_large_ratios():
    old = torch.zeros(1, 1)
    near = core_algos.compute_policy_loss_sapo(old, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))[0]
    far = core_algos.compute_policy_loss_sapo(old, torch.full((1, 1), 5.0), torch.ones(1, 1), torch.ones(1, 1))[0]
    assert far.item() == pytest.approx(-4.0, abs=1e-3)  # gate -> 4/tau as ratio -> inf
    assert near.item() == pytest.approx(-2.0)


def test_cispo_gradient_flows_only_through_log_prob():
    old = torch.zeros(1, 3, requires_grad=True)
    logp = torch.log(torch.tensor([[2.0, 1.0, 0.5]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, m = core_algos.compute_policy_loss_cispo(old, logp, adv, torch.ones(1, 3), "token-mean", CFG)
    g_logp, g_old = torch.autograd.grad(loss, [logp, old], allow_unused=True)
    assert g_old is None or torch.equal(g_old, torch.zeros_like(old))
    # weights clip(ratio, 0.8, 1.28) = (1.28, 1, 0.8), detached: grad = -w * A / N
    torch.testing.assert_close(g_logp, torch.tensor([[-1.28, -1.0, 0.8]]) / 3)
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 3)


def test_reinforce_and_pg_use_ratio():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[2.0, 0.5]])).requires_grad_(True)
    adv = torch.ones(1, 2)
    loss, _ = get_policy_loss_fn("reinforce")(old, logp, adv, torch.ones(1, 2), "token-mean", {})
    assert loss.item() == pytest.approx(-logp.sum().item() / 2)
    loss_r, _ = get_policy_loss_fn("pg")(
        old, logp, adv, torch.ones(1, 2), "token-mean", {"policy_loss": {"pg_use_ratio": True}}
    )
    (grad,) = torch.autograd.grad(loss_r, logp)
    torch.testing.assert_close(grad, torch.tensor([[-2.0, -0.5]]) / 2)


def test_gpg_is_minus_advantage_times_log_prob():
    old, logp, adv, mask = _inputs(8)
    loss, _ = core_algos.compute_policy_loss_gpg(old, logp, adv, mask, "token-mean", None)
    expected = (-(adv * logp) * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)


# ---------------------------------------------------------------------------------------------
# clip_cov, kl_cov, geo_mean
# ---------------------------------------------------------------------------------------------


def test_clip_cov_removes_gradient_of_selected_high_covariance_tokens():
    torch.manual_seed(0)
    logp = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[3.0, 3.0, -3.0, -3.0, 0.0, 0.0]])
    # cov = (A - 0)(logp - mean logp) = 0 everywhere unless log-probs differ: shift them
    logp2 = (logp + torch.tensor([[1.0, 1.0, -1.0, -1.0, 0.0, 0.0]])).detach().requires_grad_(True)
    old2 = logp2.detach().clone()  # ratio 1: nothing clipped by PPO
    cfg = {**CFG, "policy_loss": {"clip_cov_ratio": 0.34, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0}}
    loss, m = core_algos.compute_policy_loss_clip_cov(old2, logp2, adv, torch.ones(1, 6), "token-mean", cfg)
    (grad,) = torch.autograd.grad(loss, logp2)
    # candidates: cov = 3 on tokens 0..3; int(0.34 * 6) = 2 of them lose their gradient
    zeroed = (grad[0, :4] == 0).sum().item()
    assert zeroed == 2
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 6)
    assert grad[0, 4].item() == 0.0  # A = 0 anyway


def test_kl_cov_adds_penalty_on_top_covariance_tokens():
    old = torch.zeros(1, 4)
    logp = torch.tensor([[0.5, -0.5, 0.1, 0.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -2.0, 0.1, 0.0]])
    cfg = {"policy_loss": {"kl_cov_ratio": 0.25, "ppo_kl_coef": 1.0}}
    loss, m = core_algos.compute_policy_loss_kl_cov(old, logp, adv, torch.ones(1, 4), "token-mean", cfg)
    base = (-adv * torch.exp(logp)).sum() / 4
    # k = 1: covariance (A - mean A)(logp - mean logp) = (0.94, 1.06, 0.006, 0.0006): token 1 is
    # penalised with |lr| = 0.5
    assert loss.item() == pytest.approx(base.item() + 0.5 / 4, abs=1e-6)
    assert m["actor/ppo_kl_abs"] == pytest.approx((0.5 + 0.5 + 0.1) / 4)
    # as upstream, this loss reports the mean |log ratio| as actor/ppo_kl (signed mean would be -0.025)
    assert m["actor/ppo_kl"] == pytest.approx((0.5 + 0.5 + 0.1) / 4)


def test_geo_mean_hand_computed():
    old = torch.zeros(2, 2)
    logp = torch.tensor([[0.1, 0.5], [-0.1, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    cfg = {"clip_ratio": 0.2}
    loss, m = core_algos.compute_policy_loss_geo_mean(old, logp, adv, torch.ones(2, 2), "token-mean", cfg)
    # row 0 (A>0): lr clipped to min(lr, clip) -> (0.1, 0.2), ratio exp(0.15), loss -1*exp(0.15)
    # row 1 (A<0): sgn*min(-lr, -clip(lr)) -> (-0.1, 0.0), ratio exp(-0.05), loss 2*exp(-0.05)
    expected = (-math.exp(0.15) + 2 * math.exp(-0.05)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.25) and m["actor/pg_clipfrac_lower"] == 0.0


# ---------------------------------------------------------------------------------------------
# edge cases common to every loss
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_LOSSES)
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_every_loss_is_finite_with_empty_rows(name, mode):
    old, logp, adv, mask = _inputs(9)
    mask[1] = 0  # an empty response
    old = old.clone()
    old[1] = float("nan")  # garbage under the mask must not leak
    fn = get_policy_loss_fn(name)
    index = np.array(["a", "a", "b", "b"], dtype=object)
    info = make_global_batch_info(compute_batch_loss_stats(mask, index), index=index) if mode == "prompt-mean" else {}
    loss, metrics = fn(old, logp, adv, mask, mode, {**CFG, "global_batch_info": info})
    assert torch.isfinite(loss), (name, mode)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(grad).all(), (name, mode)
    assert torch.equal(grad[1], torch.zeros_like(grad[1]))
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"} <= set(metrics)
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("name", ALL_LOSSES)
def test_every_loss_is_finite_when_everything_is_masked(name):
    old, logp, adv, _ = _inputs(10)
    mask = torch.zeros_like(adv)
    loss, metrics = get_policy_loss_fn(name)(old, logp, adv, mask, "token-mean", dict(CFG))
    assert loss.item() == 0.0
    assert all(math.isfinite(v) for v in metrics.values())


# ---------------------------------------------------------------------------------------------
# KL
# ---------------------------------------------------------------------------------------------


def test_kl_estimator_values():
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    diff = logp - ref  # (0.5, -1.0)
    torch.testing.assert_close(kl_penalty(logp, ref, "kl"), diff)
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), diff)
    torch.testing.assert_close(kl_penalty(logp, ref, "abs"), diff.abs())
    torch.testing.assert_close(kl_penalty(logp, ref, "mse"), 0.5 * diff**2)
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.exp(-diff) - 1 + diff)
    torch.testing.assert_close(kl_penalty(logp, ref, "low_var_kl"), torch.exp(-diff) - 1 + diff)


def test_k3_non_negative_and_k1_can_be_negative():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(1000, generator=gen) * 3
    ref = torch.randn(1000, generator=gen) * 3
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    assert (kl_penalty(logp, ref, "k1") < 0).any()


def test_k3_clamps():
    out = kl_penalty(torch.tensor([0.0]), torch.tensor([50.0]), "k3")  # l = -50 -> clamped
    assert out.item() == 10.0
    assert torch.isfinite(kl_penalty(torch.tensor([50.0]), torch.tensor([0.0]), "k3")).all()


@pytest.mark.parametrize("base", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_plus_variants_have_estimator_value_and_k2_gradient(base):
    logp = torch.tensor([-1.0, -2.0, -0.3], requires_grad=True)
    ref = torch.tensor([-1.5, -1.0, -0.3])
    plus = kl_penalty(logp, ref, base + "+")
    torch.testing.assert_close(plus.detach(), kl_penalty(logp, ref, base).detach())
    (grad,) = torch.autograd.grad(plus.sum(), logp)
    torch.testing.assert_close(grad, (logp - ref).detach())  # d(l^2/2)/d logp = l


def test_full_kl_over_vocabulary():
    logits_p = torch.randn(2, 3, 5)
    logits_q = torch.randn(2, 3, 5)
    lp, lq = torch.log_softmax(logits_p, -1), torch.log_softmax(logits_q, -1)
    full = kl_penalty(lp, lq, "full")
    expected = torch.distributions.kl_divergence(
        torch.distributions.Categorical(logits=logits_p), torch.distributions.Categorical(logits=logits_q)
    )
    torch.testing.assert_close(full, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="full"):
        kl_penalty(torch.zeros(2, 3), torch.zeros(2, 3), "full")


def test_unknown_kl_raises():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")
    with pytest.raises(ValueError):
        kl_penalty(torch.zeros(1), torch.zeros(1), "full+")


def test_kl_controllers():
    fixed = core_algos.get_kl_controller(KLControlConfig(type="fixed", kl_coef=0.05))
    fixed.update(10.0, 100)
    assert fixed.value == 0.05
    adaptive = core_algos.get_kl_controller({"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.2, "horizon": 100})
    adaptive.update(current_kl=0.3, n_steps=10)  # error = clip(0.5, -0.2, 0.2) = 0.2 -> * 1.02
    assert adaptive.value == pytest.approx(0.1 * 1.02)
    adaptive.update(current_kl=0.19, n_steps=10)  # error = -0.05 -> * 0.995
    assert adaptive.value == pytest.approx(0.1 * 1.02 * 0.995)
    assert isinstance(core_algos.AdaptiveKLController(0.1, 0.1, 10), core_algos.AdaptiveKLController)
    with pytest.raises(ValueError, match="adaptive"):
        core_algos.get_kl_controller({"type": "pid"})


def test_compute_rewards_k1_in_reward():
    out = core_algos.compute_rewards(
        torch.tensor([0.0, 1.0]), torch.tensor([-1.0, -1.0]), torch.tensor([-2.0, -1.0]), 0.5
    )
    torch.testing.assert_close(out, torch.tensor([-0.5, 1.0]))


# ---------------------------------------------------------------------------------------------
# value loss, entropy loss, overlong penalty
# ---------------------------------------------------------------------------------------------


def test_value_loss_clipping_and_clipfrac():
    vpreds = torch.tensor([[1.0, 3.0, 0.0]], requires_grad=True)
    values = torch.tensor([[0.0, 0.0, 0.0]])
    returns = torch.tensor([[0.0, 3.0, 1.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, clipfrac = core_algos.compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.5)
    # token 0: max((1-0)^2, (0.5-0)^2) = 1 ; token 1: max(0, (0.5-3)^2) = 6.25 -> 0.5 * mean = 1.8125
    assert loss.item() == pytest.approx(0.5 * (1.0 + 6.25) / 2)
    assert clipfrac.item() == pytest.approx(0.5)
    assert not clipfrac.requires_grad
    (grad,) = torch.autograd.grad(loss, vpreds)
    assert grad[0, 1].item() == 0.0  # the clipped term is active: no gradient
    unclipped, _ = core_algos.compute_value_loss(vpreds, returns, values, mask, cliprange_value=None)
    assert unclipped.item() == pytest.approx(0.5 * (1.0 + 0.0) / 2)


def test_entropy_loss_uniform():
    logits = torch.zeros(2, 3, 4)
    mask = torch.ones(2, 3)
    assert core_algos.compute_entropy_loss(logits, mask).item() == pytest.approx(math.log(4))


def test_overlong_penalty_numbers():
    f = core_algos.compute_overlong_penalty
    assert f(10, max_response_length=20, overlong_buffer_len=4) == 0.0
    assert f(16, 20, 4) == 0.0
    assert f(18, 20, 4) == pytest.approx(-0.5)
    assert f(20, 20, 4, penalty_factor=2.0) == pytest.approx(-2.0)
    assert f(25, 20, 4) == -1.0
    out = f(torch.tensor([10, 17, 20, 30]), 20, 4, penalty_factor=1.0)
    torch.testing.assert_close(out, torch.tensor([0.0, -0.25, -1.0, -1.0]))
    with pytest.raises(ValueError, match="overlong_buffer_len"):
        f(3, 20, 0)
