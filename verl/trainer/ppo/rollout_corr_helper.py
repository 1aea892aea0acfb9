"""Correction for the mismatch between the rollout (behaviour) policy and the learner's policy.

The inference engine samples with its own numerics (other kernels, precision, possibly stale
weights), so its log-probabilities `rollout_log_prob` differ from the learner's recomputation
`old_log_prob` of the same tokens. This module turns the two into

- truncated importance-sampling (TIS) weights that multiply the per-token policy loss, and/or
- a rejection mask that drops tokens (or whole sequences) whose mismatch is too large
  (ratio bounds, IcePop, KPop, k1/k2/k3 thresholds),

plus metrics that measure the mismatch. Everything here is pure torch on [B, L] tensors; it only
changes weights and the loss mask, so it composes with every policy loss.

Entry point for the actor: `compute_rollout_correction(old_log_prob, rollout_log_prob,
response_mask, rollout_corr_config)`. It depends only on the batch data, so the actor can call it
once per mini-batch before splitting into micro-batches, then use the returned mask for every loss
term and for the global aggregation stats (`core_algos.compute_batch_loss_stats`).

Notation: log_ratio = old_log_prob - rollout_log_prob = log(pi_learner / pi_rollout).
"""

from __future__ import annotations

import re
from typing import Any

import torch

import verl.utils.torch_functional as verl_F
from verl.utils.py_functional import config_get

__all__ = [
    "ROLLOUT_IS_LEVELS",
    "ROLLOUT_RS_MODES",
    "compute_rollout_correction",
    "compute_rollout_is_weights",
    "compute_rollout_rejection_mask",
    "compute_mismatch_metrics",
    "icepop_mask",
    "kpop_mask",
    "binary_kl",
    "token_kl_estimate",
    "validate_rollout_correction_config",
]

ROLLOUT_IS_LEVELS = (None, "token", "sequence")
_RATIO_MODES = ("token", "sequence", "geometric", "icepop")
_K_PATTERN = re.compile(r"^(token|seq_mean|seq_sum|seq_max)_(k1|k2|k3)$")
ROLLOUT_RS_MODES = (
    (None,)
    + _RATIO_MODES
    + ("kpop",)
    + tuple(f"{level}_{k}" for level in ("token", "seq_mean", "seq_sum", "seq_max") for k in ("k1", "k2", "k3"))
)

# log-space clamp before exponentiating a ratio (exp(10) ~ 2.2e4 is already far beyond any threshold)
_LOG_CLAMP = 10.0
_ICEPOP_DEFAULTS = (0.5, 5.0)
_KPOP_DEFAULT_UPPER = 2.0
_RATIO_DEFAULT_UPPER = 2.0


def validate_rollout_correction_config(config: Any) -> None:
    """Raise ValueError naming `algorithm.rollout_correction.<key>` for a bad mode or threshold.
    Meant to be called when the config is loaded (before any worker starts)."""
    owner = "algorithm.rollout_correction"
    is_level = config_get(config, "rollout_is")
    if is_level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"{owner}.rollout_is={is_level!r} is not allowed; expected one of {list(ROLLOUT_IS_LEVELS)}")
    threshold = config_get(config, "rollout_is_threshold", 2.0)
    if not float(threshold) > 0:
        raise ValueError(f"{owner}.rollout_is_threshold={threshold!r} must be > 0")
    mode = config_get(config, "rollout_rs")
    if mode not in ROLLOUT_RS_MODES:
        raise ValueError(f"{owner}.rollout_rs={mode!r} is not allowed; expected one of {list(ROLLOUT_RS_MODES)}")
    upper = config_get(config, "rollout_rs_threshold")
    lower = config_get(config, "rollout_rs_threshold_lower")
    if mode is not None and _K_PATTERN.match(mode) and upper is None:
        raise ValueError(f"{owner}.rollout_rs={mode!r} needs {owner}.rollout_rs_threshold (the largest accepted value)")
    if mode in _RATIO_MODES:
        if upper is not None and not float(upper) > 0:
            raise ValueError(f"{owner}.rollout_rs_threshold={upper!r} must be > 0 for ratio bounds")
        if lower is not None and upper is not None and not 0 <= float(lower) < float(upper):
            raise ValueError(f"{owner}.rollout_rs_threshold_lower={lower!r} must be in [0, rollout_rs_threshold={upper})")
    if mode == "kpop" and upper is not None and not float(upper) > 0:
        raise ValueError(f"{owner}.rollout_rs_threshold={upper!r} must be > 0 for kpop")


