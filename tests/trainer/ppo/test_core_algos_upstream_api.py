"""core_algos surface that upstream code calls: losses and estimators added for issue 10, the
SAPO / geo_mean regressions, compute_value_loss keywords, upstream-style writes into
`config.global_batch_info`, and PF-PPO resampling. Numbers are worked out by hand in comments."""

import inspect
import math

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
from verl.workers.config.actor import ActorConfig

LOG = math.log


def _uids(*names):
    return np.array(names, dtype=object)


# ---------------------------------------------------------------------------------------------
# bug 2: sapo always aggregates seq-mean-token-mean
# ---------------------------------------------------------------------------------------------


def test_sapo_always_aggregates_seq_mean_token_mean():
    # ratio 1 everywhere: gate = 2/tau; row 0 has A = +1 on 2 tokens (tau_pos 1 -> loss -2 each),
    # row 1 has A = -1 on 1 token (tau_neg 1.05 -> loss +2/1.05 = 1.904762)
    # seq-mean-token-mean = ((-2 - 2)/2 + 1.904762) / 2 = -0.047619; token-mean would be -0.698413
    old = torch.zeros(2, 2)
    logp = torch.zeros(2, 2, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        loss, metrics = get_policy_loss_fn("sapo")(old, logp, adv, mask, mode, {})
        assert loss.item() == pytest.approx(-0.047619, abs=1e-6), mode
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert (
        inspect.signature(core_algos.compute_policy_loss_sapo).parameters["loss_agg_mode"].default
        == "seq-mean-token-mean"
    )


# ---------------------------------------------------------------------------------------------
# bug 3: geo_mean weights by the geometric mean of the token IS weights
# ---------------------------------------------------------------------------------------------


def test_geo_mean_uses_geometric_mean_of_rollout_is_weights():
    # ratio 1, A = 1: the sequence loss is -1 times the sequence weight; weights (1, 4):
    # geometric mean sqrt(1*4) = 2 (upstream), arithmetic mean 2.5 (the old bug)
    old = torch.zeros(1, 2)
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = get_policy_loss_fn("geo_mean")(
        old, logp, torch.ones(1, 2), torch.ones(1, 2), "token-mean", {}, rollout_is_weights=torch.tensor([[1.0, 4.0]])
    )
    assert loss.item() == pytest.approx(-2.0, abs=1e-6)
    # a masked position does not enter the mean: weights (9 masked, 4) -> 4
    loss, _ = get_policy_loss_fn("geo_mean")(
        old,
        logp,
        torch.ones(1, 2),
        torch.tensor([[0, 1]]),
        "token-mean",
        {},
        rollout_is_weights=torch.tensor([[9.0, 4.0]]),
    )
    assert loss.item() == pytest.approx(-4.0, abs=1e-5)


# ---------------------------------------------------------------------------------------------
# new policy losses
# ---------------------------------------------------------------------------------------------


def test_dppo_tv_trust_region_by_probability_change():
    # p_old = 0.5 on 3 tokens, p = (0.8, 0.6, 0.35), A = (1, 1, -1), thresholds 0.2:
    # delta p = (0.3, 0.1, -0.15): token 0 (A > 0, 0.3 > 0.2) is dropped, tokens 1 and 2 kept.
    # ratio = (1.6, 1.2, 0.7) (below clip_ratio_c 3: no truncation)
    # loss/token = -A * ratio * log p: token 1: -1.2 log 0.6 = 0.612991; token 2: 0.7 log 0.35 = -0.734875
    # token-mean over 3 tokens: (0.612991 - 0.734875) / 3 = -0.040628; d loss / d log p = (0, -1.2, 0.7) / 3
    old = torch.full((1, 3), LOG(0.5))
    logp = torch.tensor([[LOG(0.8), LOG(0.6), LOG(0.35)]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    cfg = {"clip_ratio": 0.2, "clip_ratio_c": 3.0}
    loss, m = get_policy_loss_fn("dppo_tv")(old, logp, adv, torch.ones(1, 3), "token-mean", cfg)
    assert loss.item() == pytest.approx(-0.040628, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.4, 0.7 / 3]]), atol=1e-6, rtol=0)
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 3)
    assert m["actor/pg_clipfrac_lower"] == 0.0
    # with clip_ratio_c = 1.5 the kept token 1's ratio 1.2 stays, nothing truncated; with 1.1 it is
    _, m = get_policy_loss_fn("dppo_tv")(
        old, logp.detach(), adv, torch.ones(1, 3), "token-mean", {"clip_ratio": 0.2, "clip_ratio_c": 1.1}
    )
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(1 / 3)


