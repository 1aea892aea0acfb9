"""Rollout correction, part 1: the accepted values and their validation, the KL building blocks
(`token_kl_estimate`, `binary_kl`, IcePop / KPop masks) and the importance-sampling weights
(`compute_rollout_correction_weights`, `compute_is_metrics`). Pure torch on [B, L] tensors with
`log_ratio = old_log_prob - rollout_log_prob`; the public surface is
`verl.trainer.ppo.rollout_corr_helper`, which re-exports these names."""

from __future__ import annotations

import math
from typing import Any

import torch

import verl.utils.torch_functional as verl_F
from verl.utils.py_functional import config_get

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


def _split_bounds(text: str) -> tuple[float | None, float]:
    """`"upper"` or `"lower_upper"` -> (lower or None, upper); ValueError when not numbers."""
    if "_" in text:
        lo, hi = text.split("_", 1)
        return float(lo), float(hi)
    return None, float(text)


def _parse_rollout_is_threshold(spec: Any) -> tuple[float, float | None]:
    """`rollout_is_threshold`: a number (TIS upper bound) or a string `"upper"` / `"lower_upper"`
    (IcePop bounds). Returns (upper, lower or None)."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise TypeError(f"rollout_is_threshold={spec!r} must be a number or a string 'upper' / 'lower_upper'")
    lower = None
    if isinstance(spec, str):
        try:
            lower, upper = _split_bounds(spec.strip())
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
                    lower, upper = _split_bounds(entry)
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
