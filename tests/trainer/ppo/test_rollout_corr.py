"""Rollout/learner mismatch correction: upstream's entry points and metric names, IS weights (TIS,
IcePop strings, batch normalisation), rejection rules (single and comma-separated, k1 ratio
bounds), our extra rules, and composition with the policy losses. Numbers worked by hand."""

import math

import pytest
import torch
from conftest import end_spawned_rank
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.trainer.ppo import core_algos
from verl.trainer.ppo import rollout_corr_helper as rc


def _logs(ratios, base=-1.0):
    """(old_log_prob, rollout_log_prob) with pi_learner / pi_rollout = ratios."""
    ratios = torch.as_tensor(ratios, dtype=torch.float32)
    rollout = torch.full_like(ratios, base)
    return rollout + torch.log(ratios), rollout


def _mask(old, roll, mask, rule, threshold=None, lower=None):
    new_mask, _ = rc.compute_rollout_rejection_mask(
        old - roll, mask, rule, threshold, old, roll, rollout_rs_threshold_lower=lower
    )
    return new_mask.bool().tolist()


# ---------------------------------------------------------------------------------------------
# bug 1: *_k1 threshold t keeps ratios in [1/t, t]
# ---------------------------------------------------------------------------------------------


def test_token_k1_threshold_keeps_ratios_between_inverse_and_threshold():
    # t = 2: keep 0.5 <= ratio <= 2 (|log ratio| <= log 2 = 0.693), not |log ratio| <= 2 ([0.14, 7.4])
    old, roll = _logs([[0.45, 0.55, 1.9, 2.1, 7.0]])
    assert _mask(old, roll, torch.ones(1, 5), "token_k1", 2.0) == [[False, True, True, False, False]]
    # the same through the config-driven entry point
    _, new_mask, _ = rc.compute_rollout_correction(
        old, roll, torch.ones(1, 5), {"rollout_rs": "token_k1", "rollout_rs_threshold": 2.0}
    )
    assert new_mask.tolist() == [[0, 1, 1, 0, 0]]


def test_k1_lower_upper_string_bounds_k1():
    # "0.8_1.5": k1 = -log ratio in [log 0.8, log 1.5] -> ratio in [1/1.5, 1/0.8] = [0.667, 1.25]
    old, roll = _logs([[0.7, 1.2, 1.3, 0.6]])
    assert _mask(old, roll, torch.ones(1, 4), "token_k1", "0.8_1.5") == [[True, True, False, False]]
    # ours: rollout_rs_threshold_lower gives the lower bound of an entry without one
    assert _mask(old, roll, torch.ones(1, 4), "token_k1", 1.5, lower=0.8) == [[True, True, False, False]]


def test_seq_k1_rules_bound_the_sum_and_mean():
    # log ratios row 0 (0.3, 0.3), row 1 (0.3, -0.1); t = 1.5 (log 1.5 = 0.405)
    lr = torch.tensor([[0.3, 0.3], [0.3, -0.1]])
    roll = torch.full_like(lr, -1.0)
    # seq_sum_k1 = -(0.6), -(0.2): row 0 beyond -0.405 -> rejected
    assert _mask(roll + lr, roll, torch.ones(2, 2), "seq_sum_k1", 1.5) == [[False, False], [True, True]]
    # seq_mean_k1 = -0.3, -0.1: both kept
    assert _mask(roll + lr, roll, torch.ones(2, 2), "seq_mean_k1", 1.5) == [[True, True], [True, True]]