def test_dppo_kl_uses_the_bernoulli_kl_of_the_token_probability():
    # p_old = 0.5; A = 1 everywhere; threshold 0.2
    # p = 0.8: KL_b = 0.5 log(0.5/0.8) + 0.5 log(0.5/0.2) = 0.223144 > 0.2 and p > p_old -> dropped
    # p = 0.6: KL_b = 0.5 log(0.5/0.6) + 0.5 log(0.5/0.4) = 0.020411 -> kept
    # p = 0.1: p < p_old -> kept for A > 0 whatever the KL
    old = torch.full((1, 3), LOG(0.5))
    logp = torch.tensor([[LOG(0.8), LOG(0.6), LOG(0.1)]], requires_grad=True)
    loss, m = get_policy_loss_fn("dppo_kl")(
        old, logp, torch.ones(1, 3), torch.ones(1, 3), "token-sum", {"clip_ratio": 0.2}
    )
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 3)
    # token-sum: -(1.2 log 0.6 + 0.2 log 0.1) = 0.612991 + 0.460517
    assert loss.item() == pytest.approx(1.2 * -LOG(0.6) + 0.2 * -LOG(0.1), abs=1e-5)


def test_dro_quadratic_penalty():
    # A = 2, log p = log 0.5, old = log 0.25, beta 0.1: log ratio = log 2 = 0.693147
    # loss = -(2 * -0.693147 - 0.05 * 0.480453) = 1.410317; d/dlogp = -(2 - 0.1 * 0.693147) = -1.930685
    logp = torch.tensor([[LOG(0.5)]], requires_grad=True)
    loss, m = get_policy_loss_fn("dro")(
        torch.tensor([[LOG(0.25)]]),
        logp,
        torch.tensor([[2.0]]),
        torch.ones(1, 1),
        "token-mean",
        {"policy_loss": {"dro_beta": 0.1}},
    )
    assert loss.item() == pytest.approx(1.410317, abs=1e-6)
    loss.backward()
    assert logp.grad.item() == pytest.approx(-1.930685, abs=1e-6)
    assert m["actor/ppo_kl"] == pytest.approx(-LOG(2))
    with pytest.raises(ValueError, match="dro_beta"):
        get_policy_loss_fn("dro")(
            torch.zeros(1, 1), logp, torch.ones(1, 1), torch.ones(1, 1), "token-mean", {"dro_beta": 0.0}
        )


def test_up_loss_is_unclipped_for_positive_advantages():
    # ratio 2 (log 2) on both tokens; A = (+1, -1), clip 0.2:
    # A > 0: value -A * 1 = -1, gradient -A (no clip although ratio > 1.2)
    # A < 0: vanilla clip: max(2, 1.2) = 2 -> dual clip min(2, 3) = 2, clipped gradient (ratio branch: -A*ratio) = 2
    old = torch.zeros(1, 2)
    logp = torch.full((1, 2), LOG(2.0), requires_grad=True)
    loss, _ = get_policy_loss_fn("up")(old, logp, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), "token-sum", {})
    assert loss.item() == pytest.approx(-1.0 + 2.0, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, 2.0]]), atol=1e-6, rtol=0)


