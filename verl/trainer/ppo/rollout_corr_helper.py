"""Correction for the mismatch between the rollout (behaviour) policy and the learner's policy.

The inference engine samples with its own numerics (other kernels, precision, possibly stale
weights), so its log-probabilities `rollout_log_prob` differ from the learner's recomputation
`old_log_prob` of the same tokens. This module turns the two into

- importance-sampling (IS) weights that multiply the per-token policy loss: truncated (TIS, a
  single upper bound) or IcePop-style (a `"lower_upper"` threshold string zeroes weights outside
  the bounds), per token or per sequence, optionally normalised to mean 1 over the batch;
- a rejection mask that drops tokens or whole sequences whose mismatch is too large (`rollout_rs`:
  one or several comma-separated rules, all of which must pass);
- metrics that measure the mismatch, under upstream verl's names (`rollout_corr/kl`, `k3_kl`,
  `training_ppl`, `rollout_ppl`, `chi2_token`, `rollout_is_eff_sample_size`,
  `rollout_rs_masked_fraction`, ...).

Everything is pure torch on [B, L] tensors and only changes weights and the loss mask, so it
composes with every policy loss. Notation: `log_ratio = old_log_prob - rollout_log_prob =
log(pi_learner / pi_rollout)`; the k-estimates are of KL(pi_rollout || pi_learner):
k1 = -log_ratio, k2 = log_ratio^2 / 2, k3 = exp(log_ratio) - 1 - log_ratio.

Upstream entry points (same signatures and return values): `compute_rollout_correction_and_rejection_mask`,
`compute_rollout_correction_weights`, `compute_rollout_rejection_mask`, `compute_is_metrics`,
`compute_rs_metrics`, `compute_offpolicy_metrics`, `compute_rollout_corr_metrics_from_logprobs`,
`compute_rollout_correction_and_add_to_batch`, `apply_bypass_mode`.
Ours: `compute_rollout_correction(old, rollout, mask, config)` (the actor's call), extra rejection
rules (`icepop`, `kpop`, `token`, `sequence`, `geometric`), `validate_rollout_correction_config`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

import verl.utils.torch_functional as verl_F
from verl.utils.py_functional import config_get

__all__ = [
    "SAFETY_BOUND",
    "SUPPORTED_ROLLOUT_RS_OPTIONS",
    "TOKEN_LEVEL_ROLLOUT_RS_OPTIONS",
    "ROLLOUT_IS_LEVELS",
    "ROLLOUT_RS_MODES",
    "compute_rollout_correction_and_rejection_mask",
    "compute_rollout_correction_weights",
    "compute_rollout_rejection_mask",
    "compute_is_metrics",
    "compute_rs_metrics",
    "compute_offpolicy_metrics",
    "compute_rollout_corr_metrics_from_logprobs",
    "compute_rollout_correction_and_add_to_batch",
    "apply_bypass_mode",
    "compute_binary_kl_divergence",
    "compute_rollout_correction",
    "compute_rollout_is_weights",
    "compute_mismatch_metrics",
    "icepop_mask",
    "kpop_mask",
    "binary_kl",
    "token_kl_estimate",
    "parse_rollout_rs_options",
    "validate_rollout_correction_config",
]

# log-space clamp before exponentiating a (token or sequence) log-ratio: exp(20) ~ 4.9e8
SAFETY_BOUND = 20.0

# upstream's rejection rules
SUPPORTED_ROLLOUT_RS_OPTIONS: set[str] = {
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
    "binary_kl",
}  # fmt: skip
TOKEN_LEVEL_ROLLOUT_RS_OPTIONS: set[str] = {"token_k1", "token_k2", "token_k3", "binary_kl"}
# our additional rules: ratio bounds per token / on the product / on the geometric mean, IcePop
# (token ratio bounds with their own defaults), KPop (exact two-sided Bernoulli KL)
_RATIO_RULES = ("token", "sequence", "geometric", "icepop")
_EXTRA_RS_OPTIONS = _RATIO_RULES + ("kpop",)
_ICEPOP_DEFAULTS = (0.5, 5.0)
_KPOP_DEFAULT_UPPER = 2.0
_RATIO_DEFAULT_UPPER = 2.0

ROLLOUT_IS_LEVELS = (None, "token", "sequence")
ROLLOUT_RS_MODES = (None,) + tuple(sorted(SUPPORTED_ROLLOUT_RS_OPTIONS)) + _EXTRA_RS_OPTIONS


# ---------------------------------------------------------------------------------------------
# threshold parsing and validation
# ---------------------------------------------------------------------------------------------


def _parse_rollout_is_threshold(spec: Any) -> tuple[float, float | None]:
    """`rollout_is_threshold`: a number (TIS upper bound) or a string `"upper"` / `"lower_upper"`
    (IcePop bounds). Returns (upper, lower or None)."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise TypeError(f"rollout_is_threshold={spec!r} must be a number or a string 'upper' / 'lower_upper'")
    lower = None
    if isinstance(spec, str):
        text = spec.strip()
        try:
            if "_" in text:
                lo, hi = text.split("_", 1)
                lower, upper = float(lo), float(hi)
            else:
                upper = float(text)
        except ValueError:
            raise ValueError(
                f"Invalid rollout_is_threshold '{spec}'; expected a number or 'lower_upper' (e.g. '0.5_2.0')"
            ) from None
    else:
        upper = float(spec)
    if not upper > 0:
        raise ValueError(f"rollout_is_threshold upper bound must be positive, got {upper}")
    if lower is not None and not 0 < lower <= upper:
        raise ValueError(f"rollout_is_threshold lower bound must be in (0, upper={upper}], got {lower}")
    return upper, lower