# ---------------------------------------------------------------------------------------------
# the other rules
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rule,threshold,expected",
    [
        # log ratios row 0 (0, +1, 0), row 1 (0, 0.1, -1.2); k2 = lr^2/2, k3 = e^lr - 1 - lr
        ("token_k2", 0.4, [[True, False, True], [True, True, False]]),  # k2 = 0.5 and 0.72 > 0.4
        ("token_k3", 0.6, [[True, False, True], [True, True, True]]),  # k3 = 0.718, 0.501
        ("seq_max_k3", 0.5, [[False] * 3, [False] * 3]),  # row maxima 0.718 and 0.501
        ("seq_mean_k2", 0.2, [[True] * 3, [False] * 3]),  # means 0.1667 and 0.2417
        ("seq_sum_k2", 0.6, [[True] * 3, [False] * 3]),  # sums 0.5 and 0.725
    ],
)
def test_k2_k3_rules(rule, threshold, expected):
    lr = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.1, -1.2]])
    roll = torch.full_like(lr, -1.0)
    assert _mask(roll + lr, roll, torch.ones(2, 3), rule, threshold) == expected


def test_multi_rule_all_must_pass_with_per_rule_thresholds_and_metrics():
    # "token_k1,seq_max_k2" with "2.0,0.1"; log ratios row 0 (0, 0.3), row 1 (0, 0.9)
    # token_k1 (|lr| <= log 2 = 0.693): drops row 1's second token
    # seq_max_k2 (max lr^2/2 <= 0.1): row 0 max 0.045 kept, row 1 max 0.405 dropped entirely
    lr = torch.tensor([[0.0, 0.3], [0.0, 0.9]])
    roll = torch.full_like(lr, -1.0)
    _, new_mask, m = rc.compute_rollout_correction_and_rejection_mask(
        roll + lr, roll, torch.ones(2, 2), rollout_rs="token_k1,seq_max_k2", rollout_rs_threshold="2.0,0.1"
    )
    assert new_mask.tolist() == [[1, 1], [0, 0]]
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.5)
    assert m["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(0.25)
    assert m["rollout_corr/rollout_rs_seq_max_k2_masked_fraction"] == pytest.approx(0.5)
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(0.5)
    assert m["rollout_corr/rs_masked_seq_frac"] == pytest.approx(0.5)  # ours: rows that lost every token
    assert m["rollout_corr/rollout_rs_seq_max_k2_max"] == pytest.approx(0.405, abs=1e-6)
    # one threshold is shared by all rules; a wrong count is named
    rc.compute_rollout_rejection_mask(lr, torch.ones(2, 2), "token_k2,seq_max_k2", 0.5)
    with pytest.raises(ValueError, match="exactly 2 thresholds"):
        rc.compute_rollout_rejection_mask(lr, torch.ones(2, 2), "token_k2,seq_max_k2", "0.5,0.5,0.5")


def test_rule_threshold_errors():
    lr = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="must be provided"):
        rc.compute_rollout_rejection_mask(lr, torch.ones(1, 2), "token_k2", None)
    with pytest.raises(ValueError, match="single upper bound"):
        rc.compute_rollout_rejection_mask(lr, torch.ones(1, 2), "token_k2", "0.1_0.5")
    with pytest.raises(ValueError, match="Invalid rollout_rs option: seq_max_k1"):
        rc.compute_rollout_rejection_mask(lr, torch.ones(1, 2), "seq_max_k1", 2.0)
    with pytest.raises(ValueError, match="requires both"):
        rc.compute_rollout_rejection_mask(lr, torch.ones(1, 2), "binary_kl", 0.5)


