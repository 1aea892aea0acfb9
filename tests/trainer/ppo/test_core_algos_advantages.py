"""Advantage estimators, normalisation presets, process supervision, turn-level GAE and dynamic
lambda. Reference numbers are those of ALGORITHMS.md section 1."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import verl.utils.torch_functional as verl_F
from verl.trainer.config.algorithm import AlgoConfig, NormConfig
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    GAELambdaContext,
    compute_gae_advantage_return,
    get_adv_estimator_fn,
    normalize_by_config,
)


def _outcome(scores, length=3, lengths=None):
    """Token rewards with each score on the last valid token, and the response mask."""
    scores = torch.as_tensor(scores, dtype=torch.float32)
    batch = scores.shape[0]
    lengths = torch.full((batch,), length) if lengths is None else torch.as_tensor(lengths)
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).float()
    rewards = torch.zeros(batch, length)
    for i in range(batch):
        if lengths[i] > 0:
            rewards[i, lengths[i] - 1] = scores[i]
    return rewards, mask


def _uids(*names):
    return np.array(list(names), dtype=object)


# ---------------------------------------------------------------------------------------------
# reference numbers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rloo", "rloo_vectorized"])
def test_rloo_reference(name):
    rewards, mask = _outcome([0.8, 0.3, 0.6, 0.5])
    adv, ret = get_adv_estimator_fn(name)(
        token_level_rewards=rewards, response_mask=mask, index=_uids("q", "q", "q", "q")
    )
    expected = torch.tensor([1 / 3, -1 / 3, 0.2 / 3, -0.2 / 3])
    torch.testing.assert_close(adv[:, 0], expected, atol=1e-4, rtol=0)
    assert adv[:, 0].sum().item() == pytest.approx(0.0, abs=1e-6)
    assert torch.equal(adv, ret)
    # G/(G-1) * (r - mean)
    torch.testing.assert_close(adv[:, 0], 4 / 3 * (torch.tensor([0.8, 0.3, 0.6, 0.5]) - 0.55))


def test_gae_reference_batch():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [2.0, 1.0, 0.0]])
    values = torch.tensor([[3.0, 4.0, 2.0], [2.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.95)
    raw = torch.tensor([[2.160025, 0.655, 1.0], [0.945, -1.0, 0.0]])
    torch.testing.assert_close(ret - values * mask, raw, atol=1e-6, rtol=0)
    # returns = raw A + V, the advantages are the whitened raw A (as upstream)
    torch.testing.assert_close(adv, verl_F.masked_whiten(raw, mask) * mask, atol=1e-6, rtol=0)
    assert adv[1, 2].item() == 0.0 and ret[1, 2].item() == 0.0


def test_gae_with_unit_gamma_lambda_broadcasts_outcome_reward():
    rewards, mask = _outcome([1.0, -2.0, 0.5], length=5, lengths=[5, 3, 1])
    _, ret = compute_gae_advantage_return(rewards, torch.zeros(3, 5), mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(ret, torch.tensor([1.0, -2.0, 0.5]).unsqueeze(-1) * mask)


def test_gae_padding_does_not_leak():
    rewards = torch.tensor([[1.0, 2.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.3, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 0]])
    _, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    garbage_r = rewards.clone()
    garbage_v = values.clone()
    garbage_r[0, 2:] = torch.tensor([100.0, float("nan")])
    garbage_v[0, 2:] = torch.tensor([float("nan"), 50.0])
    _, ret2 = compute_gae_advantage_return(garbage_r, garbage_v, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(ret2, ret)
    assert torch.isfinite(ret2).all()


def test_gae_masked_positions_consume_no_timestep():
    # a tool-output token in the middle (mask 0) is skipped: one discount step, not two
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    mask = torch.tensor([[1, 0, 1]])
    _, ret = compute_gae_advantage_return(rewards, torch.zeros(1, 3), mask, gamma=0.5, lam=1.0)
    assert ret[0, 0].item() == pytest.approx(0.5)
    assert ret[0, 1].item() == 0.0


def test_gae_uses_config_values():
    rewards = torch.tensor([[0.0, 1.0]])
    mask = torch.ones(1, 2)
    cfg = AlgoConfig(gamma=0.5, lam=1.0)
    _, ret = compute_gae_advantage_return(rewards, torch.zeros(1, 2), mask, config=cfg)
    assert ret[0, 0].item() == pytest.approx(0.5)
    # an explicit gamma wins over the config
    _, ret2 = compute_gae_advantage_return(rewards, torch.zeros(1, 2), mask, gamma=1.0, config=cfg)
    assert ret2[0, 0].item() == pytest.approx(1.0)


def test_gae_with_adv_norm_replaces_whitening():
    rewards, mask = _outcome([1.0, 2.0, 4.0], length=2)
    values = torch.zeros(3, 2)
    cfg = AlgoConfig(gamma=1.0, lam=1.0, adv_norm=NormConfig(mean_level="batch", std_level=None))
    adv, ret = compute_gae_advantage_return(rewards, values, mask, config=cfg)
    torch.testing.assert_close(adv, (ret - 7.0 / 3) * mask)


# ---------------------------------------------------------------------------------------------
# GRPO family
# ---------------------------------------------------------------------------------------------


def test_grpo_hand_computed_and_dr_grpo():
    rewards, mask = _outcome([1.0, 0.0, 1.0, 0.0, 5.0])
    index = _uids("a", "b", "a", "a", "c")  # non-contiguous, unequal sizes, a singleton
    adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index)
    group_a = torch.tensor([1.0, 1.0, 0.0])
    std = group_a.std().item()
    expected = torch.tensor(
        [(1 - 2 / 3) / (std + 1e-6), 0.0, (1 - 2 / 3) / (std + 1e-6), (0 - 2 / 3) / (std + 1e-6), 0.0]
    )
    torch.testing.assert_close(adv[:, 0], expected)
    assert adv[4].abs().sum() == 0  # singleton group: no baseline, no signal
    dr, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(dr[:, 0], torch.tensor([1 / 3, 0.0, 1 / 3, -2 / 3, 0.0]))
    via_config, _ = core_algos.compute_grpo_outcome_advantage(
        rewards, mask, index, config=AlgoConfig(norm_adv_by_std_in_grpo=False)
    )
    torch.testing.assert_close(via_config, dr)


def test_grpo_equal_rewards_give_zero():
    rewards, mask = _outcome([1.0, 1.0, 1.0])
    adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, _uids("a", "a", "a"))
    assert torch.equal(adv, torch.zeros_like(adv))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    batch=st.integers(1, 14),
    n_groups=st.integers(1, 5),
    scale=st.booleans(),
)
def test_vectorized_estimators_match_loops(seed, batch, n_groups, scale):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 5, (batch,), generator=gen)
    rewards, mask = _outcome(torch.randn(batch, generator=gen), length=4, lengths=lengths)
    index = np.array([f"g{int(g)}" for g in torch.randint(0, n_groups, (batch,), generator=gen)], dtype=object)
    a1, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=scale)
    a2, _ = core_algos.compute_grpo_vectorized_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=scale)
    torch.testing.assert_close(a1, a2, atol=1e-5, rtol=1e-5)
    r1, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, index)
    r2, _ = core_algos.compute_rloo_vectorized_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(r1, r2, atol=1e-5, rtol=1e-5)
    for adv in (a1, r1):
        assert torch.isfinite(adv).all()
        assert torch.equal(adv * (1 - mask), torch.zeros_like(adv))


def test_grpo_passk():
    rewards, mask = _outcome([0.2, 0.9, 0.5, 1.0])
    index = _uids("a", "a", "a", "b")
    adv, _ = core_algos.compute_grpo_passk_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.0, 0.4, 0.0, 0.0]))
    scaled, _ = core_algos.compute_grpo_passk_outcome_advantage(rewards, mask, index)
    std = torch.tensor([0.2, 0.9, 0.5]).std().item()
    assert scaled[1, 0].item() == pytest.approx(0.4 / (std + 1e-6), rel=1e-5)


def test_process_supervision_reference_suffix_sums():
    normalised = torch.tensor([[0.0, 0.2, 0.0, -0.5, 0.0, 1.0]])
    ends = torch.tensor([[0, 1, 0, 1, 0, 1]])
    adv = core_algos.step_rewards_to_go(normalised, ends, torch.ones(1, 6))
    torch.testing.assert_close(adv, torch.tensor([[0.7, 0.7, 0.5, 0.5, 1.0, 1.0]]))


def test_process_supervision_estimator():
    # two responses of one prompt; steps end at the marked tokens; one step reward is exactly 0
    rewards = torch.tensor([[0.0, 1.0, 0.0, 0.0], [3.0, 0.0, 2.0, 0.0]])
    ends = torch.tensor([[0, 1, 0, 1], [1, 0, 1, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    adv, ret = core_algos.compute_grpo_process_advantage(rewards, mask, _uids("a", "a"), step_end_mask=ends)
    steps = torch.tensor([1.0, 0.0, 3.0, 2.0])
    norm = (steps - steps.mean()) / (steps.std() + 1e-6)
    expected = torch.tensor(
        [
            [norm[0] + norm[1], norm[0] + norm[1], norm[1], norm[1]],
            [norm[2] + norm[3], norm[3], norm[3], 0.0],
        ]
    )
    torch.testing.assert_close(adv, expected)
    assert torch.equal(adv, ret)
    # a singleton prompt gets 0 even with several steps
    single, _ = core_algos.compute_grpo_process_advantage(rewards[:1], mask[:1], _uids("z"), step_end_mask=ends[:1])
    assert torch.equal(single, torch.zeros_like(single))
    # default step ends: the non-zero rewards (the 0-reward step is then not a step)
    default, _ = core_algos.compute_grpo_process_advantage(rewards, mask, _uids("a", "a"))
    steps3 = torch.tensor([1.0, 3.0, 2.0])
    n3 = (steps3 - steps3.mean()) / (steps3.std() + 1e-6)
    assert default[0, 0].item() == pytest.approx(n3[0].item(), abs=1e-5)


# ---------------------------------------------------------------------------------------------
# REINFORCE++, ReMax, OPO, GPG
# ---------------------------------------------------------------------------------------------


def test_reinforce_plus_plus_returns_and_whitening():
    rewards = torch.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv, ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=AlgoConfig(gamma=0.5))
    torch.testing.assert_close(ret, torch.tensor([[0.0 + 0.5 * 2.0, 2.0, 2.0], [1.0, 0.0, 0.0]]))
    torch.testing.assert_close(adv, verl_F.masked_whiten(ret, mask) * mask)


def test_reinforce_plus_plus_baseline():
    rewards, mask = _outcome([1.0, 3.0, 5.0], length=2)
    adv, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, _uids("a", "a", "b"))
    centred = torch.tensor([-1.0, 1.0, 0.0]).unsqueeze(-1).expand(3, 2)
    torch.testing.assert_close(adv, verl_F.masked_whiten(centred, mask) * mask)


def test_remax():
    rewards, mask = _outcome([1.0, 0.5], length=3, lengths=[3, 2])
    adv, ret = core_algos.compute_remax_outcome_advantage(rewards, torch.tensor([0.4, 0.5]), mask)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.5, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.6, 0.6, 0.6], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="reward_baselines"):
        core_algos.compute_remax_outcome_advantage(rewards, None, mask)


def test_opo_length_weighted_baseline():
    rewards, mask = _outcome([1.0, 0.0], length=4, lengths=[1, 3])
    adv, _ = core_algos.compute_opo_outcome_advantage(rewards, mask, _uids("a", "a"))
    baseline = (1 * 1.0 + 3 * 0.0) / 4
    torch.testing.assert_close(adv, torch.tensor([[1 - baseline, 0, 0, 0], [-baseline] * 3 + [0.0]]))


def test_gpg_alpha_correction():
    rewards, mask = _outcome([1.0, 0.0, 0.0, 0.0])
    adv, _ = core_algos.compute_gpg_outcome_advantage(rewards, mask, _uids("a", "a", "b", "b"))
    # alpha = B / #nonzero = 4; group a mean 0.5
    torch.testing.assert_close(adv[:, 0], torch.tensor([2.0, -2.0, 0.0, 0.0]))


# ---------------------------------------------------------------------------------------------
# normalisation presets
# ---------------------------------------------------------------------------------------------

PRESETS = {
    "grpo": dict(mean_level="group", std_level="group"),
    "drgrpo": dict(mean_level="group", std_level=None),
    "rloo": dict(mean_level="group", std_level=None, mean_leave1out=True),
}


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 12), n_groups=st.integers(1, 4))
def test_norm_presets_equal_named_estimators(seed, batch, n_groups):
    gen = torch.Generator().manual_seed(seed)
    rewards, mask = _outcome(
        torch.randn(batch, generator=gen), length=3, lengths=torch.randint(1, 4, (batch,), generator=gen)
    )
    index = np.array([f"g{int(g)}" for g in torch.randint(0, n_groups, (batch,), generator=gen)], dtype=object)
    norm = get_adv_estimator_fn("norm")
    grpo, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index, epsilon=1e-5)
    drgrpo, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    rloo, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, index)
    for name, expected in (("grpo", grpo), ("drgrpo", drgrpo), ("rloo", rloo)):
        cfg = AlgoConfig(adv_estimator="norm", adv_norm=NormConfig(**PRESETS[name]))
        got, _ = norm(token_level_rewards=rewards, response_mask=mask, index=index, config=cfg)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=name)
        # the same preset through reward_norm (AReaL reading) and through a plain dict config
        got2, _ = norm(
            token_level_rewards=rewards, response_mask=mask, index=index, config={"reward_norm": PRESETS[name]}
        )
        torch.testing.assert_close(got2, expected, atol=1e-5, rtol=1e-5, msg=name)


def test_liteppo_group_mean_batch_std():
    rewards, mask = _outcome([1.0, 0.0, 1.0, 1.0])
    index = _uids("a", "a", "b", "b")
    cfg = AlgoConfig(adv_norm=NormConfig(mean_level="group", std_level="batch"))
    adv, _ = get_adv_estimator_fn("norm")(token_level_rewards=rewards, response_mask=mask, index=index, config=cfg)
    batch_std = torch.tensor([1.0, 0.0, 1.0, 1.0]).std().item()
    expected = torch.tensor([0.5, -0.5, 0.0, 0.0]) / (batch_std + 1e-5)
    torch.testing.assert_close(adv[:, 0], expected)


def test_ppo_preset_batch_norm_at_token_level_matches_whitening():
    gen = torch.Generator().manual_seed(3)
    values = torch.randn(4, 5, generator=gen)
    mask = (torch.rand(4, 5, generator=gen) > 0.3).float()
    out = normalize_by_config(values, NormConfig(mean_level="batch", std_level="batch", eps=0.0), mask=mask)
    torch.testing.assert_close(out, verl_F.masked_whiten(values, mask, eps=0.0) * mask, atol=1e-5, rtol=1e-5)


def test_norm_reward_then_adv_and_biased_std():
    scores = torch.tensor([1.0, 3.0, 2.0, 6.0])
    index = _uids("a", "a", "b", "b")
    step1 = normalize_by_config(scores, dict(mean_level="group", std_level=None), index=index)
    torch.testing.assert_close(step1, torch.tensor([-1.0, 1.0, -2.0, 2.0]))
    step2 = normalize_by_config(step1, dict(mean_level=None, std_level="batch", std_unbiased=False, eps=0.0))
    torch.testing.assert_close(step2, step1 / step1.std(unbiased=False))
    rewards, mask = _outcome(scores)
    cfg = {
        "reward_norm": dict(mean_level="group", std_level=None),
        "adv_norm": dict(mean_level=None, std_level="batch", std_unbiased=False, eps=0.0),
    }
    adv, _ = get_adv_estimator_fn("norm")(token_level_rewards=rewards, response_mask=mask, index=index, config=cfg)
    torch.testing.assert_close(adv[:, 0], step2)


def test_norm_needs_a_config_and_group_needs_index():
    rewards, mask = _outcome([1.0, 2.0])
    with pytest.raises(ValueError, match="reward_norm"):
        core_algos.compute_norm_outcome_advantage(rewards, mask, _uids("a", "a"), config=AlgoConfig())
    with pytest.raises(ValueError, match="index"):
        normalize_by_config(torch.ones(2), dict(mean_level="group", std_level=None))
    with pytest.raises(ValueError, match="mean_level"):
        normalize_by_config(torch.ones(2), dict(mean_level="prompt", std_level=None))


# ---------------------------------------------------------------------------------------------
# dynamic lambda and turn-level GAE
# ---------------------------------------------------------------------------------------------


def _ctx(lengths):
    t = torch.tensor(lengths)
    return GAELambdaContext(effective_token_lengths=t, turn_counts=t, timestep_lengths=t)


def test_lambda_builtins():
    vapo = core_algos.vapo_length_adaptive(_ctx([0, 1, 10, 100]), alpha=0.05)
    torch.testing.assert_close(vapo, torch.tensor([0.0, 0.0, 0.0, 1 - 1 / 5]))
    rel = core_algos.relative_position(_ctx([0, 1, 2, 5]), q=0.5)
    torch.testing.assert_close(rel, torch.tensor([0.0, 1.0, 0.5, 0.5 ** (1 / 4)]))
    with pytest.raises(ValueError, match="alpha"):
        core_algos.vapo_length_adaptive(_ctx([1]), alpha=0.0)


def test_lambda_resolution_by_name_path_callable():
    ctx = _ctx([2, 5])
    by_name = core_algos.resolve_gae_lambda("relative_position", {"q": 0.5}, ctx)
    by_path = core_algos.resolve_gae_lambda("verl.trainer.ppo.core_algos.relative_position", {"q": 0.5}, ctx)
    by_alias = core_algos.resolve_gae_lambda("relative_position_gae_lambda", {"q": 0.5}, ctx)
    by_callable = core_algos.resolve_gae_lambda(lambda c, q: core_algos.relative_position(c, q), {"q": 0.5}, ctx)
    for other in (by_path, by_alias, by_callable):
        torch.testing.assert_close(other, by_name)
    assert core_algos.resolve_gae_lambda(0.9, None, ctx) == 0.9
    with pytest.raises(ValueError, match="lam_kwargs"):
        core_algos.resolve_gae_lambda("relative_position", {}, ctx)
    with pytest.raises(ValueError, match="neither"):
        core_algos.resolve_gae_lambda("no_such_fn", {}, ctx)
    with pytest.raises(ValueError, match="cannot import"):
        core_algos.resolve_gae_lambda("no.such.module.fn", {}, ctx)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        core_algos.resolve_gae_lambda(lambda c: torch.full((2,), 2.0), {}, ctx)


def test_gae_with_per_trajectory_lambda():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    cfg = AlgoConfig(gamma=1.0, lam="relative_position", lam_kwargs={"q": 0.25})
    _, ret = compute_gae_advantage_return(rewards, values, mask, config=cfg)
    # per row lambda: L=3 -> 0.25**(1/2) = 0.5 ; L=2 -> 0.25
    for row, lam in ((0, 0.5), (1, 0.25)):
        _, ret_row = compute_gae_advantage_return(
            rewards[row : row + 1], values[row : row + 1], mask[row : row + 1], gamma=1.0, lam=lam
        )
        torch.testing.assert_close(ret[row], ret_row[0])


def _turn_gae_by_hand(turn_rewards, turn_values, gamma, lam):
    adv = []
    running = 0.0
    for u in reversed(range(len(turn_rewards))):
        next_v = turn_values[u + 1] if u + 1 < len(turn_values) else 0.0
        running = turn_rewards[u] + gamma * next_v - turn_values[u] + gamma * lam * running
        adv.append(running)
    return adv[::-1]


def test_turn_level_gae():
    # one trajectory: prompt(-1), turn 0 (2 tokens), tool output (-1, masked), turn 2 (3 tokens), pad
    turn_ids = torch.tensor([[0, 0, -1, 2, 2, 2, -1]])
    mask = torch.tensor([[1, 1, 0, 1, 1, 1, 0]])
    scores = torch.tensor([[0.0, 0.5, 0.0, 0.0, 0.0, 1.0, 0.0]])
    kl_part = torch.tensor([[-0.1, -0.2, 0.0, -0.3, -0.1, -0.1, 0.0]])
    rewards = scores + kl_part
    values = torch.tensor([[0.2, 9.0, 0.0, 0.4, 9.0, 9.0, 0.0]])  # only first-token values matter
    cfg = AlgoConfig(gamma=0.9, lam=0.8, gae_timestep_unit="turn")
    adv, ret = compute_gae_advantage_return(
        rewards, values, mask, config=cfg, turn_ids=turn_ids, token_level_scores=scores
    )
    a0, a1 = _turn_gae_by_hand([0.5, 1.0], [0.2, 0.4], 0.9, 0.8)
    expected_ret = torch.tensor([[a0 + 0.2, a0 + 0.2, 0.0, a1 + 0.4, a1 + 0.4, a1 + 0.4, 0.0]])
    torch.testing.assert_close(ret, expected_ret)
    raw = torch.tensor([[a0, a0, 0.0, a1, a1, a1, 0.0]]) + kl_part * mask
    torch.testing.assert_close(adv, verl_F.masked_whiten(raw, mask) * mask, atol=1e-6, rtol=1e-6)


def test_turn_ids_aligned_with_input_ids_and_validation():
    mask = torch.tensor([[1, 1, 1]])
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.zeros(1, 3)
    cfg = AlgoConfig(gamma=1.0, lam=1.0, gae_timestep_unit="turn")
    full_ids = torch.tensor([[-1, -1, 0, 1, 1]])  # prompt + response: last L columns are used
    _, ret = compute_gae_advantage_return(rewards, values, mask, config=cfg, turn_ids=full_ids)
    torch.testing.assert_close(ret, torch.ones(1, 3))
    with pytest.raises(ValueError, match="turn id -1"):
        compute_gae_advantage_return(rewards, values, mask, config=cfg, turn_ids=torch.tensor([[0, -1, 1]]))
    with pytest.raises(ValueError, match="non-decreasing"):
        compute_gae_advantage_return(rewards, values, mask, config=cfg, turn_ids=torch.tensor([[1, 0, 1]]))
    with pytest.raises(ValueError, match="turn_ids"):
        compute_gae_advantage_return(rewards, values, mask, config=cfg)


def test_turn_level_dynamic_lambda_uses_turn_counts():
    turn_ids = torch.tensor([[0, 1, 1, 2]])
    mask = torch.ones(1, 4)
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.1, 0.2, 0.0, 0.3]])
    cfg = AlgoConfig(gamma=1.0, lam="vapo_length_adaptive", lam_kwargs={"alpha": 0.5}, gae_timestep_unit="turn")
    _, ret = compute_gae_advantage_return(rewards, values, mask, config=cfg, turn_ids=turn_ids)
    lam = 1 - 1 / (0.5 * 3)  # 3 turns
    a = _turn_gae_by_hand([0.0, 0.0, 1.0], [0.1, 0.2, 0.3], 1.0, lam)
    torch.testing.assert_close(ret, torch.tensor([[a[0] + 0.1, a[1] + 0.2, a[1] + 0.2, a[2] + 0.3]]))


# ---------------------------------------------------------------------------------------------
# uniform call convention and edge cases for every registered estimator
# ---------------------------------------------------------------------------------------------


def _uniform_kwargs(rewards, mask, index, config):
    return dict(
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        config=config,
        values=torch.zeros_like(rewards),
        gamma=None,
        lam=None,
        norm_adv_by_std_in_grpo=True,
        reward_baselines=torch.zeros(rewards.shape[0]),
        turn_ids=None,
        token_level_scores=rewards,
        step_end_mask=None,
        old_log_probs=torch.full_like(rewards, -0.5),
        sum_pi_squared=torch.full_like(rewards, 0.4),
        rollout_is_weights=None,
        some_future_kwarg="ignored",
    )


def test_every_builtin_estimator_is_registered():
    assert {e.value for e in AdvantageEstimator} <= set(ADV_ESTIMATOR_REGISTRY)


@pytest.mark.parametrize("name", sorted(e.value for e in AdvantageEstimator))
def test_every_estimator_accepts_uniform_kwargs_and_empty_rows(name):
    rewards, mask = _outcome([1.0, 0.0, 2.0, 0.5, 3.0], length=4, lengths=[4, 0, 2, 0, 3])
    index = _uids("a", "a", "a", "b", "c")  # 'c' is a singleton group, 'b' only an empty row
    config = AlgoConfig(adv_estimator=name, adv_norm=NormConfig(mean_level="group", std_level="group"))
    adv, ret = get_adv_estimator_fn(name)(**_uniform_kwargs(rewards, mask, index, config))
    assert adv.shape == rewards.shape and ret.shape == rewards.shape
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all(), name
    # empty responses get zero advantages
    assert torch.equal(adv[1], torch.zeros(4)) and torch.equal(adv[3], torch.zeros(4))
    assert not adv.requires_grad


@pytest.mark.parametrize(
    "name",
    [
        "grpo",
        "grpo_vectorized",
        "rloo",
        "rloo_vectorized",
        "opo",
        "gpg",
        "grpo_passk",
        "grpo_process",
        "gdpo",
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
    ],
)
def test_singleton_groups_get_zero(name):
    rewards, mask = _outcome([1.0, 5.0, -2.0])
    adv, _ = get_adv_estimator_fn(name)(**_uniform_kwargs(rewards, mask, _uids("a", "b", "c"), AlgoConfig()))
    assert torch.equal(adv, torch.zeros_like(adv))


def test_group_estimators_need_index():
    rewards, mask = _outcome([1.0, 2.0])
    with pytest.raises(ValueError, match="index"):
        core_algos.compute_grpo_outcome_advantage(rewards, mask, None)
    with pytest.raises(ValueError, match="entries"):
        core_algos.compute_rloo_vectorized_outcome_advantage(rewards, mask, _uids("a"))


def test_unequal_group_sizes_after_filtering():
    # groups of 3 and 2 interleaved, as left by dynamic sampling
    scores = [1.0, 4.0, 0.0, 2.0, 1.0]
    rewards, mask = _outcome(scores)
    index = _uids("x", "y", "x", "y", "x")
    adv, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, index)
    x = torch.tensor([1.0, 0.0, 1.0])
    y = torch.tensor([4.0, 2.0])
    exp_x = x - (x.sum() - x) / 2
    exp_y = y - (y.sum() - y) / 1
    torch.testing.assert_close(adv[:, 0], torch.tensor([exp_x[0], exp_y[0], exp_x[1], exp_y[1], exp_x[2]]))
    assert math.isclose(adv[[0, 2, 4], 0].sum().item(), 0.0, abs_tol=1e-6)
