"""Optimal token baseline estimators (`optimal_token_baseline`, `tir_optimal_token_baseline`): one
baseline per group and position, weighted by the score-norm proxy built from `old_log_probs` and
`sum_pi_squared` [B, L]. Re-exported by `core_algos`."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.trainer.ppo.algos.normalization import _group_members
from verl.trainer.ppo.algos.registry import AdvantageEstimator, register_adv_est


def _otb_inputs(token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights, who):
    if old_log_probs is None or sum_pi_squared is None:
        raise ValueError(
            f"{who} needs `old_log_probs` and `sum_pi_squared` ([B, L], sum over the vocabulary of pi^2 per "
            "token) in the batch; the actor must compute sum_pi_squared (actor.calculate_sum_pi_squared=True)"
        )
    mask = response_mask.to(token_level_rewards.dtype)
    returns = (token_level_rewards * mask).flip(-1).cumsum(-1).flip(-1)
    # per-token score-norm proxy ||s_t||^2 = 1 - 2 pi_t + sum_v pi_v^2, accumulated along the path
    w = 1.0 - 2.0 * torch.exp(old_log_probs.to(mask.dtype)) + sum_pi_squared.to(mask.dtype)
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.to(mask.dtype).square()
    w_cum = (w * mask).cumsum(-1)
    return mask, returns, w_cum


def _zero_unique_tail(baselines: torch.Tensor, rows: list[int], lengths: torch.Tensor) -> None:
    """Where one trajectory of a group is strictly the longest, its baseline beyond the
    second-longest length is 0 (no other trajectory informs those positions)."""
    ordered = torch.sort(lengths).values
    longest, second = int(ordered[-1]), int(ordered[-2])
    at_max = (lengths == longest).nonzero(as_tuple=True)[0]
    if at_max.numel() == 1 and longest > second:
        baselines[rows[int(at_max[0])], second:] = 0.0


def _group_baselines(
    groups: list[list[int]],
    mask: torch.Tensor,
    returns: torch.Tensor,
    w_cum: torch.Tensor,
    lengths: torch.Tensor,
    epsilon: float,
    handle_zero_tail: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group and position `B_t = sum_i G_it W_it / (sum_i W_it + eps)` over aligned [B, T]
    `mask`, `returns` G and `w_cum` W: (baselines [B, T], keep [B] = row in a group of two or more)."""
    baselines = torch.zeros_like(returns)
    keep = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    for rows in groups:
        if len(rows) < 2:
            continue
        idx = torch.tensor(rows, device=mask.device)
        m, g, w = mask[idx], returns[idx], w_cum[idx]
        b = (g * w * m).sum(0) / ((w * m).sum(0) + epsilon)
        baselines[idx] = b.to(baselines.dtype).unsqueeze(0).expand(len(rows), -1)
        keep[idx] = True
        if handle_zero_tail:
            _zero_unique_tail(baselines, rows, lengths[idx])
    return baselines, keep


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE, needs_old_log_probs=True)
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal token baseline (OTB): one baseline per position t and group,
    `B_t = sum_i G_it W_it / (sum_i W_it + eps)`, with G the reward-to-go and
    `W_it = sum_{j<=t} (1 - 2 pi_ij + sum_pi_squared_ij)` (times the squared rollout IS weight
    when given) over valid tokens; advantage `G - B` on valid tokens. With `handle_zero_tail`, a
    group's unique longest trajectory gets baseline 0 beyond the second-longest length. Positions
    are compared by column (padded index). Groups of one response: 0 (our singleton rule;
    upstream keeps the raw return). Returns (advantages, returns), [B, L].
    """
    with torch.no_grad():
        mask, returns, w_cum = _otb_inputs(
            token_level_rewards,
            response_mask,
            old_log_probs,
            sum_pi_squared,
            rollout_is_weights,
            "optimal_token_baseline",
        )
        groups = _group_members(index, mask.shape[0], mask.device, "optimal_token_baseline")
        baselines, keep = _group_baselines(groups, mask, returns, w_cum, mask.sum(-1), epsilon, handle_zero_tail)
        adv = (returns - baselines) * mask * keep.unsqueeze(-1).to(mask.dtype)
    return adv, returns


@register_adv_est(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE, needs_old_log_probs=True)
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB for multi-turn / tool-interleaved responses: like `optimal_token_baseline`, but the
    positions compared across a group are the k-th *valid* token of each trajectory (tool-output
    gaps in the mask are skipped), not the padded column. Responses without valid tokens are
    left out of their group. Groups of one response: 0. Returns (advantages, returns), [B, L].
    """
    with torch.no_grad():
        mask, returns, w_cum = _otb_inputs(
            token_level_rewards,
            response_mask,
            old_log_probs,
            sum_pi_squared,
            rollout_is_weights,
            "tir_optimal_token_baseline",
        )
        valid = response_mask.bool()
        lengths = valid.sum(-1)
        width = int(lengths.max()) if lengths.numel() else 0
        packed_w = torch.zeros((mask.shape[0], width), dtype=mask.dtype, device=mask.device)
        packed_g = torch.zeros_like(packed_w)
        for i in range(mask.shape[0]):
            n = int(lengths[i])
            packed_w[i, :n] = w_cum[i, valid[i]]
            packed_g[i, :n] = returns[i, valid[i]]
        packed_m = (torch.arange(width, device=mask.device).unsqueeze(0) < lengths.unsqueeze(-1)).to(mask.dtype)
        groups = _group_members(index, mask.shape[0], mask.device, "tir_optimal_token_baseline", include=lengths > 0)
        baselines, keep = _group_baselines(groups, packed_m, packed_g, packed_w, lengths, epsilon, handle_zero_tail)
        packed_adv = (packed_g - baselines) * packed_m
        adv = torch.zeros_like(returns)
        for i in range(mask.shape[0]):
            n = int(lengths[i])
            if n > 0 and bool(keep[i]):
                adv[i, valid[i]] = packed_adv[i, :n]
    return adv, returns