def test_our_extra_rules_icepop_kpop_ratio_bounds():
    old, roll = _logs([[0.4, 0.5, 1.0, 5.0, 6.0]])
    mask = torch.ones(1, 5)
    assert _mask(old, roll, mask, "icepop") == [[False, True, True, True, False]]  # defaults [0.5, 5]
    assert _mask(old, roll, mask, "icepop", "0.8_2.0") == [[False, False, True, False, False]]
    assert _mask(old, roll, mask, "icepop", 6.5) == [[False, True, True, True, True]]  # lower stays 0.5
    old, roll = _logs([[1.0, 3.0, 1.0], [1.5, 1.5, 1.5]])
    mask = torch.ones(2, 3)
    assert _mask(old, roll, mask, "token", 2.0) == [[True, False, True], [True] * 3]
    assert _mask(old, roll, mask, "sequence", 3.1) == [[True] * 3, [False] * 3]  # products 3.0, 3.375
    assert _mask(old, roll, mask, "geometric", 1.45) == [[True] * 3, [False] * 3]  # 3^(1/3) = 1.442, 1.5
    # KPop: p 0.5 vs 0.5 (KL 0), 0.9 vs 0.1 (1.757 both ways), 0.999 vs 0.01 (large)
    old = torch.log(torch.tensor([[0.5, 0.9, 0.999]]))
    roll = torch.log(torch.tensor([[0.5, 0.1, 0.01]]))
    assert _mask(old, roll, torch.ones(1, 3), "kpop") == [[True, True, False]]
    assert _mask(old, roll, torch.ones(1, 3), "kpop", 1.0) == [[True, False, False]]
    assert _mask(old, roll, torch.ones(1, 3), "binary_kl", 2.0) == [[True, True, False]]
    assert rc.kpop_mask(roll, old, torch.ones(1, 3)).tolist() == [[True, True, False]]


def test_binary_kl_values_and_edges():
    p, q = torch.tensor([0.3]), torch.tensor([0.6])
    expected = 0.3 * math.log(0.3 / 0.6) + 0.7 * math.log(0.7 / 0.4)
    assert rc.binary_kl(p.log(), q.log()).item() == pytest.approx(expected, rel=1e-5)
    assert rc.compute_binary_kl_divergence(p.log(), q.log()).item() == pytest.approx(expected, rel=1e-5)
    assert rc.binary_kl(torch.tensor([0.0]), torch.tensor([math.log(0.5)])).item() == pytest.approx(math.log(2.0))
    assert math.isinf(rc.binary_kl(torch.tensor([math.log(0.5)]), torch.tensor([0.0])).item())
    # upstream's version clamps p, q into [1e-6, 1 - 1e-6]: finite where ours is inf
    assert math.isfinite(rc.compute_binary_kl_divergence(torch.tensor([math.log(0.5)]), torch.tensor([0.0])).item())


# ---------------------------------------------------------------------------------------------
# IS weights and their metrics
# ---------------------------------------------------------------------------------------------