# ---------------------------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------------------------


def token_kl_estimate(log_ratio: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi_rollout || pi_learner) from samples of the rollout policy, with
    `log_ratio = log(pi_learner / pi_rollout)`: k1 = -log_ratio (can be negative), k2 =
    log_ratio^2 / 2, k3 = exp(log_ratio) - 1 - log_ratio (>= 0)."""
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        lr = torch.clamp(log_ratio, min=-20.0, max=20.0)
        return torch.exp(lr) - 1.0 - lr
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of ['k1', 'k2', 'k3']")


def binary_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(Bernoulli(p) || Bernoulli(q)) = p log(p/q) + (1-p) log((1-p)/(1-q)) from log-probs.

    Stable at p, q -> 1 (uses expm1) and exact at p = 1 (the (1-p) term is 0). If q = 1 while
    p < 1 the divergence is +inf.
    """
    p = log_p.exp()
    one_minus_p = -torch.expm1(log_p)
    one_minus_q = -torch.expm1(log_q)
    first = p * (log_p - log_q)
    second = torch.special.xlogy(one_minus_p, one_minus_p) - torch.special.xlogy(one_minus_p, one_minus_q)
    return first + second


def icepop_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    lower: float = _ICEPOP_DEFAULTS[0],
    upper: float = _ICEPOP_DEFAULTS[1],
) -> torch.Tensor:
    """IcePop: keep a valid token only if `lower <= pi_learner / pi_rollout <= upper`. [B, L] bool."""
    ratio = torch.exp(torch.clamp(old_log_prob - rollout_log_prob, -_LOG_CLAMP, _LOG_CLAMP))
    return response_mask.bool() & (ratio >= lower) & (ratio <= upper)


def kpop_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    upper: float = _KPOP_DEFAULT_UPPER,
) -> torch.Tensor:
    """KPop: each token probability is a Bernoulli parameter; drop tokens with
    `max(KL(p_learner || p_rollout), KL(p_rollout || p_learner)) > upper`. [B, L] bool keep-mask."""
    fwd = binary_kl(old_log_prob, rollout_log_prob)
    rev = binary_kl(rollout_log_prob, old_log_prob)
    div = torch.maximum(fwd, rev)
    return response_mask.bool() & ~(div > upper) & ~torch.isnan(div)