def test_reinforce_direct_function_has_upstream_signature_and_numbers():
    params = list(inspect.signature(core_algos.compute_policy_loss_reinforce).parameters)
    assert params[:2] == ["rollout_log_prob", "log_prob"]
    assert (
        inspect.signature(core_algos.compute_policy_loss_reinforce).parameters["loss_agg_mode"].default
        == "seq-mean-token-sum"
    )
    # one row, A = 1, log p = (-1, -2), w = (1, 0.5): seq-mean-token-sum = -(-1*1 + -2*0.5) = 2
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, m = core_algos.compute_policy_loss_reinforce(
        torch.tensor([[-1.5, -2.0]]),
        logp,
        torch.ones(1, 2),
        torch.ones(1, 2),
        config={},
        rollout_is_weights=torch.tensor([[1.0, 0.5]]),
    )
    assert loss.item() == pytest.approx(2.0)
    assert m["actor/ppo_kl"] == pytest.approx((-0.5 + 0.0) / 2)
    # the registered `reinforce` / `pg` losses keep the actor's keyword convention
    assert get_policy_loss_fn("reinforce") is core_algos.compute_policy_loss_pg


def test_bypass_mode_dispatches_on_loss_type():
    # old_log_prob is the rollout log-prob; current log p = rollout + (0, log 3) -> ratios (1, 3)
    rollout = torch.full((1, 2), -1.0)
    logp = (rollout + torch.tensor([[0.0, LOG(3.0)]])).requires_grad_(True)
    adv = torch.ones(1, 2)
    mask = torch.ones(1, 2)
    rc = {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": None, "loss_type": "ppo_clip"}
    cfg = {"clip_ratio": 0.2, "policy_loss": {"rollout_correction": rc}}
    # ppo_clip: vanilla on ratio (1, 3) with no IS weights: losses (-1, -1.2) -> token-mean -1.1
    loss, m = get_policy_loss_fn("bypass_mode")(rollout, logp, adv, mask, "token-mean", cfg)
    assert loss.item() == pytest.approx(-1.1, abs=1e-6)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx((1 + 2) / 2)  # truncated at 2, metrics only
    # reinforce: -A * log p * w, w = (1, 2) -> seq-mean-token-sum = -(-1*1 + (-1 + log 3)*2) = 0.802775
    rc["loss_type"] = "reinforce"
    loss, _ = get_policy_loss_fn("bypass_mode")(rollout, logp, adv, mask, "seq-mean-token-sum", cfg)
    assert loss.item() == pytest.approx(-(-1.0 + (-1.0 + LOG(3.0)) * 2.0), abs=1e-6)
    # rejection drops the ratio-3 token: token_k1 threshold 2 keeps ratios in [0.5, 2]
    rc.update(loss_type="ppo_clip", rollout_rs="token_k1", rollout_rs_threshold=2.0)
    loss, m = get_policy_loss_fn("bypass_mode")(rollout, logp, adv, mask, "token-mean", cfg)
    assert loss.item() == pytest.approx(-1.0, abs=1e-6)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.5)
    # batch normalisation (within the call): weights (1, 2) / 1.5 -> reinforce
    # -(-1 * 2/3 + (-1 + log 3) * 4/3) = 0.535184
    rc.update(loss_type="reinforce", rollout_rs=None, rollout_is_batch_normalize=True)
    loss, m = get_policy_loss_fn("bypass_mode")(rollout, logp, adv, mask, "seq-mean-token-sum", cfg)
    assert loss.item() == pytest.approx(-(-1.0 * 2 / 3 + (-1.0 + LOG(3.0)) * 4 / 3), abs=1e-6)
    assert m["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.5)
    rc["loss_type"] = "nope"
    with pytest.raises(ValueError, match="Invalid loss_type: nope"):
        get_policy_loss_fn("bypass_mode")(rollout, logp, adv, mask, "token-mean", cfg)
    with pytest.raises(ValueError, match="rollout_correction"):
        get_policy_loss_fn("bypass_mode")(rollout, logp, adv, mask, "token-mean", {"policy_loss": {}})


# ---------------------------------------------------------------------------------------------
# compute_value_loss keywords
# ---------------------------------------------------------------------------------------------


def test_compute_value_loss_accepts_upstream_global_keywords():
    # (V - R)^2 = (1, 4); no clipping effect (V_old = V); token-mean with 4 global tokens and
    # dp_size 2: 0.5 * (1 + 4) / 4 * 2 = 1.25
    vpreds = torch.tensor([[1.0, 2.0]])
    loss, clipfrac = core_algos.compute_value_loss(
        vpreds, torch.zeros(1, 2), vpreds.clone(), torch.ones(1, 2), 0.5, "token-mean", dp_size=2, batch_num_tokens=4
    )
    assert loss.item() == pytest.approx(1.25)
    assert clipfrac.item() == 0.0
    loss, _ = core_algos.compute_value_loss(
        vpreds,
        torch.zeros(1, 2),
        vpreds.clone(),
        torch.ones(1, 2),
        0.5,
        "seq-mean-token-sum-norm",
        global_batch_size=2,
        loss_scale_factor=5,
    )
    assert loss.item() == pytest.approx(0.5 * 5 / 2 / 5)


def test_value_loss_shares_summed_as_metric_give_the_mini_batch_loss():
    # (V - R)^2 per token = (1, 4 | 9, 0 padded): 3 global tokens, token-mean over the mini-batch
    # = 0.5 * (1 + 4 + 9) / 3; each micro-batch returns its share, a SUM Metric adds the shares
    from verl.utils.metric import AggregationType, Metric, reduce_metrics
    from verl.utils.py_functional import append_to_dict

    vpreds = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    collected: dict = {}
    for row in (0, 1):
        loss, _ = core_algos.compute_value_loss(
            vpreds[row : row + 1],
            torch.zeros(1, 2),
            vpreds[row : row + 1].clone(),
            mask[row : row + 1],
            0.5,
            batch_num_tokens=3,
        )
        append_to_dict(collected, {"critic/vf_loss": Metric(AggregationType.SUM, loss)})
    assert isinstance(collected["critic/vf_loss"], Metric)
    assert reduce_metrics(collected)["critic/vf_loss"] == pytest.approx(0.5 * 14 / 3)


# ---------------------------------------------------------------------------------------------
# upstream-style writes into config.global_batch_info
# ---------------------------------------------------------------------------------------------


def test_writes_into_config_global_batch_info_take_effect():
    cfg = ActorConfig()
    loss_fn = get_policy_loss_fn("vanilla")
    # ratio 1, A = 1 on 2 valid tokens: per-token loss -1; locally token-mean = -1
    args = (torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), "token-mean", cfg)
    assert loss_fn(*args)[0].item() == pytest.approx(-1.0)
    # upstream's actor writes the global denominators before calling the loss
    cfg.global_batch_info["dp_size"] = 2
    cfg.global_batch_info["batch_num_tokens"] = 8
    # -2 / 8 * 2 = -0.5
    assert loss_fn(*args)[0].item() == pytest.approx(-0.5)
    # upstream-style losses spread it into agg_loss explicitly: same value
    assert core_algos.agg_loss(
        -torch.ones(1, 2), torch.ones(1, 2), "token-mean", **cfg.global_batch_info
    ).item() == pytest.approx(-0.5)
    cfg.global_batch_info["batch_tokens"] = 1
    with pytest.raises(ValueError, match="accepted"):
        loss_fn(*args)