def test_token_tis_weights_and_metrics():
    # ratios (0.6, 1, 3), threshold 2: weights (0.6, 1, 2); mean 1.2; one token above 2
    # std: E[w^2] = (0.36 + 1 + 4)/3 = 1.786667, var = 1.786667 - 1.44 = 0.346667 -> 0.588784
    # ESS = 1 / E[(w / 1.2)^2] = 1.44 / 1.786667 = 0.805970
    old, roll = _logs([[0.6, 1.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    w, m = rc.compute_rollout_correction_weights(old - roll, mask, "token", 2.0)
    torch.testing.assert_close(w, torch.tensor([[0.6, 1.0, 2.0, 0.0]]))
    assert not w.requires_grad
    assert m["rollout_is_mean"] == pytest.approx(1.2)
    assert m["rollout_is_max"] == pytest.approx(2.0) and m["rollout_is_min"] == pytest.approx(0.6)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)
    assert m["rollout_is_ratio_fraction_low"] == 0.0
    assert m["rollout_is_std"] == pytest.approx(0.588784, abs=1e-5)
    assert m["rollout_is_eff_sample_size"] == pytest.approx(0.805970, abs=1e-5)
    assert m["rollout_is_seq_max_deviation"] == pytest.approx(0.2)
    # batch normalisation: divided by the mean 1.2
    w, m = rc.compute_rollout_correction_weights(old - roll, mask, "token", 2.0, rollout_is_batch_normalize=True)
    torch.testing.assert_close(w, torch.tensor([[0.5, 1.0 / 1.2, 2.0 / 1.2, 0.0]]))
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(1.2)


def test_sequence_weights_product_ratio_and_safety_bound():
    old, roll = _logs([[1.2, 1.5, 1.0], [0.5, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    w, m = rc.compute_rollout_correction_weights(old - roll, mask, "sequence", 2.0)
    torch.testing.assert_close(w, torch.tensor([[1.8, 1.8, 1.8], [0.25, 0.25, 0.0]]))
    # sequence level: fractions over sequences of the summed log ratio: 0 above 2, 1 of 2 below 0.5
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(0.5)
    # normalised over the two sequences' weights: mean (1.8 + 0.25) / 2 = 1.025
    w, m = rc.compute_rollout_correction_weights(old - roll, mask, "sequence", 2.0, rollout_is_batch_normalize=True)
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(1.025)
    w, _ = rc.compute_rollout_correction_weights(torch.tensor([[500.0, -500.0]]), torch.ones(1, 2), "token", 1e9)
    torch.testing.assert_close(w, torch.tensor([[math.exp(20.0), math.exp(-20.0)]]))


def test_icepop_threshold_string_zeroes_weights_and_keeps_the_mask():
    # weights (0.4, 0.8, 6.0) with "0.5_5.0": (0, 0.8, 0); std of (0, 0.8, 0) = 0.377124; ESS 1/3
    old = torch.zeros(1, 3)
    roll = -torch.log(torch.tensor([[0.4, 0.8, 6.0]]))
    proto, new_mask, m = rc.compute_rollout_correction_and_rejection_mask(
        old, roll, torch.ones(1, 3), rollout_is="token", rollout_is_threshold="0.5_5.0"
    )
    torch.testing.assert_close(proto.batch["rollout_is_weights"], torch.tensor([[0.0, 0.8, 0.0]]), atol=1e-6, rtol=0)
    assert torch.equal(new_mask, torch.ones(1, 3))
    assert m["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(2 / 3)
    assert m["rollout_corr/rollout_is_std"] == pytest.approx(0.377124, abs=1e-5)
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1 / 3, abs=1e-5)


def test_threshold_type_errors():
    with pytest.raises(TypeError):
        rc.compute_rollout_correction_weights(torch.zeros(1, 2), torch.ones(1, 2), "token", True)
    with pytest.raises(ValueError, match="Invalid rollout_is_threshold"):
        rc.compute_rollout_correction_weights(torch.zeros(1, 2), torch.ones(1, 2), "token", "a_b")
    with pytest.raises(ValueError, match="Invalid rollout_is: geometric"):
        rc.compute_rollout_correction_weights(torch.zeros(1, 2), torch.ones(1, 2), "geometric", 2.0)


# ---------------------------------------------------------------------------------------------
# off-policy metrics (upstream's names and definitions)
# ---------------------------------------------------------------------------------------------


def test_offpolicy_metric_numbers():
    # old (-1, -2), rollout (-1.5, -2): lr = (0.5, 0)
    old = torch.tensor([[-1.0, -2.0]])
    roll = torch.tensor([[-1.5, -2.0]])
    m = rc.compute_offpolicy_metrics(old, roll, torch.ones(1, 2))
    assert m["kl"] == pytest.approx(-0.25)  # mean(rollout - old)
    assert m["k3_kl"] == pytest.approx((math.exp(0.5) - 1.5) / 2)  # 0.074361
    assert m["training_ppl"] == pytest.approx(math.exp(1.5)) and m["training_log_ppl"] == pytest.approx(1.5)
    assert m["rollout_ppl"] == pytest.approx(math.exp(1.75)) and m["rollout_log_ppl"] == pytest.approx(1.75)
    assert m["log_ppl_diff"] == pytest.approx(-0.25) and m["log_ppl_abs_diff"] == pytest.approx(0.25)
    assert m["ppl_ratio"] == pytest.approx(math.exp(-0.25))
    assert m["chi2_token"] == pytest.approx((math.e + 1) / 2 - 1)  # 0.859141
    assert m["chi2_seq"] == pytest.approx(math.e - 1)  # exp(2 * 0.5) - 1
    # an all-masked (padding) row, anywhere in the batch, changes no per-row statistic
    padded = rc.compute_offpolicy_metrics(
        torch.cat([torch.full((1, 2), -9.0), old]),
        torch.cat([torch.zeros(1, 2), roll]),
        torch.tensor([[0, 0], [1, 1]], dtype=torch.bool),
    )
    assert padded == pytest.approx(m)
    with pytest.raises(AssertionError, match="at least one valid token"):
        rc.compute_offpolicy_metrics(old, roll, torch.zeros(1, 2))
    only = rc.compute_offpolicy_metrics(old, None, torch.ones(1, 2))
    assert set(only) == {"training_ppl", "training_log_ppl"}
    from_lp = rc.compute_rollout_corr_metrics_from_logprobs(old, roll, torch.ones(1, 2))
    assert from_lp["rollout_corr/kl"] == pytest.approx(-0.25) and all(k.startswith("rollout_corr/") for k in from_lp)


def test_entry_point_returns_dataproto_mask_and_prefixed_metrics():
    old, roll = _logs([[1.0, 3.0, 0.4, 1.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float32)
    proto, new_mask, m = rc.compute_rollout_correction_and_rejection_mask(
        old, roll, mask, rollout_is="token", rollout_is_threshold=2.0, rollout_rs="icepop"
    )
    assert isinstance(proto, DataProto)
    # weights are computed on the unrejected mask; the rejected token drops out through the mask
    torch.testing.assert_close(
        proto.batch["rollout_is_weights"], torch.tensor([[1.0, 2.0, 0.4, 1.0], [1.0, 1.0, 0.0, 0.0]])
    )
    assert new_mask.tolist() == [[1, 1, 0, 1], [1, 1, 0, 0]]
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 6)
    assert m["rollout_corr/log_ratio_abs_max"] == pytest.approx(math.log(3.0), rel=1e-5)  # ours
    for key in ("kl", "k3_kl", "training_ppl", "rollout_ppl", "chi2_token", "chi2_seq", "rollout_is_eff_sample_size"):
        assert f"rollout_corr/{key}" in m
    assert all(isinstance(v, float) for v in m.values())
    none, same, m = rc.compute_rollout_correction_and_rejection_mask(old, roll, mask)
    assert none is None and torch.equal(same, mask) and "rollout_corr/kl" in m
    with pytest.raises(ValueError, match="at least one valid token"):
        rc.compute_rollout_correction_and_rejection_mask(old, roll, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="does not match"):
        rc.compute_rollout_correction_and_rejection_mask(old, roll[:, :2], mask)


def test_add_to_batch_and_bypass_mode():
    old, roll = _logs([[1.0, 3.0], [1.0, 1.0]])
    batch = DataProto.from_dict(
        tensors={"old_log_probs": old, "rollout_log_probs": roll, "response_mask": torch.ones(2, 2)}
    )
    cfg = RolloutCorrectionConfig(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold=2.0)
    batch, m = rc.compute_rollout_correction_and_add_to_batch(batch, cfg)
    assert batch.batch["response_mask"].tolist() == [[1, 0], [1, 1]]
    torch.testing.assert_close(batch.batch["rollout_is_weights"], torch.tensor([[1.0, 2.0], [1.0, 1.0]]))
    assert "rollout_corr/rollout_rs_token_k1_mean" in m

    # bypass: rollout log-probs become the old ones; the actor's policy_loss is switched
    for policy_loss in ({"loss_mode": "vanilla"}, OmegaConf.create({"loss_mode": "vanilla"})):
        data = DataProto.from_dict(tensors={"rollout_log_probs": roll.clone(), "response_mask": torch.ones(2, 2)})
        rc.apply_bypass_mode(data, {"loss_type": "reinforce"}, policy_loss)
        assert torch.equal(data.batch["old_log_probs"], roll)
        assert (
            policy_loss["loss_mode"] == "bypass_mode" and policy_loss["rollout_correction"]["loss_type"] == "reinforce"
        )
    with pytest.raises(ValueError, match="requires rollout_log_probs"):
        rc.apply_bypass_mode(DataProto.from_dict(tensors={"response_mask": torch.ones(1, 1)}))


# ---------------------------------------------------------------------------------------------
# our entry point, validation, composition
# ---------------------------------------------------------------------------------------------


def test_entry_point_off_is_identity():
    old, roll = _logs([[1.0, 2.0]])
    mask = torch.ones(1, 2)
    # the dataclass default is upstream's rollout_is="sequence"; the yaml's null switches it off
    off = RolloutCorrectionConfig(rollout_is=None, rollout_rs=None)
    weights, new_mask, metrics = rc.compute_rollout_correction(old, roll, mask, off)
    assert weights is None and torch.equal(new_mask, mask)
    assert metrics["rollout_corr/kl"] == pytest.approx(-math.log(2.0) / 2)


def test_mismatch_metrics_keep_our_names_under_rollout_mismatch():
    old, roll = _logs([[1.0, 2.0]])
    m = rc.compute_mismatch_metrics(old, roll, torch.ones(1, 2))
    assert m["rollout_mismatch/kl_k1"] == pytest.approx(-math.log(2.0) / 2)
    assert m["rollout_mismatch/log_ratio_abs_max"] == pytest.approx(math.log(2.0))


def test_validation_names_key_and_allowed_values():
    with pytest.raises(ValueError, match="rollout_rs='bogus'"):
        rc.validate_rollout_correction_config({"rollout_rs": "bogus"})
    with pytest.raises(ValueError, match="rollout_rs_threshold"):
        rc.validate_rollout_correction_config({"rollout_rs": "token_k3"})
    with pytest.raises(ValueError, match="rollout_is="):
        rc.validate_rollout_correction_config({"rollout_is": "geometric"})
    with pytest.raises(ValueError, match="lower bound 3.0 > upper bound 2.0"):
        rc.validate_rollout_correction_config(
            {"rollout_rs": "token", "rollout_rs_threshold": 2.0, "rollout_rs_threshold_lower": 3.0}
        )
    with pytest.raises(ValueError, match="ratio-bound rules"):
        rc.validate_rollout_correction_config(
            {"rollout_rs": "token_k3", "rollout_rs_threshold": 2.0, "rollout_rs_threshold_lower": 0.1}
        )
    with pytest.raises(ValueError, match="loss_type"):
        rc.validate_rollout_correction_config({"loss_type": "ppo"})
    with pytest.raises(ValueError, match="rollout_is_threshold"):
        rc.validate_rollout_correction_config({"rollout_is_threshold": "x"})
    for mode in rc.ROLLOUT_RS_MODES:
        rc.validate_rollout_correction_config({"rollout_rs": mode, "rollout_rs_threshold": 1.5})
    rc.validate_rollout_correction_config(
        {
            "rollout_rs": "token_k1,seq_mean_k3",
            "rollout_rs_threshold": "0.5_2.0,0.1",
            "rollout_is": "sequence",
            "rollout_is_threshold": "0.5_4.0",
        }
    )


def test_fully_rejected_sequence_is_counted_and_loss_stays_finite():
    old, roll = _logs([[10.0, 10.0], [1.0, 1.0]])
    mask = torch.ones(2, 2)
    weights, new_mask, m = rc.compute_rollout_correction(
        old, roll, mask, {"rollout_rs": "icepop", "rollout_is": "sequence"}
    )
    assert new_mask.tolist() == [[0, 0], [1, 1]]
    assert m["rollout_corr/rs_masked_seq_frac"] == pytest.approx(0.5)
    logp = old.clone().requires_grad_(True)
    adv = torch.ones(2, 2)
    for name in ("vanilla", "gspo", "sapo", "cispo", "geo_mean", "dppo_tv", "dppo_kl", "dro"):
        loss, _ = core_algos.get_policy_loss_fn(name)(old, logp, adv, new_mask, "seq-mean-token-mean", {}, weights)
        (grad,) = torch.autograd.grad(loss, logp)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), name
        assert torch.equal(grad[0], torch.zeros(2)), name


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="share a shape"):
        rc.compute_rollout_correction(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2), {})


# ---------------------------------------------------------------------------------------------
# batch normalisation across data-parallel ranks
# ---------------------------------------------------------------------------------------------

# two ranks: rank 0 ratios (0.6, 1, 3) -> TIS weights (0.6, 1, 2); rank 1 one valid token of ratio 1.5
_RANK_RATIOS = [[[0.6, 1.0, 3.0]], [[1.5, 7.0, 1.0]]]
_RANK_MASKS = [[[1, 1, 1]], [[1, 0, 0]]]


def _batch_norm_worker(rank, init_file, out_file, empty_rank):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    old, roll = _logs(_RANK_RATIOS[rank])
    mask = torch.tensor(_RANK_MASKS[rank], dtype=torch.float32)
    if rank == empty_rank:
        mask = torch.zeros_like(mask)
    weights, _, m = rc.compute_rollout_correction(
        old, roll, mask, {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": True}
    )
    torch.save((weights, m.get("rollout_corr/rollout_is_batch_norm_factor")), f"{out_file}.{rank}")
    end_spawned_rank()


@pytest.mark.slow
@pytest.mark.timeout(300)  # a missing collective on the empty rank would hang
@pytest.mark.parametrize("empty_rank", [None, 1])
def test_batch_normalisation_uses_the_mean_over_all_ranks(tmp_path, empty_rank):
    import torch.multiprocessing as mp

    out = str(tmp_path / "w")
    mp.spawn(_batch_norm_worker, args=(str(tmp_path / "init"), out, empty_rank), nprocs=2, join=True)
    w0, f0 = torch.load(f"{out}.0")
    w1, f1 = torch.load(f"{out}.1")
    if empty_rank is None:
        # global mean over the 4 valid tokens: (0.6 + 1 + 2 + 1.5) / 4 = 1.275
        assert f0 == pytest.approx(1.275) and f1 == pytest.approx(1.275)
        torch.testing.assert_close(w1, torch.tensor([[1.5 / 1.275, 0.0, 0.0]]))
    else:
        # rank 1 has no valid token: it still takes part, rank 0's mean is its own 1.2
        assert f0 == pytest.approx(1.2) and f1 is None
        torch.testing.assert_close(w1, torch.zeros(1, 3))
    torch.testing.assert_close(w0, torch.tensor([[0.6, 1.0, 2.0]]) / f0)


# ---------------------------------------------------------------------------------------------
# layout: tensor functions in the algorithm layer, DataProto wrappers in rollout_corr_helper
# ---------------------------------------------------------------------------------------------


def test_dataproto_entry_point_wraps_the_tensor_entry_point():
    from verl.trainer.ppo.algos import rollout_correction, rollout_rejection

    # ratios 0.5, 1, 4 (one masked): TIS weights min(ratio, 2) on the valid tokens
    old, roll = _logs([[0.5, 1.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    kwargs = dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k1", rollout_rs_threshold=1.5)
    weights, new_mask, metrics = rollout_rejection.compute_rollout_correction_tensors(old, roll, mask, **kwargs)
    proto, proto_mask, proto_metrics = rc.compute_rollout_correction_and_rejection_mask(old, roll, mask, **kwargs)
    assert isinstance(proto, DataProto) and torch.equal(proto.batch["rollout_is_weights"], weights)
    torch.testing.assert_close(weights, torch.tensor([[0.5, 1.0, 0.0]]))
    # token_k1 with t = 1.5 keeps ratios in [2/3, 1.5]: the 0.5 token is rejected
    assert new_mask.tolist() == [[0.0, 1.0, 0.0]] and torch.equal(proto_mask, new_mask)
    assert proto_metrics == metrics and metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.5
    no_is, _, _ = rc.compute_rollout_correction_and_rejection_mask(old, roll, mask)
    assert no_is is None
    # the helper re-exports the algorithm-layer objects themselves
    assert rc.compute_rollout_correction_weights is rollout_correction.compute_rollout_correction_weights
    assert rc.compute_rollout_rejection_mask is rollout_rejection.compute_rollout_rejection_mask
    assert rc.compute_rollout_correction is rollout_rejection.compute_rollout_correction
