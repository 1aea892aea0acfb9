"""The built-in advantage estimators (`algorithm.adv_estimator`), registered with their traits,
plus PF-PPO resampling. Each takes `token_level_rewards` and `response_mask` [B, L], `index` [B]
prompt ids when it compares the responses to one prompt, and `config` (the `algorithm` section),
and returns `(advantages, returns)` [B, L], 0 on masked tokens. Re-exported by `core_algos`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

import verl.utils.torch_functional as verl_F
from verl.trainer.ppo.algos.gae_lambda import GAELambdaContext, resolve_gae_lambda
from verl.trainer.ppo.algos.normalization import (
    _group_count_mean,
    _group_ids,
    _group_members,
    _group_sum,
    normalize_by_config,
)
from verl.trainer.ppo.algos.registry import AdvantageEstimator, register_adv_est
from verl.utils.py_functional import config_get


def _outcome_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-response outcome reward [B]: the sum of the token rewards on valid tokens."""
    return verl_F.masked_sum(token_level_rewards, response_mask, axis=-1)


def _broadcast(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return torch.where(
        response_mask.bool(), scores.unsqueeze(-1), torch.zeros((), dtype=scores.dtype, device=scores.device)
    )


def _whiten_valid(adv: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """`adv` [B, L] whitened over the valid tokens of the batch, 0 on masked positions."""
    mask = response_mask.bool()
    return torch.where(mask, verl_F.masked_whiten(adv, mask), torch.zeros((), dtype=adv.dtype, device=adv.device))


def _per_group_outcome(token_level_rewards, response_mask, index, who: str, per_group) -> torch.Tensor:
    """[B, L] advantage from the outcome scores: `per_group(scores of one group [G])` -> [G] for each
    group of two or more responses; a group of one has no baseline and gets 0."""
    scores = _outcome_scores(token_level_rewards, response_mask)
    out = torch.zeros_like(scores)
    for members in _group_members(index, scores.shape[0], scores.device, who):
        if len(members) > 1:
            out[members] = per_group(scores[members])
    return _broadcast(out, response_mask)


def _token_gae(rewards, values, mask, gamma: float, lam) -> torch.Tensor:
    """Raw token-level GAE; masked positions consume no timestep and carry the next values."""
    valid = mask.bool()
    batch, length = rewards.shape
    lam_t = (
        lam if torch.is_tensor(lam) else torch.full((batch,), float(lam), dtype=rewards.dtype, device=rewards.device)
    )
    lam_t = lam_t.to(rewards.dtype)
    next_value = torch.zeros(batch, dtype=rewards.dtype, device=rewards.device)
    last_adv = torch.zeros_like(next_value)
    adv = torch.zeros_like(rewards)
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam_t * last_adv
        m = valid[:, t]
        next_value = torch.where(m, values[:, t], next_value)
        last_adv = torch.where(m, candidate, last_adv)
        adv[:, t] = last_adv
    return adv


def _turn_gae(task_rewards, values, mask, turn_ids, gamma: float, lam) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level GAE: (A_u broadcast [B, L], G_u = A_u + V_u broadcast [B, L])."""
    batch = task_rewards.shape[0]
    adv = torch.zeros_like(task_rewards)
    ret = torch.zeros_like(task_rewards)
    for b in range(batch):
        pos = torch.nonzero(mask[b].bool()).squeeze(-1)
        if pos.numel() == 0:
            continue
        tid = turn_ids[b, pos]
        if (tid < 0).any():
            raise ValueError(f"turn_ids row {b}: a valid (response_mask=1) token has turn id -1")
        if (tid[1:] < tid[:-1]).any():
            raise ValueError(f"turn_ids row {b}: turn ids must be non-decreasing over the action tokens")
        starts = torch.ones_like(tid, dtype=torch.bool)
        starts[1:] = tid[1:] != tid[:-1]
        turn_of = torch.cumsum(starts.long(), 0) - 1
        n_turns = int(turn_of[-1]) + 1
        r_u = torch.zeros(n_turns, dtype=task_rewards.dtype, device=task_rewards.device).index_add_(
            0, turn_of, task_rewards[b, pos]
        )
        v_u = values[b, pos[starts]]
        lam_b = float(lam[b]) if torch.is_tensor(lam) else float(lam)
        a_u = torch.zeros_like(r_u)
        running = 0.0
        for u in reversed(range(n_turns)):
            next_v = v_u[u + 1] if u + 1 < n_turns else 0.0
            delta = r_u[u] + gamma * next_v - v_u[u]
            running = delta + gamma * lam_b * running
            a_u[u] = running
        adv[b, pos] = a_u[turn_of]
        ret[b, pos] = (a_u + v_u)[turn_of]
    return adv, ret


def _turn_counts(mask: torch.Tensor, turn_ids: torch.Tensor | None) -> torch.Tensor:
    if turn_ids is None:
        return torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device)
    counts = []
    for b in range(mask.shape[0]):
        tid = turn_ids[b, mask[b].bool()]
        counts.append(int(torch.unique(tid[tid >= 0]).numel()))
    return torch.tensor(counts, dtype=torch.long, device=mask.device)


def _gae_lambda(lam_spec: Any, mask: torch.Tensor, turn_ids: torch.Tensor | None, unit: str, config: Any):
    """`algorithm.lam` as a float, or [B] per trajectory for a lambda function."""
    if isinstance(lam_spec, (int, float)) and not isinstance(lam_spec, bool):
        return float(lam_spec)  # a constant lambda needs no per-trajectory lengths
    token_lengths = mask.sum(dim=-1)
    turn_counts = _turn_counts(mask, turn_ids)
    ctx = GAELambdaContext(
        effective_token_lengths=token_lengths,
        turn_counts=turn_counts,
        timestep_lengths=turn_counts if unit == "turn" else token_lengths,
    )
    return resolve_gae_lambda(lam_spec, config_get(config, "lam_kwargs", {}), ctx)


@register_adv_est(AdvantageEstimator.GAE, needs_critic=True)
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | None = None,
    lam: Any = None,
    config: Any = None,
    index: Any = None,
    turn_ids: torch.Tensor | None = None,
    token_level_scores: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the response (critic needed).

    Token unit (`algorithm.gae_timestep_unit=token`, default): `delta_t = r_t + gamma*V_{t+1} - V_t`,
    `A_t = delta_t + gamma*lam*A_{t+1}` over valid tokens (masked positions consume no timestep),
    returns `= A + V` (raw A).
    Turn unit: each non-empty turn (same `turn_ids`) is one step: the task rewards of the turn are
    summed, V_u is the value at the turn's first action token, A_u / G_u = A_u + V_u are broadcast
    to the turn's tokens; the per-token KL part (`token_level_rewards - token_level_scores`, when
    `token_level_scores` is passed) is added to the actor advantage after the recursion and is not
    part of the returns.
    The advantages are then whitened over the valid tokens (`masked_whiten`), or normalised by
    `algorithm.adv_norm` when that is set. Masked positions are 0 in both outputs.

    Args:
        token_level_rewards, values, response_mask: [B, L].
        gamma, lam: override `config.gamma` / `config.lam`; `lam` may be a float, a [B] tensor, a
            registered name (`vapo_length_adaptive`, `relative_position`), a dotted path or a callable
            (called with a `GAELambdaContext` and `config.lam_kwargs`).
        turn_ids: [B, L] turn id per response token (-1 on non-action tokens), or [B, S] aligned
            with input_ids (the last L columns are used).
    Returns:
        advantages [B, L], returns [B, L].
    """
    gamma = float(gamma if gamma is not None else config_get(config, "gamma", 1.0))
    lam_spec = lam if lam is not None else config_get(config, "lam", 1.0)
    unit = config_get(config, "gae_timestep_unit", "token")
    if unit not in ("token", "turn"):
        raise ValueError(f"algorithm.gae_timestep_unit={unit!r}; expected one of ['token', 'turn']")
    with torch.no_grad():
        mask = response_mask.bool()
        zero = torch.zeros((), dtype=token_level_rewards.dtype, device=token_level_rewards.device)
        rewards = torch.where(mask, token_level_rewards, zero)
        vals = torch.where(mask, values.to(rewards.dtype), zero)
        if turn_ids is not None and turn_ids.shape[-1] != rewards.shape[-1]:
            turn_ids = turn_ids[..., -rewards.shape[-1] :]
        if unit == "turn" and turn_ids is None:
            raise ValueError("algorithm.gae_timestep_unit=turn needs `turn_ids` in the batch")
        lam_value = _gae_lambda(lam_spec, mask, turn_ids, unit, config)

        if unit == "token":
            raw_adv = _token_gae(rewards, vals, mask, gamma, lam_value)
            returns = raw_adv + vals
        else:
            if token_level_scores is not None:
                task = torch.where(mask, token_level_scores.to(rewards.dtype), zero)
            else:
                task = rewards
            raw_adv, returns = _turn_gae(task, vals, mask, turn_ids, gamma, lam_value)
            raw_adv = raw_adv + (rewards - task)  # token-local KL part, after the recursion

        adv_norm = config_get(config, "adv_norm", None)
        if adv_norm is not None:
            advantages = normalize_by_config(raw_adv, adv_norm, index=index, mask=mask)
        else:
            advantages = verl_F.masked_whiten(raw_adv, mask)
        advantages = torch.where(mask, advantages, zero)
        returns = torch.where(mask, returns, zero)
    return advantages, returns


def _norm_by_std(norm_adv_by_std_in_grpo: bool | None, config: Any) -> bool:
    if norm_adv_by_std_in_grpo is not None:
        return bool(norm_adv_by_std_in_grpo)
    return bool(config_get(config, "norm_adv_by_std_in_grpo", True))


@register_adv_est(AdvantageEstimator.GRPO, needs_groups=True)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: `(r - mean_group) / (std_group + epsilon)` broadcast to the tokens.

    r = sum of the token rewards of a response; std is unbiased (as `torch.std`).
    `norm_adv_by_std_in_grpo=False` (or `algorithm.norm_adv_by_std_in_grpo`) gives Dr.GRPO
    (`r - mean_group`). A group with a single response gets 0. Returns (advantages, advantages),
    both [B, L], 0 on masked positions.
    """
    scale = _norm_by_std(norm_adv_by_std_in_grpo, config)

    def per_group(group: torch.Tensor) -> torch.Tensor:
        centred = group - group.mean()
        return centred / (group.std() + epsilon) if scale else centred

    with torch.no_grad():
        adv = _per_group_outcome(token_level_rewards, response_mask, index, "grpo", per_group)
    return adv, adv


@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED, needs_groups=True)
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same result as `grpo`, computed with scatter operations instead of a loop over groups."""
    scale = _norm_by_std(norm_adv_by_std_in_grpo, config)
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        ids, n_groups = _group_ids(index, scores.shape[0], scores.device, "grpo_vectorized")
        count, mean = _group_count_mean(scores, ids, n_groups)
        centred = scores - mean[ids]
        if scale:
            var = _group_sum(centred.square(), ids, n_groups) / (count - 1).clamp(min=1)
            centred = centred / (var.sqrt()[ids] + epsilon)
        out = torch.where(count[ids] > 1, centred, torch.zeros_like(centred))
        adv = _broadcast(out, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.GRPO_PASSK, needs_groups=True)
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k advantage: only the best response of each group gets `r_max - r_second` (divided by
    `std_group + epsilon` when normalising by std); all others get 0. Groups of one response: 0."""
    scale = _norm_by_std(norm_adv_by_std_in_grpo, config)

    def per_group(group: torch.Tensor) -> torch.Tensor:
        top, top_idx = torch.topk(group, 2)
        value = top[0] - top[1]
        out = torch.zeros_like(group)
        out[top_idx[0]] = value / (group.std() + epsilon) if scale else value
        return out

    with torch.no_grad():
        adv = _per_group_outcome(token_level_rewards, response_mask, index, "grpo_passk", per_group)
    return adv, adv


def step_rewards_to_go(
    step_rewards: torch.Tensor, step_end_mask: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """Process supervision: the advantage of a token is the sum of the (normalised) rewards of the
    steps that end at or after it.

    Args:
        step_rewards: [B, L] reward of a step at its last token (other positions ignored).
        step_end_mask: [B, L] True at the last token of each step.
        response_mask: [B, L].
    Returns:
        [B, L] reverse cumulative sum of the step rewards, 0 on masked positions.
    """
    ends = step_end_mask.bool() & response_mask.bool()
    placed = torch.where(ends, step_rewards, torch.zeros((), dtype=step_rewards.dtype, device=step_rewards.device))
    to_go = placed.flip(-1).cumsum(-1).flip(-1)
    return torch.where(response_mask.bool(), to_go, torch.zeros((), dtype=to_go.dtype, device=to_go.device))


@register_adv_est(AdvantageEstimator.GRPO_PROCESS, needs_groups=True)
def compute_grpo_process_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    step_end_mask: torch.Tensor | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Process-supervision GRPO (DeepSeekMath): normalise all step rewards of a group with the
    group's mean and std, then the advantage of a token is the sum of the normalised rewards of the
    steps ending at or after it.

    Args:
        token_level_rewards: [B, L] step rewards placed on the last token of each step.
        step_end_mask: [B, L] marks the step ends (so a step reward of exactly 0 still counts); by
            default every valid position with a non-zero reward is a step end.
    Groups of one response get 0. Returns (advantages, advantages).
    """
    scale = _norm_by_std(norm_adv_by_std_in_grpo, config)
    with torch.no_grad():
        mask = response_mask.bool()
        if step_end_mask is None:
            ends = mask & (token_level_rewards != 0)
        else:
            ends = step_end_mask.bool() & mask
        ids, n_groups = _group_ids(index, token_level_rewards.shape[0], token_level_rewards.device, "grpo_process")
        zero = torch.zeros((), dtype=token_level_rewards.dtype, device=token_level_rewards.device)
        r = torch.where(ends, token_level_rewards, zero)
        e = ends.to(r.dtype)
        cnt = _group_sum(e.sum(-1), ids, n_groups)
        mean = _group_sum(r.sum(-1), ids, n_groups) / cnt.clamp(min=1)
        centred = torch.where(ends, r - mean[ids].unsqueeze(-1), zero)
        if scale:
            var = _group_sum(centred.square().sum(-1), ids, n_groups) / (cnt - 1).clamp(min=1)
            centred = centred / (var.sqrt()[ids].unsqueeze(-1) + epsilon)
        adv = step_rewards_to_go(centred, ends, response_mask)
        rows = _group_sum(torch.ones(ids.shape[0], dtype=r.dtype, device=r.device), ids, n_groups)
        adv = torch.where((rows[ids] > 1).unsqueeze(-1), adv, zero)
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO, needs_groups=True)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: `r_i - mean_{j != i} r_j` = `G/(G-1) * (r_i - mean_group)`; groups of one: 0."""
    with torch.no_grad():
        adv = _per_group_outcome(
            token_level_rewards, response_mask, index, "rloo", lambda g: g - (g.sum() - g) / (len(g) - 1)
        )
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED, needs_groups=True)
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same result as `rloo`, with scatter operations."""
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        ids, n_groups = _group_ids(index, scores.shape[0], scores.device, "rloo_vectorized")
        count = _group_sum(torch.ones_like(scores), ids, n_groups)[ids]
        total = _group_sum(scores, ids, n_groups)[ids]
        loo = scores - (total - scores) / (count - 1).clamp(min=1)
        out = torch.where(count > 1, loo, torch.zeros_like(loo))
        adv = _broadcast(out, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    gamma: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go of the token rewards (KL-shaped when KL is in the
    reward), `G_t = r_t + gamma * G_{t+1}` over valid tokens, whitened over the batch's valid
    tokens. Returns (advantages, returns)."""
    gamma = float(gamma if gamma is not None else config_get(config, "gamma", 1.0))
    with torch.no_grad():
        mask = response_mask.bool()
        zero = torch.zeros((), dtype=token_level_rewards.dtype, device=token_level_rewards.device)
        rewards = torch.where(mask, token_level_rewards, zero)
        returns = torch.zeros_like(rewards)
        running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
        for t in reversed(range(rewards.shape[1])):
            # masked positions consume no timestep: they neither add reward nor discount
            running = torch.where(mask[:, t], rewards[:, t] + gamma * running, running)
            returns[:, t] = running
        returns = torch.where(mask, returns, zero)
        advantages = torch.where(mask, verl_F.masked_whiten(returns, mask), zero)
    return advantages, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE, needs_groups=True)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with baseline: subtract the group mean of the outcome reward (groups of one
    response: 0), broadcast, then whiten over the batch's valid tokens."""
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        ids, n_groups = _group_ids(index, scores.shape[0], scores.device, "reinforce_plus_plus_baseline")
        count, mean = _group_count_mean(scores, ids, n_groups)
        centred = torch.where(count[ids] > 1, scores - mean[ids], torch.zeros_like(scores))
        adv = _whiten_valid(_broadcast(centred, response_mask), response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.REMAX, needs_greedy_baseline=True)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: return-to-go minus the reward of the greedy rollout of the same prompt.

    Args:
        reward_baselines: [B] greedy-rollout reward (produced by the trainer).
    Returns:
        advantages = returns - baseline on valid tokens, returns = reverse cumsum of rewards.
    """
    if reward_baselines is None:
        raise ValueError("remax needs `reward_baselines` (the greedy rollout reward per prompt)")
    with torch.no_grad():
        mask = response_mask.bool()
        zero = torch.zeros((), dtype=token_level_rewards.dtype, device=token_level_rewards.device)
        rewards = torch.where(mask, token_level_rewards, zero)
        returns = rewards.flip(-1).cumsum(-1).flip(-1)
        returns = torch.where(mask, returns, zero)
        advantages = torch.where(mask, returns - reward_baselines.to(rewards.dtype).unsqueeze(-1), zero)
    return advantages, returns


@register_adv_est(AdvantageEstimator.OPO, needs_groups=True)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: baseline weighted by response length, `b = sum(len_j r_j) / sum(len_j)` over the group;
    advantage `r - b`. Groups of one response: 0."""
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        lengths = response_mask.to(scores.dtype).sum(-1)
        ids, n_groups = _group_ids(index, scores.shape[0], scores.device, "opo")
        count = _group_sum(torch.ones_like(scores), ids, n_groups)
        baseline = _group_sum(lengths * scores, ids, n_groups) / _group_sum(lengths, ids, n_groups).clamp(min=1)
        out = torch.where(count[ids] > 1, scores - baseline[ids], torch.zeros_like(scores))
        adv = _broadcast(out, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.GPG, needs_groups=True)
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: `alpha * (r - mean_group) / f_norm` with `alpha = B / #(responses with r != 0)`
    (corrects for groups without signal). Groups of one response: 0. The `alpha` argument is
    accepted for upstream compatibility; the batch-derived value is used."""
    del alpha
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        ids, n_groups = _group_ids(index, scores.shape[0], scores.device, "gpg")
        alpha = scores.shape[0] / max(int(torch.count_nonzero(scores)), 1)
        count, mean = _group_count_mean(scores, ids, n_groups)
        out = torch.where(count[ids] > 1, alpha * (scores - mean[ids]) / f_norm, torch.zeros_like(scores))
        adv = _broadcast(out, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.GDPO)
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    non_tensor_batch: Mapping | None = None,
    batch: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (group reward-decoupled normalisation): each reward component is normalised within
    its group like GRPO, the normalised components are summed with weights, and the sum is
    whitened over the batch's valid tokens.

    Components: `algorithm.gdpo_reward_keys` names per-response values in `non_tensor_batch`
    (what the scoring function returned in its dict), weighted by `algorithm.gdpo_reward_weights`
    (default 1 each). Without `config`/`non_tensor_batch`/`batch` the single component is the
    outcome reward (then GDPO = GRPO followed by whitening). Groups of one response get 0 in each
    component (the GRPO rule). Returns (advantages, advantages), [B, L].
    """
    components: list[torch.Tensor] = []
    weights: list[float] | None = None
    if config is not None and non_tensor_batch is not None and batch is not None:
        keys = config_get(config, "gdpo_reward_keys", None)
        if not keys:
            raise ValueError(
                "GDPO requires algorithm.gdpo_reward_keys: the reward component keys returned by the scoring "
                "function (e.g. ['format_reward', 'accuracy_reward'])"
            )
        last = (response_mask.to(torch.long).sum(-1) - 1).clamp(min=0)
        rows = torch.arange(response_mask.shape[0], device=response_mask.device)
        for key in keys:
            if key not in non_tensor_batch:
                raise KeyError(
                    f"GDPO reward key {key!r} not found in non_tensor_batch; available: {sorted(non_tensor_batch)}. "
                    "Does the scoring function return a dict containing it?"
                )
            values = torch.as_tensor(np.asarray(non_tensor_batch[key], dtype=np.float32), device=response_mask.device)
            placed = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
            placed[rows, last] = values
            components.append(placed)
        raw_weights = config_get(config, "gdpo_reward_weights", None)
        if raw_weights is not None:
            weights = [float(w) for w in raw_weights]
            if len(weights) != len(components):
                raise ValueError(
                    f"algorithm.gdpo_reward_weights has {len(weights)} entries for {len(components)} gdpo_reward_keys"
                )
    if not components:
        components = [token_level_rewards]
    if weights is None:
        weights = [1.0] * len(components)
    with torch.no_grad():
        total = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
        for w, comp in zip(weights, components, strict=False):
            adv, _ = compute_grpo_outcome_advantage(
                comp,
                response_mask,
                index,
                epsilon=epsilon,
                norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
                config=config,
            )
            total = total + w * adv.to(total.dtype)
        adv = _whiten_valid(total, response_mask)
    return adv, adv


def compute_pf_ppo_reweight_data(data: Any, reweight_method: str = "pow", weight_pow: float = 2.0) -> Any:
    """PF-PPO: resample the batch (with replacement, same size) with weights from the outcome
    score `s = token_level_scores.sum(-1)`:

    - `pow`: `|s| ** weight_pow`
    - `max_min`: 1 for responses with the batch's max or min score, else 0
    - `max_random`: 0.4 for the max score, else 0.1

    (weights + 1e-8, so no row has probability 0 when all weights vanish). `data` is a DataProto
    (duck-typed: `batch`, `non_tensor_batch`, `meta_info`, `select_idxs`); meta_info lists with
    one entry per row are resampled too. Uses torch's global generator. Returns a new DataProto.
    """
    scores = data.batch["token_level_scores"].sum(dim=-1)
    if reweight_method == "pow":
        weights = torch.abs(scores).pow(weight_pow)
    elif reweight_method == "max_min":
        weights = ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)
    elif reweight_method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    else:
        raise ValueError(
            f"Unsupported reweight_method: {reweight_method}; expected one of ['pow', 'max_min', 'max_random'] "
            "(algorithm.pf_ppo.reweight_method)"
        )
    weights = torch.clamp(weights.float() + 1e-8, min=1e-8)
    n = scores.shape[0]
    idx = torch.multinomial(weights, n, replacement=True).cpu().numpy()
    out = data.select_idxs(idx)
    out.meta_info = {
        k: ([v[i] for i in idx] if isinstance(v, list) and len(v) == n else v) for k, v in dict(data.meta_info).items()
    }
    return out


@register_adv_est(AdvantageEstimator.NORM)
def compute_norm_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    reward_norm: Any = None,
    adv_norm: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalisation-driven outcome advantage (`algorithm.adv_estimator=norm`).

    r = outcome reward per response; `algorithm.reward_norm` (if set) normalises r, then
    `algorithm.adv_norm` (if set) normalises the result; both are `NormConfig`s applied per
    response (`normalize_by_config`), and the value is broadcast to the response's tokens. The
    presets (GRPO = adv_norm group/group, Dr.GRPO = group/null, RLOO = group/null + leave1out,
    LitePPO = group/batch) reproduce the named estimators. Returns (advantages, advantages).
    """
    reward_norm = reward_norm if reward_norm is not None else config_get(config, "reward_norm", None)
    adv_norm = adv_norm if adv_norm is not None else config_get(config, "adv_norm", None)
    if reward_norm is None and adv_norm is None:
        raise ValueError("algorithm.adv_estimator=norm needs algorithm.reward_norm and/or algorithm.adv_norm to be set")
    with torch.no_grad():
        x = _outcome_scores(token_level_rewards, response_mask)
        if reward_norm is not None:
            x = normalize_by_config(x, reward_norm, index=index)
        if adv_norm is not None:
            x = normalize_by_config(x, adv_norm, index=index)
        adv = _broadcast(x, response_mask)
    return adv, adv