# ---------------------------------------------------------------------------------------------
# new advantage estimators
# ---------------------------------------------------------------------------------------------


def test_enum_and_registry_hold_the_new_estimators():
    for name in ("gdpo", "optimal_token_baseline", "tir_optimal_token_baseline"):
        assert core_algos.AdvantageEstimator(name).value == name
        assert callable(get_adv_estimator_fn(name))


def test_gdpo_normalises_each_reward_component_then_whitens():
    # one group of 2 one-token responses; format (1, 0), accuracy (0, 1), weights (1, 2)
    # each component by GRPO: (+0.7071, -0.7071) and (-0.7071, +0.7071)
    # weighted sum: (0.7071 - 1.4142, -0.7071 + 1.4142) = (-0.7071, 0.7071)
    # whitening over the 2 valid tokens (unbiased std = 1.0): (-0.7071, 0.7071)
    mask = torch.ones(2, 1)
    non_tensor = {"format_reward": np.array([1.0, 0.0]), "accuracy_reward": np.array([0.0, 1.0])}
    config = {"gdpo_reward_keys": ["format_reward", "accuracy_reward"], "gdpo_reward_weights": [1.0, 2.0]}
    adv, ret = get_adv_estimator_fn("gdpo")(
        torch.zeros(2, 1), mask, _uids("g", "g"), config=config, non_tensor_batch=non_tensor, batch={}
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([-0.70711, 0.70711]), atol=1e-4, rtol=0)
    assert torch.equal(adv, ret)
    # weights (3, 1): (3*0.7071 - 0.7071, -3*0.7071 + 0.7071) = (1.4142, -1.4142) -> whitened (0.7071, -0.7071)
    config["gdpo_reward_weights"] = [3.0, 1.0]
    adv, _ = get_adv_estimator_fn("gdpo")(
        torch.zeros(2, 1), mask, _uids("g", "g"), config=config, non_tensor_batch=non_tensor, batch={}
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.70711, -0.70711]), atol=1e-4, rtol=0)
    with pytest.raises(KeyError, match="format_reward"):
        get_adv_estimator_fn("gdpo")(
            torch.zeros(2, 1),
            mask,
            _uids("g", "g"),
            config=config,
            non_tensor_batch={"accuracy_reward": np.zeros(2)},
            batch={},
        )
    with pytest.raises(ValueError, match="gdpo_reward_keys"):
        get_adv_estimator_fn("gdpo")(
            torch.zeros(2, 1), mask, _uids("g", "g"), config={}, non_tensor_batch=non_tensor, batch={}
        )


