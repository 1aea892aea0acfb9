"""Rollout correction, part 2: rejection sampling (`compute_rollout_rejection_mask`,
`compute_rs_metrics`), the mismatch metrics, and the tensor-level entry points that combine
weights, rejection and metrics (`compute_rollout_correction_tensors`, and the actor's call
`compute_rollout_correction`). Pure torch; `verl.trainer.ppo.rollout_corr_helper` re-exports
these names and wraps the weights in a `DataProto` where upstream's signature returns one."""

from __future__ import annotations

import math
from typing import Any

import torch

import verl.utils.torch_functional as verl_F
from verl.trainer.ppo.algos.rollout_correction import (
    SAFETY_BOUND,
    _parse_rollout_rs_thresholds,
    _seq_max,
    _sum_over_ranks,
    binary_kl,
    compute_binary_kl_divergence,
    compute_rollout_correction_weights,
    parse_rollout_rs_options,
    token_kl_estimate,
    validate_rollout_correction_config,
)
from verl.utils.py_functional import config_get

# ---------------------------------------------------------------------------------------------
# rejection sampling
# ---------------------------------------------------------------------------------------------


def _rule_statistic(option, log_ratio, response_mask, old_log_prob, rollout_log_prob):
    """(per-token statistic [B, L], per-sequence statistic [B] or None, level) of a rule; ratio
    rules are in log-ratio units, k1 rules in k1 units."""
    if option in ("binary_kl", "kpop"):
        if old_log_prob is None or rollout_log_prob is None:
            raise ValueError(f"rollout_rs option '{option}' requires both old_log_prob and rollout_log_prob.")
        fn = compute_binary_kl_divergence if option == "binary_kl" else binary_kl
        stat = torch.maximum(fn(old_log_prob, rollout_log_prob), fn(rollout_log_prob, old_log_prob))
        if option == "kpop":
            stat = torch.nan_to_num(stat, nan=float("inf"))
        return stat, None, "token"
    if option in ("token", "icepop"):
        return torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND), None, "token"
    if option in ("sequence", "geometric"):
        seq = verl_F.masked_sum(log_ratio, response_mask, axis=-1)
        if option == "geometric":
            seq = seq / response_mask.sum(-1).clamp(min=1).to(seq.dtype)
        return seq.unsqueeze(-1).expand_as(log_ratio), seq, "sequence"
    level, kind = option.rsplit("_", 1)
    token = token_kl_estimate(log_ratio, kind)
    if level == "token":
        return token, None, "token"
    if level == "seq_sum":
        seq = verl_F.masked_sum(token, response_mask, axis=-1)
    elif level == "seq_mean":
        seq = verl_F.masked_mean(token, response_mask, axis=-1)
    else:
        seq = _seq_max(token, response_mask)
    return seq.unsqueeze(-1).expand_as(log_ratio), seq, "sequence"


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: str | float | None = None,
    old_log_prob: torch.Tensor | None = None,
    rollout_log_prob: torch.Tensor | None = None,
    rollout_rs_threshold_lower: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Rejection (hard trust region) mask by one or several comma-separated rules; a token stays
    only if every rule keeps it.

    Rules (upstream): `token_k{1,2,3}`, `seq_sum_k{1,2,3}`, `seq_mean_k{1,2,3}`, `seq_max_k{2,3}`
    (k-estimates of KL(rollout || learner) per token / summed / averaged / maxed per sequence) and
    `binary_kl` (KPop with upstream's clamped Bernoulli KL; needs both log-probs). Ours: `kpop`
    (exact Bernoulli KL, default bound 2), `token` / `sequence` / `geometric` (bounds on the token
    ratio, the product ratio, the geometric-mean ratio; default [1/2, 2]) and `icepop` (token ratio,
    default [0.5, 5]).

    Thresholds (`rollout_rs_threshold`, one entry shared or one per rule, comma-separated):
    for `*_k1` and the ratio rules an entry `t` keeps ratios in [1/t, t] (k1 in [-log t, log t]),
    an entry `"l_u"` keeps k1 in [log l, log u] (ratio rules: ratio in [l, u]); the other rules
    take a single upper bound. `rollout_rs_threshold_lower` (ours) is the lower bound of entries
    that give none.

    Args: log_ratio, response_mask [B, L]; old_log_prob, rollout_log_prob [B, L] (binary KL rules).
    Returns:
        (mask [B, L] in response_mask's dtype, 0 where rejected; metrics without prefix:
        per rule `rollout_rs_{rule}_*` (`compute_rs_metrics`), `rollout_rs_{rule}_masked_fraction`,
        `rollout_rs_{rule}_seq_masked_fraction`; overall `rollout_rs_masked_fraction` (share of
        valid tokens rejected), `rollout_rs_seq_masked_fraction` (share of rows with a rejected
        token), and ours `rs_masked_seq_frac` (share of non-empty rows that lost every token)).
    """
    options = parse_rollout_rs_options(rollout_rs)
    bounds = _parse_rollout_rs_thresholds(options, rollout_rs_threshold, rollout_rs_threshold_lower)
    if log_ratio.shape[0] == 0:
        return response_mask, {}
    log_ratio = log_ratio.detach()
    valid = response_mask.bool()
    seq_valid = valid.any(-1)
    keep_all = torch.ones_like(valid)
    metrics: dict[str, float] = {}
    for option in options:
        lower, upper = bounds[option]
        stat, seq_stat, level = _rule_statistic(option, log_ratio, response_mask, old_log_prob, rollout_log_prob)
        if lower is not None:
            lo, hi = math.log(lower), math.log(upper)
            keep = (stat >= lo) & (stat <= hi)
        else:
            lo, hi = 0.0, upper
            keep = stat <= hi
        metrics.update(
            compute_rs_metrics(
                option,
                stat,
                response_mask,
                seq_valid,
                level=level,
                per_sequence_values=seq_stat,
                rollout_rs_threshold=hi,
                rollout_rs_threshold_lower=lo,
                apply_lower_threshold=lower is not None,
            )
        )
        keep_all = keep_all & keep
        metrics[f"rollout_rs_{option}_masked_fraction"] = verl_F.masked_mean((~keep).float(), response_mask).item()
        seq_kept = ~((~keep) & valid).any(-1)
        n_seq = int(seq_valid.sum())
        metrics[f"rollout_rs_{option}_seq_masked_fraction"] = (
            float(((~seq_kept) & seq_valid).sum()) / n_seq if n_seq else 0.0
        )
    final = keep_all & valid
    metrics["rollout_rs_masked_fraction"] = verl_F.masked_mean((~keep_all).float(), response_mask).item()
    metrics["rollout_rs_seq_masked_fraction"] = (valid & ~keep_all).any(-1).float().mean().item()
    n_seq = int(seq_valid.sum())
    metrics["rs_masked_seq_frac"] = float((seq_valid & ~final.any(-1)).sum()) / n_seq if n_seq else 0.0
    return (response_mask * keep_all.to(response_mask.dtype)).to(response_mask.dtype), metrics


def compute_rs_metrics(
    option_name: str,
    rs_statistic: torch.Tensor,
    response_mask: torch.Tensor,
    seq_valid_mask: torch.Tensor,
    *,
    level: str,
    per_sequence_values: torch.Tensor | None,
    rollout_rs_threshold: float,
    rollout_rs_threshold_lower: float,
    apply_lower_threshold: bool,
) -> dict[str, float]:
    """Statistics of one rejection rule (upstream's definitions, no prefix), `p = rollout_rs_{rule}`:
    `p_mean` (masked token mean of the statistic), `p_max/min` (over sequences for sequence rules,
    else over valid tokens), `p_fraction_high/low` (share beyond the bounds; low only with a lower
    bound), `p_std` (of the statistic clamped to the bounds), `p_seq_mean/std/max/min`,
    `p_seq_max_deviation` (largest |seq value|), `p_seq_fraction_high` (and `_low` with a lower
    bound). Sequence values: `per_sequence_values` or the per-sequence mean of the statistic.
    """
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    p = f"rollout_rs_{option_name}"
    valid = response_mask.bool()
    seq = (
        per_sequence_values
        if per_sequence_values is not None
        else verl_F.masked_mean(rs_statistic, response_mask, axis=-1)
    )
    seq = seq.reshape(-1)[seq_valid_mask]
    m: dict[str, float] = {f"{p}_mean": verl_F.masked_mean(rs_statistic, response_mask).item()}
    per_seq = level == "sequence" and seq.numel() > 0
    if per_seq:
        m[f"{p}_max"], m[f"{p}_min"] = seq.max().item(), seq.min().item()
        m[f"{p}_fraction_high"] = (seq > rollout_rs_threshold).float().mean().item()
        m[f"{p}_fraction_low"] = (
            (seq < rollout_rs_threshold_lower).float().mean().item() if apply_lower_threshold else 0.0
        )
    else:
        m[f"{p}_max"] = rs_statistic.masked_fill(~valid, -float("inf")).max().item()
        m[f"{p}_min"] = rs_statistic.masked_fill(~valid, float("inf")).min().item()
        m[f"{p}_fraction_high"] = verl_F.masked_mean(
            (rs_statistic > rollout_rs_threshold).float(), response_mask
        ).item()
        m[f"{p}_fraction_low"] = (
            verl_F.masked_mean((rs_statistic < rollout_rs_threshold_lower).float(), response_mask).item()
            if apply_lower_threshold
            else 0.0
        )
    if response_mask.sum() > 1:
        clamped = rs_statistic.clamp(
            min=rollout_rs_threshold_lower if apply_lower_threshold else 0.0, max=rollout_rs_threshold
        )
        mean_c = verl_F.masked_mean(clamped, response_mask)
        var = verl_F.masked_mean(clamped.square(), response_mask) - mean_c.square()
        m[f"{p}_std"] = torch.sqrt(torch.clamp(var, min=0.0)).item()
    else:
        m[f"{p}_std"] = 0.0
    if seq.numel() > 0:
        m[f"{p}_seq_mean"] = seq.mean().item()
        m[f"{p}_seq_std"] = seq.std().item() if seq.numel() > 1 else 0.0
        m[f"{p}_seq_max"] = seq.max().item()
        m[f"{p}_seq_min"] = seq.min().item()
        m[f"{p}_seq_max_deviation"] = seq.abs().max().item()
        m[f"{p}_seq_fraction_high"] = (seq > rollout_rs_threshold).float().mean().item()
        if apply_lower_threshold:
            m[f"{p}_seq_fraction_low"] = (seq < rollout_rs_threshold_lower).float().mean().item()
    else:
        for key in (
            "seq_mean",
            "seq_std",
            "seq_max",
            "seq_min",
            "seq_max_deviation",
            "seq_fraction_high",
            "seq_fraction_low",
        ):
            m[f"{p}_{key}"] = 0.0
    return m


# ---------------------------------------------------------------------------------------------
# off-policy metrics
# ---------------------------------------------------------------------------------------------


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None, response_mask: torch.Tensor
) -> dict[str, float]:
    """Mismatch diagnostics (upstream's names and definitions, no prefix), [B, L] inputs. Token
    statistics are over the valid tokens; per-row statistics are over the rows with at least one
    valid token (all-masked padding rows are ignored):

    - `training_ppl` / `training_log_ppl`: mean over rows of exp(-mean_t old_log_prob) / of
      -mean_t old_log_prob;
    and with `rollout_log_prob`:
    - `kl`: masked mean of rollout_log_prob - old_log_prob (k1 of KL(rollout || learner));
    - `k3_kl`: masked mean of exp(lr) - lr - 1, lr = old - rollout;
    - `rollout_ppl` / `rollout_log_ppl`: as training, of the rollout log-probs;
    - `log_ppl_diff` (mean, `_max`, `_min`) and `log_ppl_abs_diff`: of the per-row
      mean_t rollout - mean_t old = log(training_ppl_i / rollout_ppl_i);
    - `ppl_ratio`: mean over rows of training_ppl_i / rollout_ppl_i;
    - `chi2_token`: masked mean of rho^2 - 1, rho = exp(lr clamped to +-20);
    - `chi2_seq`: mean over rows of exp(2 * clamp(sum_t lr, +-20)) - 1.
    AssertionError when no token is valid (upstream's contract).
    """
    assert response_mask.bool().any(), "Expected at least one valid token in response_mask"
    rows = response_mask.bool().any(-1)
    old = old_log_prob.detach()
    m: dict[str, float] = {}
    mean_old = verl_F.masked_mean(old, response_mask, axis=-1)[rows]
    m["training_ppl"] = torch.exp(-mean_old).mean().item()
    m["training_log_ppl"] = (-mean_old).mean().item()
    if rollout_log_prob is None:
        return m
    roll = rollout_log_prob.detach()
    lr = old - roll
    m["kl"] = verl_F.masked_mean(roll - old, response_mask).item()
    m["k3_kl"] = verl_F.masked_mean(torch.exp(lr) - lr - 1, response_mask).item()
    mean_roll = verl_F.masked_mean(roll, response_mask, axis=-1)[rows]
    m["rollout_ppl"] = torch.exp(-mean_roll).mean().item()
    m["rollout_log_ppl"] = (-mean_roll).mean().item()
    diff = mean_roll - mean_old
    m["log_ppl_diff"] = diff.mean().item()
    m["log_ppl_abs_diff"] = diff.abs().mean().item()
    m["log_ppl_diff_max"] = diff.max().item()
    m["log_ppl_diff_min"] = diff.min().item()
    m["ppl_ratio"] = torch.exp(diff).mean().item()
    rho = torch.exp(torch.clamp(lr, -SAFETY_BOUND, SAFETY_BOUND))
    m["chi2_token"] = (verl_F.masked_mean(rho.square(), response_mask) - 1.0).item()
    seq_lr = torch.clamp(verl_F.masked_sum(lr, response_mask, axis=-1)[rows], -SAFETY_BOUND, SAFETY_BOUND)
    m["chi2_seq"] = (torch.exp(2.0 * seq_lr).mean() - 1.0).item()
    return m


def compute_mismatch_metrics(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    prefix: str = "rollout_mismatch/",
) -> dict[str, float]:
    """Our own mismatch summary (the worker's `compute_log_prob` reports it as `rollout_mismatch/*`
    whenever rollout log-probs are present, with or without rollout correction), python floats:

    - `kl_k1`, `kl_k3`: token means of the k1 / k3 estimates of KL(pi_rollout || pi_learner)
    - `ppl_learner`, `ppl_rollout`: mean over non-empty sequences of exp(-mean token log-prob)
    - `ppl_ratio`: mean over non-empty sequences of ppl_learner / ppl_rollout
    - `log_ratio_abs_max`: largest |log(pi_learner / pi_rollout)|
    (`rollout_corr/*` carries upstream's names: `compute_offpolicy_metrics`.)
    """
    mask = response_mask.bool()
    old = old_log_prob.detach().float()
    roll = rollout_log_prob.detach().float()
    log_ratio = old - roll
    seq_ok = mask.any(-1)
    n_seq = seq_ok.sum().clamp(min=1)
    seq_mean_old = verl_F.masked_mean(old, mask, axis=-1)
    seq_mean_roll = verl_F.masked_mean(roll, mask, axis=-1)

    def seq_avg(x: torch.Tensor) -> torch.Tensor:
        return torch.where(seq_ok, x, torch.zeros_like(x)).sum() / n_seq

    abs_max = (
        torch.where(mask, log_ratio.abs(), torch.zeros_like(log_ratio)).max() if log_ratio.numel() else torch.zeros(())
    )
    out = {
        "kl_k1": verl_F.masked_mean(token_kl_estimate(log_ratio, "k1"), mask),
        "kl_k3": verl_F.masked_mean(token_kl_estimate(log_ratio, "k3"), mask),
        "ppl_learner": seq_avg(torch.exp(-seq_mean_old)),
        "ppl_rollout": seq_avg(torch.exp(-seq_mean_roll)),
        "ppl_ratio": seq_avg(torch.exp(seq_mean_roll - seq_mean_old)),
        "log_ratio_abs_max": abs_max,
    }
    return {prefix + k: float(v) for k, v in out.items()}


def compute_rollout_corr_metrics_from_logprobs(
    log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """`compute_offpolicy_metrics` of the *current* policy's log-probs against the rollout's,
    under `rollout_corr/` (the actor reports them during the update)."""
    out = compute_offpolicy_metrics(log_prob, rollout_log_prob, response_mask)
    return {f"rollout_corr/{k}": float(v) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------
# tensor-level entry points
# ---------------------------------------------------------------------------------------------


def compute_rollout_correction_tensors(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
    rollout_rs_threshold_lower: float | None = None,
):
    """IS weights, rejection mask and off-policy metrics of one batch: upstream's
    `compute_rollout_correction_and_rejection_mask` with the weights as a plain tensor.

    Args ([B, L]): old_log_prob (learner), rollout_log_prob (inference engine), response_mask.
        rollout_is / rollout_is_threshold / rollout_is_batch_normalize: see
        `compute_rollout_correction_weights` (None level or None threshold: no weights).
        rollout_rs / rollout_rs_threshold (/ ours rollout_rs_threshold_lower): see
        `compute_rollout_rejection_mask` (None: no rejection).
    Returns:
        (`rollout_is_weights` [B, L] detached or None, the mask after rejection [B, L],
        metrics under `rollout_corr/`). The weights are computed on the unrejected mask; rejected
        tokens drop out through the mask.
    """
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    if old_log_prob.shape != rollout_log_prob.shape:
        raise ValueError(
            f"old_log_prob shape {tuple(old_log_prob.shape)} does not match rollout_log_prob shape "
            f"{tuple(rollout_log_prob.shape)}."
        )
    if old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"log_prob shape {tuple(old_log_prob.shape)} does not match response_mask shape "
            f"{tuple(response_mask.shape)}."
        )
    log_ratio = (old_log_prob - rollout_log_prob).detach()
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    new_mask = response_mask.clone()
    if rollout_rs is not None:
        new_mask, rs_metrics = compute_rollout_rejection_mask(
            log_ratio,
            response_mask,
            rollout_rs,
            rollout_rs_threshold,
            old_log_prob=old_log_prob.detach(),
            rollout_log_prob=rollout_log_prob.detach(),
            rollout_rs_threshold_lower=rollout_rs_threshold_lower,
        )
        metrics.update(rs_metrics)
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    lr = log_ratio.float()
    metrics["log_ratio_abs_max"] = torch.where(response_mask.bool(), lr.abs(), torch.zeros_like(lr)).max().item()
    prefixed = {f"rollout_corr/{k}": float(v) for k, v in metrics.items()}
    return weights, new_mask, prefixed


def _rc_kwargs(config: Any) -> dict[str, Any]:
    return {
        "rollout_is": config_get(config, "rollout_is", None),
        "rollout_is_threshold": config_get(config, "rollout_is_threshold", 2.0),
        "rollout_is_batch_normalize": bool(config_get(config, "rollout_is_batch_normalize", False)),
        "rollout_rs": config_get(config, "rollout_rs", None),
        "rollout_rs_threshold": config_get(config, "rollout_rs_threshold", None),
        "rollout_rs_threshold_lower": config_get(config, "rollout_rs_threshold_lower", None),
    }


def compute_rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_corr_config: Any,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """The actor's call: `compute_rollout_correction_tensors` with the keys of
    `algorithm.rollout_correction` (dataclass or dict), returning the weights tensor directly.

    Returns (rollout_is_weights [B, L] detached or None, mask after rejection [B, L] in
    response_mask's dtype, metrics under `rollout_corr/`). With no valid token at all the mask is
    returned unchanged with no weights rejected ({} metrics) instead of an error.
    """
    validate_rollout_correction_config(rollout_corr_config)
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            "compute_rollout_correction: old_log_prob, rollout_log_prob and response_mask must share a shape; got "
            f"{tuple(old_log_prob.shape)}, {tuple(rollout_log_prob.shape)}, {tuple(response_mask.shape)}"
        )
    kwargs = _rc_kwargs(rollout_corr_config)
    if not response_mask.bool().any():
        if kwargs["rollout_is"] is not None and kwargs["rollout_is_batch_normalize"]:
            _sum_over_ranks(torch.zeros(2, dtype=torch.float64))  # the other ranks normalise: take part
        weights = torch.zeros_like(old_log_prob, dtype=torch.float32) if kwargs["rollout_is"] is not None else None
        return weights, response_mask, {}
    weights, new_mask, metrics = compute_rollout_correction_tensors(
        old_log_prob, rollout_log_prob, response_mask, **kwargs
    )
    return weights, new_mask.to(response_mask.dtype), metrics
