"""Rollout/learner mismatch correction: TIS weights, IcePop, KPop, ratio and k1/k2/k3 rejection,
metrics, and composition with the policy losses."""

import math

import pytest
import torch

from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.trainer.ppo import core_algos
from verl.trainer.ppo import rollout_corr_helper as rc


def _logs(ratios, base=-1.0):
    """(old_log_prob, rollout_log_prob) with pi_learner / pi_rollout = ratios."""
    ratios = torch.as_tensor(ratios, dtype=torch.float32)
    rollout = torch.full_like(ratios, base)
    return rollout + torch.log(ratios), rollout


def test_token_tis_weights_truncate_and_detach():
    old, roll = _logs([[0.5, 1.0, 3.0, 100.0]])
    old.requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0]])
    weights, truncated = rc.compute_rollout_is_weights(old - roll, mask, "token", threshold=2.0)
    torch.testing.assert_close(weights, torch.tensor([[0.5, 1.0, 2.0, 0.0]]))
    assert truncated.tolist() == [[False, False, True, False]]
    assert not weights.requires_grad


def test_sequence_tis_weight_is_product_ratio():
    old, roll = _logs([[1.2, 1.5, 1.0], [0.5, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    weights, _ = rc.compute_rollout_is_weights(old - roll, mask, "sequence", threshold=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.8, 1.8, 1.8], [0.25, 0.25, 0.0]]))


def test_log_ratio_clamped_before_exp():
    weights, _ = rc.compute_rollout_is_weights(torch.tensor([[500.0, -500.0]]), torch.ones(1, 2), "token", 1e9)
    torch.testing.assert_close(weights, torch.tensor([[math.exp(10.0), math.exp(-10.0)]]))


def test_icepop_defaults_and_bounds():
    old, roll = _logs([[0.4, 0.5, 1.0, 5.0, 6.0]])
    mask = torch.ones(1, 5)
    keep = rc.compute_rollout_rejection_mask(old, roll, mask, "icepop")
    assert keep.tolist() == [[False, True, True, True, False]]
    keep2 = rc.compute_rollout_rejection_mask(old, roll, mask, "icepop", upper=2.0, lower=0.8)
    assert keep2.tolist() == [[False, False, True, False, False]]


def test_binary_kl_values_and_edges():
    p, q = torch.tensor([0.3]), torch.tensor([0.6])
    expected = 0.3 * math.log(0.3 / 0.6) + 0.7 * math.log(0.7 / 0.4)
    assert rc.binary_kl(p.log(), q.log()).item() == pytest.approx(expected, rel=1e-5)
    assert rc.binary_kl(torch.tensor([0.0]), torch.tensor([math.log(0.5)])).item() == pytest.approx(math.log(2.0))
    assert rc.binary_kl(torch.tensor([-0.3]), torch.tensor([-0.3])).item() == pytest.approx(0.0, abs=1e-7)
    assert math.isinf(rc.binary_kl(torch.tensor([math.log(0.5)]), torch.tensor([0.0])).item())


def test_kpop_masks_large_binary_kl_both_directions():
    # token 0: identical; token 1: p 0.9 vs 0.1 (KL ~1.76 both ways); token 2: 0.999 vs 0.01 (large)
    old = torch.log(torch.tensor([[0.5, 0.9, 0.999]]))
    roll = torch.log(torch.tensor([[0.5, 0.1, 0.01]]))
    keep = rc.compute_rollout_rejection_mask(old, roll, torch.ones(1, 3), "kpop")
    assert keep.tolist() == [[True, True, False]]
    # swapping learner and rollout gives the same decision (max of both directions)
    keep_swapped = rc.kpop_mask(roll, old, torch.ones(1, 3))
    assert keep_swapped.tolist() == keep.tolist()
    keep_tight = rc.compute_rollout_rejection_mask(old, roll, torch.ones(1, 3), "kpop", upper=1.0)
    assert keep_tight.tolist() == [[True, False, False]]


def test_ratio_token_sequence_geometric_rejection():
    old, roll = _logs([[1.0, 3.0, 1.0], [1.5, 1.5, 1.5]])
    mask = torch.ones(2, 3)
    token = rc.compute_rollout_rejection_mask(old, roll, mask, "token", upper=2.0)
    assert token.tolist() == [[True, False, True], [True, True, True]]
    seq = rc.compute_rollout_rejection_mask(old, roll, mask, "sequence", upper=3.0)  # products 3.0, 3.375
    assert seq.tolist() == [[True] * 3, [False] * 3]
    geo = rc.compute_rollout_rejection_mask(old, roll, mask, "geometric", upper=1.45)  # 3^(1/3)=1.44, 1.5
    assert geo.tolist() == [[True] * 3, [False] * 3]