def test_optimal_token_baseline_numbers():
    # group of 2, length 2; rewards row 0 (0, 1), row 1 (0, 0) -> returns (1, 1) and (0, 0)
    # w = 1 - 2 pi + sum_pi2 with sum_pi2 = 0.5: row 0 pi = 0.5 -> w 0.5, W = (0.5, 1.0);
    # row 1 pi = 0.25 -> w 1.0, W = (1, 2)
    # B_0 = (1*0.5 + 0*1) / (0.5 + 1) = 1/3, B_1 = (1*1 + 0*2) / (1 + 2) = 1/3
    # advantages (2/3, 2/3) and (-1/3, -1/3)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    old = torch.tensor([[LOG(0.5)] * 2, [LOG(0.25)] * 2])
    adv, ret = get_adv_estimator_fn("optimal_token_baseline")(
        rewards, mask, _uids("g", "g"), old_log_probs=old, sum_pi_squared=torch.full((2, 2), 0.5)
    )
    torch.testing.assert_close(adv, torch.tensor([[2 / 3, 2 / 3], [-1 / 3, -1 / 3]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    # rollout IS weights scale w by w_is^2: row 1 weights 0.5 -> w 0.25, W = (0.25, 0.5)
    # B_0 = 0.5 / 0.75 = 2/3 -> row 0 advantage 1/3 at t = 0
    adv, _ = get_adv_estimator_fn("optimal_token_baseline")(
        rewards,
        mask,
        _uids("g", "g"),
        old_log_probs=old,
        sum_pi_squared=torch.full((2, 2), 0.5),
        rollout_is_weights=torch.tensor([[1.0, 1.0], [0.5, 0.5]]),
    )
    assert adv[0, 0].item() == pytest.approx(1 / 3, abs=1e-6)


def test_optimal_token_baseline_zero_tail_and_missing_inputs():
    # row 0 is the unique longest (3 vs 2 tokens): its baseline at t >= 2 is 0, so A = G there
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    kwargs = {"old_log_probs": torch.full((2, 3), LOG(0.5)), "sum_pi_squared": torch.full((2, 3), 0.5)}
    adv, ret = get_adv_estimator_fn("optimal_token_baseline")(rewards, mask, _uids("g", "g"), **kwargs)
    assert adv[0, 2].item() == pytest.approx(ret[0, 2].item()) == 1.0
    adv_no, _ = get_adv_estimator_fn("optimal_token_baseline")(
        rewards, mask, _uids("g", "g"), handle_zero_tail=False, **kwargs
    )
    assert adv_no[0, 2].item() == pytest.approx(0.0, abs=1e-6)  # only row 0 at t = 2: B = G
    with pytest.raises(ValueError, match="sum_pi_squared"):
        get_adv_estimator_fn("optimal_token_baseline")(rewards, mask, _uids("g", "g"))


def test_tir_optimal_token_baseline_compares_the_kth_valid_token():
    # row 0 mask (1, 0, 1) (a tool token in the middle), row 1 mask (1, 1, 0); reward 1 on row 0's last
    # token: returns row 0 (1, ., 1), row 1 (0, 0); w = 0.5 per valid token -> W of the k-th valid
    # token = (0.5, 1.0) in both rows; B_k = (1*W_k) / (2 W_k) = 0.5 -> A row 0 = 0.5 on cols 0 and 2,
    # row 1 = -0.5 on cols 0 and 1
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0, 1], [1, 1, 0]])
    kwargs = {"old_log_probs": torch.full((2, 3), LOG(0.5)), "sum_pi_squared": torch.full((2, 3), 0.5)}
    adv, _ = get_adv_estimator_fn("tir_optimal_token_baseline")(rewards, mask, _uids("g", "g"), **kwargs)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.0, 0.5], [-0.5, -0.5, 0.0]]), atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------