def parse_rollout_rs_options(rollout_rs: str) -> list[str]:
    """The rules of a comma-separated `rollout_rs` string, de-duplicated in order; ValueError
    naming an unknown rule and the accepted ones."""
    if not isinstance(rollout_rs, str) or not rollout_rs.strip():
        raise ValueError("rollout_rs must be a non-empty string (comma separated for multiple options).")
    options: list[str] = []
    for opt in (o.strip() for o in rollout_rs.split(",")):
        if not opt:
            continue
        if opt not in SUPPORTED_ROLLOUT_RS_OPTIONS and opt not in _EXTRA_RS_OPTIONS:
            raise ValueError(
                f"Invalid rollout_rs option: {opt}. Must be one of {sorted(SUPPORTED_ROLLOUT_RS_OPTIONS)} "
                f"or ours {list(_EXTRA_RS_OPTIONS)}."
            )
        if opt not in options:
            options.append(opt)
    if not options:
        raise ValueError("rollout_rs must contain at least one valid option.")
    return options


def _uses_ratio_bounds(option: str) -> bool:
    return option.endswith("k1") or option in _RATIO_RULES


def _parse_rollout_rs_thresholds(
    options: list[str], spec: Any, lower_spec: Any = None
) -> dict[str, tuple[float | None, float]]:
    """Per option (lower, upper). `spec` is a number or a comma-separated string with one entry
    shared by all options or one per option. Ratio-bound options (`*_k1` and ours `token`,
    `sequence`, `geometric`, `icepop`) take `"lower_upper"` or `"upper"` (lower = 1/upper; for
    `icepop` 0.5); the others a single positive upper bound. `lower_spec` (our
    `rollout_rs_threshold_lower`) is the lower ratio bound where an entry has none."""
    if spec is None:
        if any(opt in SUPPORTED_ROLLOUT_RS_OPTIONS for opt in options):
            raise ValueError("rollout_rs_threshold must be provided for rejection sampling.")
        raw = [None] * len(options)
    elif isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise TypeError("rollout_rs_threshold must be a string or numeric value specifying per-option thresholds.")
    else:
        raw = [str(spec)] if not isinstance(spec, str) else [p.strip() for p in spec.split(",") if p.strip()]
        if not raw:
            raise ValueError("rollout_rs_threshold must contain at least one threshold value.")
        if len(raw) not in (1, len(options)):
            raise ValueError(
                f"rollout_rs_threshold expects either one threshold shared by all options or exactly "
                f"{len(options)} thresholds to match the provided rollout_rs options."
            )
        if len(raw) == 1:
            raw = raw * len(options)
    out: dict[str, tuple[float | None, float]] = {}
    for option, entry in zip(options, raw, strict=False):
        if _uses_ratio_bounds(option):
            lower = None
            if entry is None:
                upper = _ICEPOP_DEFAULTS[1] if option == "icepop" else _RATIO_DEFAULT_UPPER
            else:
                try:
                    if "_" in entry:
                        lo, hi = entry.split("_", 1)
                        lower, upper = float(lo), float(hi)
                    else:
                        upper = float(entry)
                except ValueError:
                    raise ValueError(f"Invalid numeric threshold '{entry}' for option '{option}'.") from None
            if lower is None and lower_spec is not None:
                lower = float(lower_spec)
            if lower is None:
                lower = _ICEPOP_DEFAULTS[0] if option == "icepop" else 1.0 / upper
            if not (lower > 0 and upper > 0):
                raise ValueError(
                    f"Thresholds for option '{option}' must be positive, got lower={lower}, upper={upper}."
                )
            out[option] = (lower, upper)
        else:
            if lower_spec is not None:
                raise ValueError(
                    f"rollout_rs_threshold_lower={lower_spec!r} applies to ratio-bound rules (*_k1, token, sequence, "
                    f"geometric, icepop) only, not to {option!r}"
                )
            if entry is None:
                upper = _KPOP_DEFAULT_UPPER
            else:
                if "_" in entry:
                    raise ValueError(
                        f"rollout_rs_threshold for option '{option}' must provide a single upper bound "
                        f"without '_'. Received '{entry}'."
                    )
                try:
                    upper = float(entry)
                except ValueError:
                    raise ValueError(f"Invalid numeric threshold '{entry}' for option '{option}'.") from None
            if not upper > 0:
                raise ValueError(f"Threshold for option '{option}' must be positive, got {entry}.")
            out[option] = (None, upper)
    return out