@pytest.mark.parametrize(
    "mode,threshold,expected",
    [
        ("token_k1", 0.5, [[True, False, True], [True, True, False]]),
        ("token_k2", 0.4, [[True, False, True], [True, True, False]]),
        ("seq_max_k3", 0.5, [[False] * 3, [False] * 3]),
        ("seq_mean_k2", 0.2, [[True] * 3, [False] * 3]),
        ("seq_sum_k1", 1.0, [[True] * 3, [False] * 3]),  # sums -1.0 (>= -1) and 1.1
    ],
)
def test_k_estimator_rejection(mode, threshold, expected):
    # log ratios: row 0 (0, +1, 0), row 1 (0, 0.1, -1.2)
    lr = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.1, -1.2]])
    roll = torch.full_like(lr, -1.0)
    keep = rc.compute_rollout_rejection_mask(roll + lr, roll, torch.ones(2, 3), mode, upper=threshold)
    assert keep.tolist() == expected


def test_k_estimates():
    lr = torch.tensor([0.5, -0.5])
    torch.testing.assert_close(rc.token_kl_estimate(lr, "k1"), -lr)
    torch.testing.assert_close(rc.token_kl_estimate(lr, "k2"), 0.5 * lr**2)
    torch.testing.assert_close(rc.token_kl_estimate(lr, "k3"), torch.exp(lr) - 1 - lr)
    assert (rc.token_kl_estimate(torch.randn(100) * 3, "k3") >= 0).all()


def test_validation_names_key_and_allowed_values():
    with pytest.raises(ValueError, match="rollout_rs='bogus'"):
        rc.validate_rollout_correction_config({"rollout_rs": "bogus"})
    with pytest.raises(ValueError, match="rollout_rs_threshold"):
        rc.validate_rollout_correction_config({"rollout_rs": "token_k3"})
    with pytest.raises(ValueError, match="rollout_is="):
        rc.validate_rollout_correction_config({"rollout_is": "geometric"})
    with pytest.raises(ValueError, match="threshold_lower"):
        rc.validate_rollout_correction_config({"rollout_rs": "token", "rollout_rs_threshold": 2.0, "rollout_rs_threshold_lower": 3.0})
    for mode in rc.ROLLOUT_RS_MODES:
        cfg = {"rollout_rs": mode, "rollout_rs_threshold": 1.0}
        rc.validate_rollout_correction_config(cfg)


def test_entry_point_off_is_identity():
    old, roll = _logs([[1.0, 2.0]])
    mask = torch.ones(1, 2)
    weights, new_mask, metrics = rc.compute_rollout_correction(old, roll, mask, RolloutCorrectionConfig())
    assert weights is None and torch.equal(new_mask, mask)
    assert metrics["rollout_corr/kl_k1"] == pytest.approx(-math.log(2.0) / 2)


def test_entry_point_combines_weights_mask_and_metrics():
    old, roll = _logs([[1.0, 3.0, 0.4, 1.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float32)
    cfg = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="icepop")
    weights, new_mask, m = rc.compute_rollout_correction(old, roll, mask, cfg)
    assert new_mask.dtype == mask.dtype
    assert new_mask.tolist() == [[1, 1, 0, 1], [1, 1, 0, 0]]
    torch.testing.assert_close(weights, torch.tensor([[1.0, 2.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]]))
    assert m["rollout_corr/rs_masked_token_frac"] == pytest.approx(1 / 6)
    assert m["rollout_corr/rs_masked_seq_frac"] == 0.0
    assert m["rollout_corr/is_truncated_frac"] == pytest.approx(1 / 5)
    lr = torch.log(torch.tensor([1.0, 3.0, 0.4, 1.0, 1.0, 1.0]))
    assert m["rollout_corr/kl_k1"] == pytest.approx((-lr).mean().item(), rel=1e-5)
    assert m["rollout_corr/kl_k3"] == pytest.approx((lr.exp() - 1 - lr).mean().item(), rel=1e-5)
    # perplexity ratio per sequence = exp(mean(rollout) - mean(old)) = exp(-mean log ratio)
    expected_ppl = (math.exp(-lr[:4].mean().item()) + 1.0) / 2
    assert m["rollout_corr/ppl_ratio"] == pytest.approx(expected_ppl, rel=1e-5)
    assert all(isinstance(v, float) for v in m.values())


def test_fully_rejected_sequence_is_counted_and_loss_stays_finite():
    old, roll = _logs([[10.0, 10.0], [1.0, 1.0]])
    mask = torch.ones(2, 2)
    weights, new_mask, m = rc.compute_rollout_correction(old, roll, mask, {"rollout_rs": "icepop", "rollout_is": "sequence"})
    assert new_mask.tolist() == [[0, 0], [1, 1]]
    assert m["rollout_corr/rs_masked_seq_frac"] == pytest.approx(0.5)
    logp = old.clone().requires_grad_(True)
    adv = torch.ones(2, 2)
    for name in ("vanilla", "gspo", "sapo", "cispo", "geo_mean"):
        loss, _ = core_algos.get_policy_loss_fn(name)(old, logp, adv, new_mask, "seq-mean-token-mean", {}, weights)
        (grad,) = torch.autograd.grad(loss, logp)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), name
        assert torch.equal(grad[0], torch.zeros(2)), name


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="share a shape"):
        rc.compute_rollout_correction(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2), {})