# PF-PPO
# ---------------------------------------------------------------------------------------------


def test_pf_ppo_reweight_resamples_by_score():
    scores = torch.zeros(3, 2)
    scores[:, 1] = torch.tensor([1.0, 0.5, 0.0])
    data = DataProto.from_dict(
        tensors={"token_level_scores": scores, "row": torch.arange(3)},
        non_tensors={"uid": _uids("a", "b", "c")},
        meta_info={"per_row": ["x", "y", "z"], "temperature": 1.0},
    )
    torch.manual_seed(0)
    # max_min: weight 1 for the max (row 0) and min (row 2) scores, 0 (+1e-8) for row 1
    out = core_algos.compute_pf_ppo_reweight_data(data, "max_min")
    rows = out.batch["row"].tolist()
    assert len(out) == 3 and set(rows) <= {0, 2}
    assert list(out.non_tensor_batch["uid"]) == [["a", "b", "c"][r] for r in rows]
    assert out.meta_info["per_row"] == [["x", "y", "z"][r] for r in rows] and out.meta_info["temperature"] == 1.0
    # pow with weight_pow 2: |0|^2 = 0 -> row 2 (score 0) is (almost) never drawn
    torch.manual_seed(0)
    rows = core_algos.compute_pf_ppo_reweight_data(data, "pow", 2.0).batch["row"].tolist()
    assert 2 not in rows
    with pytest.raises(ValueError, match="reweight_method"):
        core_algos.compute_pf_ppo_reweight_data(data, "nope")


@pytest.mark.parametrize("beta", [0.0, -0.5])
def test_dro_non_positive_beta_fails_at_config_time_naming_the_key(beta):
    from verl.workers.config import PolicyLossConfig

    with pytest.raises(ValueError, match=r"actor\.policy_loss\.dro_beta=.*out of range"):
        PolicyLossConfig(loss_mode="dro", dro_beta=beta)
    args = (torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), "token-mean")
    with pytest.raises(ValueError, match=r"dro_beta=.* must be > 0"):
        get_policy_loss_fn("dro")(*args, {"policy_loss": {"dro_beta": beta}})