def validate_rollout_correction_config(config: Any) -> None:
    """Raise ValueError naming `algorithm.rollout_correction.<key>` for a bad level, rule or
    threshold. Meant to be called when the config is loaded (before any worker starts)."""
    owner = "algorithm.rollout_correction"
    level = config_get(config, "rollout_is")
    if level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"{owner}.rollout_is={level!r} is not allowed; expected one of {list(ROLLOUT_IS_LEVELS)}")
    try:
        _parse_rollout_is_threshold(config_get(config, "rollout_is_threshold", 2.0))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{owner}.rollout_is_threshold: {exc}") from None
    rs = config_get(config, "rollout_rs")
    if rs is not None:
        try:
            options = parse_rollout_rs_options(rs)
        except ValueError as exc:
            raise ValueError(f"{owner}.rollout_rs={rs!r} is not allowed: {exc}") from None
        try:
            bounds = _parse_rollout_rs_thresholds(
                options, config_get(config, "rollout_rs_threshold"), config_get(config, "rollout_rs_threshold_lower")
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{owner}.rollout_rs_threshold / rollout_rs_threshold_lower: {exc}") from None
        for option, (lower, upper) in bounds.items():
            if lower is not None and lower > upper:
                raise ValueError(
                    f"{owner}.rollout_rs_threshold_lower: lower bound {lower} > upper bound {upper} for {option!r}"
                )
    loss_type = config_get(config, "loss_type", "ppo_clip")
    if loss_type not in ("ppo_clip", "reinforce"):
        raise ValueError(f"{owner}.loss_type={loss_type!r} is not allowed; expected one of ['ppo_clip', 'reinforce']")


# ---------------------------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------------------------


def token_kl_estimate(log_ratio: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi_rollout || pi_learner) from samples of the rollout policy, with
    `log_ratio = log(pi_learner / pi_rollout)` (clamped to +-SAFETY_BOUND): k1 = -log_ratio (can
    be negative), k2 = log_ratio^2 / 2, k3 = exp(log_ratio) - 1 - log_ratio (>= 0)."""
    lr = torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND)
    if kind == "k1":
        return -lr
    if kind == "k2":
        return 0.5 * lr.square()
    if kind == "k3":
        return torch.exp(lr) - 1.0 - lr
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of ['k1', 'k2', 'k3']")


def binary_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Exact KL(Bernoulli(p) || Bernoulli(q)) = p log(p/q) + (1-p) log((1-p)/(1-q)) from log-probs.

    Stable at p, q -> 1 (uses expm1) and exact at p = 1 (the (1-p) term is 0). If q = 1 while
    p < 1 the divergence is +inf. (Used by our `kpop` rule; upstream's `binary_kl` rule uses
    `compute_binary_kl_divergence`, which clamps the probabilities.)
    """
    p = log_p.exp()
    one_minus_p = -torch.expm1(log_p)
    one_minus_q = -torch.expm1(log_q)
    first = p * (log_p - log_q)
    second = torch.special.xlogy(one_minus_p, one_minus_p) - torch.special.xlogy(one_minus_p, one_minus_q)
    return first + second


def compute_binary_kl_divergence(log_p: torch.Tensor, log_q: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Bernoulli KL(P || Q) of the token probabilities as upstream computes it: in float32 with
    p and q clamped to [eps, 1 - eps] (so 1 - q never rounds to 0); result in the input dtype."""
    p = torch.clamp(torch.exp(log_p.float()), eps, 1.0 - eps)
    q = torch.clamp(torch.exp(log_q.float()), eps, 1.0 - eps)
    kl = p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))
    return kl.to(log_p.dtype)


def icepop_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    lower: float = _ICEPOP_DEFAULTS[0],
    upper: float = _ICEPOP_DEFAULTS[1],
) -> torch.Tensor:
    """IcePop: keep a valid token only if `lower <= pi_learner / pi_rollout <= upper`. [B, L] bool."""
    lr = torch.clamp(old_log_prob - rollout_log_prob, -SAFETY_BOUND, SAFETY_BOUND)
    return response_mask.bool() & (lr >= math.log(lower)) & (lr <= math.log(upper))


def kpop_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    upper: float = _KPOP_DEFAULT_UPPER,
) -> torch.Tensor:
    """KPop: each token probability is a Bernoulli parameter; drop tokens with
    `max(KL(p_learner || p_rollout), KL(p_rollout || p_learner)) > upper`. [B, L] bool keep-mask."""
    div = torch.maximum(binary_kl(old_log_prob, rollout_log_prob), binary_kl(rollout_log_prob, old_log_prob))
    return response_mask.bool() & ~(div > upper) & ~torch.isnan(div)


def _seq_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    neg_inf = torch.full((), -float("inf"), dtype=values.dtype, device=values.device)
    out = torch.where(mask.bool(), values, neg_inf).amax(dim=-1)
    return torch.where(torch.isinf(out), torch.zeros_like(out), out)


# ---------------------------------------------------------------------------------------------
# importance-sampling weights
# ---------------------------------------------------------------------------------------------


def compute_rollout_correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: str | float = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """IS weights `pi_learner / pi_rollout` [B, L], detached, 0 on masked positions.

    Args:
        log_ratio: [B, L] old_log_prob - rollout_log_prob.
        response_mask: [B, L].
        rollout_is: `token` (one weight per token) or `sequence` (exp of the summed log-ratio of
            the sequence on each of its tokens); the log-ratio is clamped to +-SAFETY_BOUND.
        rollout_is_threshold: a number / `"upper"`: TIS, weights truncated at the upper bound;
            `"lower_upper"`: IcePop, weights outside [lower, upper] set to 0.
        rollout_is_batch_normalize: divide the weights by their mean (token level: over the valid
            tokens; sequence level: over the sequences' weights), taken over all ranks when
            torch.distributed is initialised, so they average 1.
    Returns:
        (weights, metrics without prefix: `rollout_is_*` from `compute_is_metrics`, plus
        `rollout_is_oob_ratio` with IcePop bounds and `rollout_is_batch_norm_factor` when normalising).
    """
    if rollout_is not in ("token", "sequence"):
        raise ValueError(f"Invalid rollout_is: {rollout_is}. Must be one of ['token', 'sequence'].")
    upper, lower = _parse_rollout_is_threshold(rollout_is_threshold)
    mask_f = response_mask.to(log_ratio.dtype)
    log_ratio = log_ratio.detach()
    if rollout_is == "token":
        log_ratio_for_metrics = log_ratio
        raw = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    else:
        log_ratio_for_metrics = verl_F.masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(log_ratio_for_metrics, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * mask_f
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    metrics = compute_is_metrics(weights, raw, log_ratio_for_metrics, response_mask, rollout_is, upper, lower)
    if lower is not None:
        oob = (raw < lower) | (raw > upper)
        metrics["rollout_is_oob_ratio"] = verl_F.masked_mean(oob.float(), response_mask).item()
    weights = weights.detach()
    if rollout_is_batch_normalize:
        if rollout_is == "token":
            total, count = (weights * mask_f).sum(), mask_f.sum()
        else:
            seq_ok = (mask_f.sum(-1) > 0).to(weights.dtype)
            total, count = (verl_F.masked_mean(weights, response_mask, axis=-1) * seq_ok).sum(), seq_ok.sum()
        sums = _sum_over_ranks(torch.stack([total.double(), count.double()]))
        mean = sums[0] / sums[1].clamp(min=1e-8)
        if mean > 1e-8:
            weights = weights / mean.to(weights.dtype)
            metrics["rollout_is_batch_norm_factor"] = float(mean)
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights, metrics


def _sum_over_ranks(sums: torch.Tensor) -> torch.Tensor:
    """`sums` summed over all ranks of the default process group when torch.distributed is
    initialised (every rank must call this the same number of times), else unchanged."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from verl.utils.fsdp_utils import collective_device

        moved = sums.to(collective_device(None))
        torch.distributed.all_reduce(moved)
        return moved.to(sums.device)
    return sums


def compute_is_metrics(
    rollout_is_weights: torch.Tensor,
    raw_rollout_is_weights: torch.Tensor,
    log_ratio_for_metrics: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str,
    rollout_is_threshold: float,
    rollout_is_threshold_lower: float | None = None,
) -> dict[str, float]:
    """Statistics of the applied IS weights (upstream's definitions, python floats, no prefix).

    `rollout_is_mean` (masked mean of the applied weights), `rollout_is_max/min`,
    `rollout_is_ratio_fraction_high/low` (share beyond the bounds: raw token weights, or the
    sequences' log-ratios at sequence level; lower bound default 1/upper), `rollout_is_std` and
    `rollout_is_eff_sample_size` (`1 / mean((w / mean w)^2)`, weights clamped to [0, upper]),
    `rollout_is_seq_mean/std/max/min` (per-sequence mean weights), `rollout_is_seq_max_deviation`
    (largest |seq mean - 1|), `rollout_is_seq_fraction_high/low` (raw per-sequence means beyond
    the bounds). Shapes: weights [B, L]; log_ratio_for_metrics [B, L] (token) or [B, 1] (sequence).
    """
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    lower = 1.0 / rollout_is_threshold if rollout_is_threshold_lower is None else rollout_is_threshold_lower
    valid = response_mask.bool()
    m: dict[str, float] = {}
    m["rollout_is_mean"] = verl_F.masked_mean(rollout_is_weights, response_mask).item()
    if rollout_is == "sequence":
        m["rollout_is_max"] = math.exp(min(log_ratio_for_metrics.max().item(), SAFETY_BOUND))
        m["rollout_is_min"] = math.exp(log_ratio_for_metrics.min().item())
        m["rollout_is_ratio_fraction_high"] = (
            (log_ratio_for_metrics > math.log(rollout_is_threshold)).float().mean().item()
        )
        m["rollout_is_ratio_fraction_low"] = (log_ratio_for_metrics < math.log(lower)).float().mean().item()
    else:
        m["rollout_is_ratio_fraction_high"] = verl_F.masked_mean(
            (raw_rollout_is_weights > rollout_is_threshold).float(), response_mask
        ).item()
        m["rollout_is_ratio_fraction_low"] = verl_F.masked_mean(
            (raw_rollout_is_weights < lower).float(), response_mask
        ).item()
        m["rollout_is_max"] = rollout_is_weights.masked_fill(~valid, -float("inf")).max().item()
        m["rollout_is_min"] = rollout_is_weights.masked_fill(~valid, float("inf")).min().item()
    clamped = rollout_is_weights.clamp(min=0.0, max=rollout_is_threshold)
    mean_c = verl_F.masked_mean(clamped, response_mask)
    if response_mask.sum() > 1:
        var = verl_F.masked_mean(clamped.square(), response_mask) - mean_c.square()
        m["rollout_is_std"] = torch.sqrt(torch.clamp(var, min=0.0)).item()
    else:
        m["rollout_is_std"] = 0.0
    normalised = clamped / (mean_c + 1e-8)
    m["rollout_is_eff_sample_size"] = 1.0 / verl_F.masked_mean(normalised.square(), response_mask).item()
    seq_mean = verl_F.masked_mean(rollout_is_weights, response_mask, axis=-1)
    m["rollout_is_seq_mean"] = seq_mean.mean().item()
    m["rollout_is_seq_std"] = seq_mean.std().item() if seq_mean.numel() > 1 else 0.0
    m["rollout_is_seq_max"] = seq_mean.max().item()
    m["rollout_is_seq_min"] = seq_mean.min().item()
    m["rollout_is_seq_max_deviation"] = (seq_mean - 1.0).abs().max().item()
    raw_seq_mean = verl_F.masked_mean(raw_rollout_is_weights, response_mask, axis=-1)
    m["rollout_is_seq_fraction_high"] = (raw_seq_mean > rollout_is_threshold).float().mean().item()
    m["rollout_is_seq_fraction_low"] = (raw_seq_mean < lower).float().mean().item()
    return m


def compute_rollout_is_weights(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, level: str, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """TIS weights `min(exp(clamp(log_ratio, +-SAFETY_BOUND)), threshold)` (ours, without metrics):
    ([B, L] detached weights, 0 on masked positions; [B, L] bool where the weight was truncated)."""
    weights, _ = compute_rollout_correction_weights(log_ratio, response_mask, level, float(threshold))
    lr = log_ratio.detach()
    if level == "sequence":
        lr = verl_F.masked_sum(lr, response_mask, axis=-1).unsqueeze(-1).expand_as(lr)
    truncated = response_mask.bool() & (torch.clamp(lr, -SAFETY_BOUND, SAFETY_BOUND) > math.log(threshold))
    return weights, truncated


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
# entry points
# ---------------------------------------------------------------------------------------------


def compute_rollout_correction_and_rejection_mask(
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
    """IS weights, rejection mask and off-policy metrics of one batch (upstream's entry point).

    Args ([B, L]): old_log_prob (learner), rollout_log_prob (inference engine), response_mask.
        rollout_is / rollout_is_threshold / rollout_is_batch_normalize: see
        `compute_rollout_correction_weights` (None level or None threshold: no weights).
        rollout_rs / rollout_rs_threshold (/ ours rollout_rs_threshold_lower): see
        `compute_rollout_rejection_mask` (None: no rejection).
    Returns:
        (DataProto with `rollout_is_weights` [B, L] or None, the mask after rejection [B, L],
        metrics under `rollout_corr/`). The weights are computed on the unrejected mask; rejected
        tokens drop out through the mask.
    """
    from verl.protocol import DataProto

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
    proto = DataProto.from_dict(tensors={"rollout_is_weights": weights}) if weights is not None else None
    return proto, new_mask, prefixed


def _rc_kwargs(config: Any) -> dict[str, Any]:
    return {
        "rollout_is": config_get(config, "rollout_is", None),
        "rollout_is_threshold": config_get(config, "rollout_is_threshold", 2.0),
        "rollout_is_batch_normalize": bool(config_get(config, "rollout_is_batch_normalize", False)),
        "rollout_rs": config_get(config, "rollout_rs", None),
        "rollout_rs_threshold": config_get(config, "rollout_rs_threshold", None),
        "rollout_rs_threshold_lower": config_get(config, "rollout_rs_threshold_lower", None),
    }


def compute_rollout_correction_and_add_to_batch(batch, rollout_corr_config: Any):
    """Driver-side helper (upstream): from the batch's `old_log_probs`, `rollout_log_probs` and
    `response_mask`, replace `response_mask` by the mask after rejection and add
    `rollout_is_weights` when `rollout_is` is set. Returns (batch, metrics under `rollout_corr/`)."""
    weights, new_mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=batch.batch["old_log_probs"],
        rollout_log_prob=batch.batch["rollout_log_probs"],
        response_mask=batch.batch["response_mask"],
        **_rc_kwargs(rollout_corr_config),
    )
    batch.batch["response_mask"] = new_mask
    if weights is not None:
        batch = batch.union(weights)
    return batch, metrics


def apply_bypass_mode(batch, rollout_corr_config: Any = None, policy_loss_config: Any = None) -> None:
    """Bypass mode (upstream): the rollout's log-probs stand in for `old_log_probs` (no learner
    recomputation: two policies instead of three). In place: `batch.batch["old_log_probs"] =
    batch.batch["rollout_log_probs"]`; and when `policy_loss_config` (the actor's `policy_loss`:
    dict, DictConfig or object) is given, its `rollout_correction` is set to the config and its
    `loss_mode` to `bypass_mode`, whose loss computes IS weights / rejection from the current
    policy and dispatches on `loss_type`."""
    if "rollout_log_probs" not in batch.batch.keys():
        raise ValueError(
            "bypass_mode=True requires rollout_log_probs in batch. "
            "Ensure rollout worker is configured to calculate_log_probs=true."
        )
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
    if policy_loss_config is None:
        return
    try:
        from omegaconf import DictConfig, open_dict
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        DictConfig = ()  # type: ignore[assignment]
    if isinstance(policy_loss_config, DictConfig):
        with open_dict(policy_loss_config):
            policy_loss_config["rollout_correction"] = rollout_corr_config
            policy_loss_config["loss_mode"] = "bypass_mode"
    elif isinstance(policy_loss_config, dict):
        policy_loss_config["rollout_correction"] = rollout_corr_config
        policy_loss_config["loss_mode"] = "bypass_mode"
    else:
        policy_loss_config.rollout_correction = rollout_corr_config
        policy_loss_config.loss_mode = "bypass_mode"


def compute_rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_corr_config: Any,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """The actor's call: `compute_rollout_correction_and_rejection_mask` with the keys of
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
    proto, new_mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob, rollout_log_prob, response_mask, **kwargs
    )
    weights = proto.batch["rollout_is_weights"] if proto is not None else None
    return weights, new_mask.to(response_mask.dtype), metrics