def compute_rollout_is_weights(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, level: str, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated IS weights `min(exp(clamp(log_ratio, -10, 10)), threshold)`, detached.

    level `token`: one weight per token; `sequence`: the weight of the whole sequence
    (exp of the summed log-ratio) on each of its tokens. Returns ([B, L] weights (0 on masked
    positions), [B, L] bool: where the weight was truncated).
    """
    mask = response_mask.bool()
    log_ratio = log_ratio.detach()
    if level == "token":
        lr = log_ratio
    elif level == "sequence":
        lr = verl_F.masked_sum(log_ratio, mask, axis=-1).unsqueeze(-1).expand_as(log_ratio)
    else:
        raise ValueError(f"rollout_is={level!r}; expected one of ['token', 'sequence']")
    raw = torch.exp(torch.clamp(lr, -_LOG_CLAMP, _LOG_CLAMP))
    weights = torch.clamp(raw, max=float(threshold))
    zero = torch.zeros((), dtype=weights.dtype, device=weights.device)
    return torch.where(mask, weights, zero), mask & (raw > threshold)


def compute_rollout_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str,
    upper: float | None = None,
    lower: float | None = None,
) -> torch.Tensor:
    """Keep-mask [B, L] (bool) after rejection sampling by `mode` (see `ROLLOUT_RS_MODES`).

    - `token`: keep tokens with ratio in [lower, upper] (defaults upper 2.0, lower 1/upper).
    - `sequence`: drop the whole sequence if its ratio exp(sum log_ratio) is outside the bounds.
    - `geometric`: same with the geometric mean ratio exp(mean log_ratio).
    - `icepop`: token ratio bounds with defaults [0.5, 5.0].
    - `kpop`: binary-KL token masking with default upper 2.0 (lower unused).
    - `token_kX`: drop tokens whose kX estimate is > upper (or < lower when given; for k1 the
      default lower is -upper). `seq_mean_kX` / `seq_sum_kX` / `seq_max_kX`: drop whole sequences by
      the mean / sum / max of the token estimates, same bounds.
    """
    mask = response_mask.bool()
    log_ratio = (old_log_prob - rollout_log_prob).detach()
    if mode == "icepop":
        lo = _ICEPOP_DEFAULTS[0] if lower is None else float(lower)
        hi = _ICEPOP_DEFAULTS[1] if upper is None else float(upper)
        return icepop_mask(old_log_prob.detach(), rollout_log_prob.detach(), mask, lo, hi)
    if mode == "kpop":
        hi = _KPOP_DEFAULT_UPPER if upper is None else float(upper)
        return kpop_mask(old_log_prob.detach(), rollout_log_prob.detach(), mask, hi)
    if mode in ("token", "sequence", "geometric"):
        hi = _RATIO_DEFAULT_UPPER if upper is None else float(upper)
        lo = 1.0 / hi if lower is None else float(lower)
        if mode == "token":
            lr = log_ratio
        else:
            total = verl_F.masked_sum(log_ratio, mask, axis=-1)
            if mode == "geometric":
                total = total / mask.sum(-1).clamp(min=1)
            lr = total.unsqueeze(-1).expand_as(log_ratio)
        ratio = torch.exp(torch.clamp(lr, -_LOG_CLAMP * 10, _LOG_CLAMP * 10))
        return mask & (ratio >= lo) & (ratio <= hi)
    match = _K_PATTERN.match(mode or "")
    if match is None:
        raise ValueError(f"rollout_rs={mode!r} is not allowed; expected one of {list(ROLLOUT_RS_MODES)}")
    if upper is None:
        raise ValueError(f"rollout_rs={mode!r} needs rollout_rs_threshold")
    level, kind = match.groups()
    hi = float(upper)
    lo = (-hi if kind == "k1" else None) if lower is None else float(lower)
    est = token_kl_estimate(log_ratio, kind)
    if level == "token":
        value = est
    else:
        if level == "seq_max":
            neg_inf = torch.full((), -float("inf"), dtype=est.dtype, device=est.device)
            stat = torch.where(mask, est, neg_inf).amax(dim=-1)
            stat = torch.where(mask.any(-1), stat, torch.zeros_like(stat))
        elif level == "seq_sum":
            stat = verl_F.masked_sum(est, mask, axis=-1)
        else:
            stat = verl_F.masked_mean(est, mask, axis=-1)
        value = stat.unsqueeze(-1).expand_as(est)
    keep = value <= hi
    if lo is not None:
        keep = keep & (value >= lo)
    return mask & keep


def compute_mismatch_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor, prefix: str = "rollout_corr/"
) -> dict[str, float]:
    """Mismatch between learner and rollout over the valid tokens (python floats):

    - `kl_k1`, `kl_k3`: token means of the k1 / k3 estimates of KL(pi_rollout || pi_learner)
    - `ppl_learner`, `ppl_rollout`: mean over sequences of exp(-mean token log-prob)
    - `ppl_ratio`: mean over sequences of ppl_learner / ppl_rollout
    - `log_ratio_abs_max`: largest |log(pi_learner / pi_rollout)|
    """
    mask = response_mask.bool()
    old = old_log_prob.detach().float()
    roll = rollout_log_prob.detach().float()
    log_ratio = old - roll
    seq_ok = mask.any(-1)
    n_seq = seq_ok.sum().clamp(min=1)
    seq_mean_old = verl_F.masked_mean(old, mask, axis=-1)
    seq_mean_roll = verl_F.masked_mean(roll, mask, axis=-1)
    ppl_old = torch.exp(-seq_mean_old)
    ppl_roll = torch.exp(-seq_mean_roll)
    ppl_ratio = torch.exp(seq_mean_roll - seq_mean_old)
    abs_max = torch.where(mask, log_ratio.abs(), torch.zeros_like(log_ratio)).max() if log_ratio.numel() else torch.zeros(())
    out = {
        "kl_k1": verl_F.masked_mean(token_kl_estimate(log_ratio, "k1"), mask),
        "kl_k3": verl_F.masked_mean(token_kl_estimate(log_ratio, "k3"), mask),
        "ppl_learner": torch.where(seq_ok, ppl_old, torch.zeros_like(ppl_old)).sum() / n_seq,
        "ppl_rollout": torch.where(seq_ok, ppl_roll, torch.zeros_like(ppl_roll)).sum() / n_seq,
        "ppl_ratio": torch.where(seq_ok, ppl_ratio, torch.zeros_like(ppl_ratio)).sum() / n_seq,
        "log_ratio_abs_max": abs_max,
    }
    return {prefix + k: float(v) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------


def compute_rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_corr_config: Any,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """Rollout/learner mismatch correction for one batch.

    Args:
        old_log_prob: [B, L] learner log-probs of the sampled tokens (recomputed by the actor).
        rollout_log_prob: [B, L] log-probs reported by the inference engine.
        response_mask: [B, L] loss mask.
        rollout_corr_config: `algorithm.rollout_correction` (`rollout_is`, `rollout_is_threshold`,
            `rollout_rs`, `rollout_rs_threshold`, `rollout_rs_threshold_lower`); dataclass or dict.
    Returns:
        rollout_is_weights: [B, L] detached TIS weights (0 on masked tokens) or None when
            `rollout_is` is null; pass them to the policy loss.
        new_response_mask: [B, L] mask after rejection (same dtype as `response_mask`); use it for
            every loss term and for the aggregation stats.
        metrics: python floats under `rollout_corr/`: mismatch KL (k1, k3), perplexities and their
            ratio, `rs_masked_token_frac`, `rs_masked_seq_frac` (sequences that lost all tokens),
            `is_weight_mean/max`, `is_truncated_frac`.
    """
    validate_rollout_correction_config(rollout_corr_config)
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            "compute_rollout_correction: old_log_prob, rollout_log_prob and response_mask must share a shape; got "
            f"{tuple(old_log_prob.shape)}, {tuple(rollout_log_prob.shape)}, {tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    metrics = compute_mismatch_metrics(old_log_prob, rollout_log_prob, mask)
    n_tokens = mask.sum().clamp(min=1)
    n_seqs = mask.any(-1).sum().clamp(min=1)

    keep = mask
    mode = config_get(rollout_corr_config, "rollout_rs")
    if mode is not None:
        keep = compute_rollout_rejection_mask(
            old_log_prob,
            rollout_log_prob,
            mask,
            mode,
            upper=config_get(rollout_corr_config, "rollout_rs_threshold"),
            lower=config_get(rollout_corr_config, "rollout_rs_threshold_lower"),
        )
        metrics["rollout_corr/rs_masked_token_frac"] = float((mask & ~keep).sum() / n_tokens)
        metrics["rollout_corr/rs_masked_seq_frac"] = float((mask.any(-1) & ~keep.any(-1)).sum() / n_seqs)

    weights = None
    level = config_get(rollout_corr_config, "rollout_is")
    if level is not None:
        threshold = float(config_get(rollout_corr_config, "rollout_is_threshold", 2.0))
        weights, truncated = compute_rollout_is_weights(old_log_prob - rollout_log_prob, mask, level, threshold)
        weights = torch.where(keep, weights, torch.zeros_like(weights))
        metrics["rollout_corr/is_weight_mean"] = float(verl_F.masked_mean(weights, keep))
        metrics["rollout_corr/is_weight_max"] = float(weights.max()) if weights.numel() else 0.0  # 0 where rejected
        metrics["rollout_corr/is_truncated_frac"] = float(verl_F.masked_mean((truncated & keep).float(), keep))

    new_mask = keep.to(response_mask.dtype)
    return weights, new_mask, metrics
