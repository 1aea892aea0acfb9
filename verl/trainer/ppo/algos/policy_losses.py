"""Policy losses registered by name (`actor_rollout_ref.actor.policy_loss.loss_mode`), the legacy
`compute_policy_loss`, and the entropy and value losses. Every loss takes [B, L] tensors
(`old_log_prob`, `log_prob`, `advantages`, `response_mask`, optional `rollout_is_weights`) and
returns `(pg_loss, metrics)`; aggregation goes through `aggregation.agg_loss` with the config's
`global_batch_info` (`batch_info_of(config)`), so it is exact per micro-batch. Re-exported by
`core_algos`; the formulas are in ALGORITHMS.md."""

from __future__ import annotations

from typing import Any

import torch

import verl.utils.torch_functional as verl_F
from verl.trainer.ppo.algos.aggregation import agg_loss, batch_info_of
from verl.trainer.ppo.algos.registry import _to_float, register_policy_loss
from verl.trainer.ppo.algos.rollout_rejection import compute_rollout_correction_tensors
from verl.utils.py_functional import config_get


def _loss_knob(config: Any, key: str, default: Any) -> Any:
    """A policy-loss knob: `config.policy_loss.<key>` (actor config layout), else `config.<key>`
    (flat dict written by hand), else `default`."""
    sub = config_get(config, "policy_loss", None)
    value = config_get(sub, key, None)
    if value is None:
        value = config_get(config, key, None)
    return default if value is None else value


def _clip_params(config: Any) -> tuple[float, float, float]:
    """(clip_ratio_low, clip_ratio_high, clip_ratio_c) with the upstream fallbacks."""
    clip_ratio = float(config_get(config, "clip_ratio", 0.2))
    low = float(config_get(config, "clip_ratio_low", clip_ratio))
    high = float(config_get(config, "clip_ratio_high", clip_ratio))
    clip_c = float(config_get(config, "clip_ratio_c", 3.0))
    if not clip_c > 1.0:
        raise ValueError(f"clip_ratio_c={clip_c} must be > 1 (dual-clip lower bound, default 3.0)")
    return low, high, clip_c


def _finish(
    pg_losses: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """Apply rollout IS weights (detached) to the per-token loss, then aggregate."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * _valid_only(rollout_is_weights.detach(), response_mask)
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **batch_info_of(config))


def _metrics(clipfrac: Any, ppo_kl: Any, clipfrac_lower: Any, **extra: Any) -> dict[str, float]:
    out = {
        "actor/pg_clipfrac": _to_float(clipfrac),
        "actor/ppo_kl": _to_float(ppo_kl),
        "actor/pg_clipfrac_lower": _to_float(clipfrac_lower),
    }
    out.update({k: _to_float(v) for k, v in extra.items()})
    return out


def _valid_only(coef: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """A detached per-token coefficient with 0 on masked positions: a NaN there would otherwise
    turn the (zero) upstream gradient into NaN through the product rule."""
    return torch.where(response_mask.bool(), coef, torch.zeros((), dtype=coef.dtype, device=coef.device))


def _clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    # exp of a log-ratio beyond +-20 is numerically meaningless; keep it finite
    return torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped objective with asymmetric bounds and dual clip.

    Per token, with ratio = exp(log_prob - old_log_prob):
    `l = max(-A*ratio, -A*clip(ratio, 1-clip_ratio_low, 1+clip_ratio_high))`, and for A < 0 the
    dual clip `l = min(l, -A*clip_ratio_c)` bounds the loss when the ratio explodes.

    Args (all [B, L]): old_log_prob, log_prob (requires grad), advantages, response_mask.
        config: actor config (`clip_ratio`, `clip_ratio_low`, `clip_ratio_high`, `clip_ratio_c`,
        `loss_scale_factor`) as a dataclass or a dict.
        rollout_is_weights: [B, L] detached weights multiplying the per-token loss, or None.
    Returns:
        pg_loss (0-d tensor) and metrics as python floats: `actor/pg_clipfrac` (share of tokens on
        the clipped branch), `actor/ppo_kl` (masked mean of old_log_prob - log_prob),
        `actor/pg_clipfrac_lower` (share on the dual-clip branch).
    """
    low, high, clip_c = _clip_params(config)
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)

    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    clipped_losses = torch.maximum(losses1, losses2)
    clipfrac = verl_F.masked_mean((losses2 > losses1).float(), response_mask)

    losses3 = -advantages * clip_c
    dual_clipped = torch.minimum(losses3, clipped_losses)
    clipfrac_lower = verl_F.masked_mean(((clipped_losses > losses3) & (advantages < 0)).float(), response_mask)

    pg_losses = torch.where(advantages < 0, dual_clipped, clipped_losses)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(clipfrac, ppo_kl, clipfrac_lower)


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: sequence-level importance ratio, clipped like PPO.

    s_i = exp(masked_mean_t(log_prob - old_log_prob)); token form
    `s_it = sg(s_i) * exp(log_prob - sg(log_prob))` (value s_i; gradient of s_i spread over the
    tokens), so with per-sequence advantages and `seq-mean-token-mean` aggregation the gradient
    equals the sequence-level objective. The passed `loss_agg_mode` is honoured (the GSPO preset
    sets `seq-mean-token-mean`). Shapes and metrics as `compute_policy_loss_vanilla`
    (`actor/pg_clipfrac_lower` is 0: no dual clip).
    """
    low, high, _ = _clip_params(config)
    log_ratio = log_prob - old_log_prob
    seq_len = response_mask.to(log_prob.dtype).sum(dim=-1).clamp(min=1)
    seq_log_ratio = verl_F.masked_sum(log_ratio, response_mask, axis=-1) / seq_len
    log_s = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    log_s = torch.clamp(log_s, max=10.0)  # a sequence ratio above e^10 is no longer informative
    s = torch.exp(log_s)

    losses1 = -advantages * s
    losses2 = -advantages * torch.clamp(s, 1.0 - low, 1.0 + high)
    pg_losses = torch.maximum(losses1, losses2)
    clipfrac = verl_F.masked_mean((losses2 > losses1).float(), response_mask)
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(clipfrac, ppo_kl, 0.0)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO: a soft sigmoid gate replaces the hard clip.

    `gate = sigmoid(tau * (ratio - 1)) * 4 / tau`, tau = `tau_pos` (default 1.0) where A > 0 else
    `tau_neg` (1.05), read from `config.policy_loss`, else `config` (an `ActorConfig` holds the same
    value at both places: upstream's `actor.tau_pos` and ours); per-token loss `-gate * A`. At ratio 1 the gate is
    2/tau with slope exactly 1 (same gradient as the unclipped objective on-policy).
    As upstream (and the SAPO paper), the loss is always aggregated `seq-mean-token-mean`; the
    `loss_agg_mode` argument is accepted and ignored.
    Metrics: `actor/pg_clipfrac` and `actor/pg_clipfrac_lower` are 0 (nothing is clipped);
    `actor/sapo_gate_mean` is the masked mean gate.
    """
    tau_pos = float(_loss_knob(config, "tau_pos", 1.0))
    tau_neg = float(_loss_knob(config, "tau_neg", 1.05))
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"sapo: tau_pos={tau_pos} and tau_neg={tau_neg} must be > 0")
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    pg_losses = -gate * advantages
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)
    pg_loss = _finish(pg_losses, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    return pg_loss, _metrics(
        0.0, ppo_kl, 0.0, **{"actor/sapo_gate_mean": verl_F.masked_mean(gate.detach(), response_mask)}
    )


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: REINFORCE with a clipped, stop-gradient importance weight.

    Per token `-sg(clip(ratio, 1-clip_ratio_low, 1+clip_ratio_high)) * A * log_prob`: the gradient
    flows only through `log_prob`; every token keeps a gradient. `actor/pg_clipfrac` is the share
    of tokens whose weight was truncated.
    """
    low, high, _ = _clip_params(config)
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob).detach()
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1.0 - low, 1.0 + high)
    pg_losses = -_valid_only(weight * advantages, response_mask) * log_prob
    clipfrac = verl_F.masked_mean((weight != ratio).float(), response_mask)
    ppo_kl = verl_F.masked_mean(-log_ratio, response_mask)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(clipfrac, ppo_kl, 0.0)


@register_policy_loss("reinforce")
@register_policy_loss("pg")
def compute_policy_loss_pg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE / vanilla policy gradient as a registered loss (`loss_mode=reinforce` or `pg`):
    per token `-A * log_prob`; with `policy_loss.pg_use_ratio=True` multiplied by the
    stop-gradient ratio (off-policy correction). Shapes as `compute_policy_loss_vanilla`."""
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob).detach()
    coef = advantages
    if bool(_loss_knob(config, "pg_use_ratio", False)):
        coef = coef * torch.exp(log_ratio)
    pg_losses = -_valid_only(coef, response_mask) * log_prob
    ppo_kl = verl_F.masked_mean(-log_ratio, response_mask)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(0.0, ppo_kl, 0.0)


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE with optional IS correction (upstream's direct function; used by `bypass_mode`
    with `loss_type=reinforce`).

    Per token `-A * log_prob * w`, w = `rollout_is_weights` (detached; 1 when None). No ratio,
    no clip. Args ([B, L]): rollout_log_prob (the behaviour policy, only for the metric),
    log_prob (requires grad), advantages, response_mask (after any rejection).
    Returns pg_loss and `{"actor/ppo_kl": masked mean of rollout_log_prob - log_prob}`.
    """
    coef = advantages
    if rollout_is_weights is not None:
        coef = coef * rollout_is_weights.detach()
    pg_losses = -_valid_only(coef, response_mask) * log_prob
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, None)
    kl = verl_F.masked_mean((rollout_log_prob - log_prob).detach(), response_mask)
    return pg_loss, {"actor/ppo_kl": _to_float(kl)}


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG (group policy gradient): per token `-A * log_prob`, no ratio, no clip (pair it with the
    `gpg` advantage estimator)."""
    pg_losses = -_valid_only(advantages, response_mask) * log_prob
    ppo_kl = verl_F.masked_mean((old_log_prob - log_prob).detach(), response_mask)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(0.0, ppo_kl, 0.0)


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (entropy mechanism of RL): PPO clip, plus the gradient of a random subset of
    high-covariance tokens is removed.

    cov_t = (A_t - mean A) * (log_prob_t - mean log_prob) over the valid tokens of this call.
    Among valid tokens not already clipped with `clip_cov_lb < cov < clip_cov_ub`, a random
    `max(1, clip_cov_ratio * n_valid)` get a zero loss. Selection uses the tokens of one call
    (micro-batch), as upstream. `actor/pg_clipfrac` = share of tokens removed this way.
    """
    low, high, _ = _clip_params(config)
    cov_ratio = float(_loss_knob(config, "clip_cov_ratio", 0.0002))
    cov_lb = float(_loss_knob(config, "clip_cov_lb", 1.0))
    cov_ub = float(_loss_knob(config, "clip_cov_ub", 5.0))
    if not cov_ratio > 0:
        raise ValueError(f"clip_cov: policy_loss.clip_cov_ratio={cov_ratio} must be > 0")

    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    valid = response_mask.bool()
    clipped = (losses2 > losses1) & valid

    with torch.no_grad():
        adv_c = advantages - verl_F.masked_mean(advantages, response_mask)
        logp_c = log_prob.detach() - verl_F.masked_mean(log_prob.detach(), response_mask)
        cov = adv_c * logp_c
        candidates = valid & ~clipped & (cov > cov_lb) & (cov < cov_ub)
        cand_idx = torch.nonzero(candidates)
        n_clip = max(int(cov_ratio * int(valid.sum())), 1)
        keep = torch.ones_like(ratio)
        if len(cand_idx) > 0:
            chosen = cand_idx[torch.randperm(len(cand_idx), device=cand_idx.device)[:n_clip]]
            keep[chosen[:, 0], chosen[:, 1]] = 0.0

    pg_losses = torch.maximum(losses1, losses2) * keep
    clipfrac = verl_F.masked_mean((keep == 0).float(), response_mask)
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(clipfrac, ppo_kl, 0.0)


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov: unclipped `-A * ratio`, plus `ppo_kl_coef * |log ratio|` on the top
    `max(1, kl_cov_ratio * n_valid)` valid tokens by covariance (A - mean A)(log_prob - mean).
    Metrics: `actor/ppo_kl` = `actor/ppo_kl_abs` = masked mean |log ratio| (upstream's definition
    for this loss)."""
    kl_cov_ratio = float(_loss_knob(config, "kl_cov_ratio", 0.0002))
    kl_coef = float(_loss_knob(config, "ppo_kl_coef", 0.1))
    if not kl_cov_ratio > 0:
        raise ValueError(f"kl_cov: policy_loss.kl_cov_ratio={kl_cov_ratio} must be > 0")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    losses = -advantages * ratio
    losses_kl = losses + kl_coef * log_ratio.abs()
    valid = response_mask.bool()
    with torch.no_grad():
        adv_c = advantages - verl_F.masked_mean(advantages, response_mask)
        logp_c = log_prob.detach() - verl_F.masked_mean(log_prob.detach(), response_mask)
        cov = torch.where(valid, adv_c * logp_c, torch.full_like(ratio, -float("inf")))
        n_valid = int(valid.sum())
        selected = torch.zeros_like(valid)
        if n_valid > 0:
            k = max(1, int(n_valid * kl_cov_ratio))
            top = torch.topk(cov.reshape(-1), k).indices
            selected.view(-1)[top] = True
    pg_losses = torch.where(selected, losses_kl, losses)
    ppo_kl_abs = verl_F.masked_mean(log_ratio.detach().abs(), response_mask)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    # upstream reports the mean |log ratio| as actor/ppo_kl for this loss (the quantity it penalises)
    return pg_loss, _metrics(0.0, ppo_kl_abs, 0.0, **{"actor/ppo_kl_abs": ppo_kl_abs})


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO (geometric-mean policy optimisation): a sequence objective with token-level clipping.

    Per token the log-ratio is clipped to [-clip_ratio_low, clip_ratio_high] pessimistically
    (`sgn(A) * min(sgn(A) * lr, sgn(A) * clip(lr))`); the sequence ratio is the exp of its masked
    mean; loss_i = -mean_t(A) * ratio_i, averaged over non-empty sequences. The objective is
    sequence-level by construction, so `loss_agg_mode` is not used (sequence mean, micro-batch
    exact through `global_batch_size`). Rollout IS weights multiply each sequence loss by their
    geometric mean over the sequence, `exp(mean_t log(w_t + 1e-10))`. `actor/pg_clipfrac` / `_lower`:
    clipped tokens with A > 0 / A < 0.
    """
    del loss_agg_mode
    low, high, _ = _clip_params(config)
    log_ratio = log_prob - old_log_prob
    sgn = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -low, high)
    pessimistic = sgn * torch.minimum(sgn * log_ratio, sgn * clamped)
    seq_len = response_mask.to(log_prob.dtype).sum(dim=-1).clamp(min=1)
    seq_ratio = torch.exp(verl_F.masked_sum(pessimistic, response_mask, axis=-1) / seq_len)
    seq_adv = verl_F.masked_sum(advantages, response_mask, axis=-1) / seq_len
    seq_loss = -seq_adv * seq_ratio
    if rollout_is_weights is not None:
        # geometric mean of the token weights, consistent with the geometric-mean ratio (upstream);
        # the 1e-10 keeps a zero (rejected) weight finite in log space
        log_w = torch.log(rollout_is_weights.detach().to(log_prob.dtype) + 1e-10)
        seq_loss = seq_loss * torch.exp(verl_F.masked_sum(log_w, response_mask, axis=-1) / seq_len)
    # spread each sequence loss evenly over its tokens so agg_loss can take the (global) seq mean
    loss_mat = (seq_loss / seq_len).unsqueeze(-1).expand_as(log_prob)
    pg_loss = agg_loss(loss_mat, response_mask, "seq-mean-token-sum", **batch_info_of(config))
    clipped = log_ratio.detach() != clamped.detach()
    clipfrac = verl_F.masked_mean((clipped & (advantages > 0)).float(), response_mask)
    clipfrac_lower = verl_F.masked_mean((clipped & (advantages < 0)).float(), response_mask)
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)
    return pg_loss, _metrics(clipfrac, ppo_kl, clipfrac_lower)


def _dppo_setup(old_log_prob, log_prob, config):
    # the clip ratios are divergence thresholds here (TV or binary KL), not ratio bounds
    base = float(config_get(config, "clip_ratio", 0.2))
    low = config_get(config, "clip_ratio_low", None)
    high = config_get(config, "clip_ratio_high", None)
    low = base if low is None else float(low)
    high = base if high is None else float(high)
    trunc = float(config_get(config, "clip_ratio_c", 20.0))
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    return low, high, trunc, log_ratio, ratio


def _dppo_finish(
    valid, ratio, log_ratio, trunc, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
):
    valid = valid.detach().to(log_prob.dtype)
    weight = torch.clamp(ratio, max=trunc).detach() * valid
    pg_losses = -_valid_only(weight * advantages, response_mask) * log_prob
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    clipfrac = verl_F.masked_mean(1.0 - valid, response_mask)
    clipfrac_lower = verl_F.masked_mean((ratio.detach() > trunc).to(valid.dtype) * valid, response_mask)
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)
    return pg_loss, _metrics(clipfrac, ppo_kl, clipfrac_lower)


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-TV: trust region by the change of the token probability instead of the ratio.

    With p = exp(log_prob), p_old = exp(old_log_prob): a token keeps its gradient if
    `p - p_old <= clip_ratio_high` (A > 0) or `p - p_old >= -clip_ratio_low` (A <= 0); loss per
    kept token `-A * sg(min(ratio, clip_ratio_c)) * log_prob` (truncated IS, default
    clip_ratio_c 20 when the config has none). `actor/pg_clipfrac`: tokens outside the region;
    `actor/pg_clipfrac_lower`: kept tokens whose ratio was truncated. Shapes as vanilla.
    """
    low, high, trunc, log_ratio, ratio = _dppo_setup(old_log_prob, log_prob, config)
    delta = (torch.exp(log_prob) - torch.exp(old_log_prob)).detach()
    valid = torch.where(advantages > 0, delta <= high, delta >= -low)
    return _dppo_finish(
        valid, ratio, log_ratio, trunc, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-KL: as `dppo_tv` with the Bernoulli KL of the token probability,
    `KL_b = p_old log(p_old/p) + (1-p_old) log((1-p_old+1e-8)/(1-p+1e-8))`. A token keeps its
    gradient if `KL_b <= clip_ratio_high` or p <= p_old (A > 0), `KL_b <= clip_ratio_low` or
    p >= p_old (A <= 0). Loss and metrics as `dppo_tv`."""
    low, high, trunc, log_ratio, ratio = _dppo_setup(old_log_prob, log_prob, config)
    lp = log_prob.detach()
    p, p_old = torch.exp(lp), torch.exp(old_log_prob)
    kl_b = p_old * (old_log_prob - lp) + (1.0 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    valid = torch.where(advantages > 0, (kl_b <= high) | (p <= p_old), (kl_b <= low) | (p >= p_old))
    return _dppo_finish(
        valid, ratio, log_ratio, trunc, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DRO (direct reward optimisation): a quadratic proximal penalty instead of a clip.

    Per token `-(A * log_prob - beta/2 * (log_prob - old_log_prob)^2)`, beta =
    `policy_loss.dro_beta` (default 0.1, must be > 0). The log-ratio of the penalty is not
    clamped. `actor/pg_clipfrac*` are 0.
    """
    beta = float(_loss_knob(config, "dro_beta", 0.1))
    if not beta > 0:
        raise ValueError(f"dro: policy_loss.dro_beta={beta} must be > 0")
    log_ratio = log_prob - old_log_prob
    pg_losses = (
        -(_valid_only(advantages, response_mask) * log_prob)
        + 0.5
        * beta
        * torch.where(
            response_mask.bool(), log_ratio, torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
        ).square()
    )
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)
    return pg_loss, _metrics(0.0, ppo_kl, 0.0)


@register_policy_loss("up")
def compute_policy_loss_up(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """UP (unbounded positive): tokens with A > 0 use the unclipped self-anchored REINFORCE term
    `-A * exp(log_prob - sg(log_prob))` (value -A, gradient -A grad log_prob); tokens with A <= 0
    use the vanilla PPO clip with dual clip. `actor/pg_clipfrac` counts clipped tokens among the
    A <= 0 tokens; `actor/pg_clipfrac_lower` the dual-clip branch."""
    low, high, clip_c = _clip_params(config)
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    clipped = torch.maximum(losses1, losses2)
    losses3 = -advantages * clip_c
    neg = torch.where(advantages < 0, torch.minimum(losses3, clipped), clipped)
    pos = -advantages * torch.exp(log_prob - log_prob.detach())
    pg_losses = torch.where(advantages > 0, pos, neg)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    neg_mask = response_mask.bool() & (advantages <= 0)
    clipfrac = verl_F.masked_mean((losses2 > losses1).float(), neg_mask)
    clipfrac_lower = verl_F.masked_mean(((clipped > losses3) & (advantages < 0)).float(), response_mask)
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)
    return pg_loss, _metrics(clipfrac, ppo_kl, clipfrac_lower)


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Rollout-correction bypass mode: `old_log_prob` *is* the rollout log-prob (the trainer
    skipped the learner's recomputation), so there are two policies instead of three.

    Reads `config.policy_loss.rollout_correction` (`loss_type`, `rollout_is`,
    `rollout_is_threshold`, `rollout_is_batch_normalize`, `rollout_rs`, `rollout_rs_threshold`),
    computes IS weights and the rejection mask of the *current* policy against the rollout
    (`rollout_rejection.compute_rollout_correction_tensors`, no gradient), then:
    - `loss_type=ppo_clip` (default): vanilla PPO on ratio = pi / pi_rollout over the kept tokens;
      the IS weights are not applied (the ratio already is the IS correction);
    - `loss_type=reinforce`: `compute_policy_loss_reinforce` with the IS weights.
    The passed `rollout_is_weights` are ignored. With `rollout_is_batch_normalize` the weights are
    normalised over this call (micro-batch), not over all ranks. Metrics: the loss's plus
    `rollout_corr/*`.
    """
    del rollout_is_weights
    rc = config_get(config_get(config, "policy_loss", None), "rollout_correction", None)
    if rc is None:
        raise ValueError(
            "loss_mode='bypass_mode' needs actor.policy_loss.rollout_correction (set by the trainer with "
            "algorithm.rollout_correction.bypass_mode=True)"
        )
    loss_type = config_get(rc, "loss_type", "ppo_clip")
    if loss_type not in ("ppo_clip", "reinforce"):
        raise ValueError(f"Invalid loss_type: {loss_type}. Must be 'reinforce' or 'ppo_clip'.")
    level = config_get(rc, "rollout_is", None)
    with torch.no_grad():
        weights, kept_mask, rc_metrics = compute_rollout_correction_tensors(
            old_log_prob=log_prob.detach(),
            rollout_log_prob=old_log_prob,
            response_mask=response_mask,
            rollout_is=level,
            rollout_is_threshold=config_get(rc, "rollout_is_threshold", 2.0),
            rollout_is_batch_normalize=False,  # normalised below, within this call
            rollout_rs=config_get(rc, "rollout_rs", None),
            rollout_rs_threshold=config_get(rc, "rollout_rs_threshold", None),
            rollout_rs_threshold_lower=config_get(rc, "rollout_rs_threshold_lower", None),
        )
    if weights is not None and bool(config_get(rc, "rollout_is_batch_normalize", False)):
        # over this call's tokens (token level) or sequences (sequence level): micro-batches may
        # differ in number between ranks, so no collective here
        if level == "sequence":
            seq_ok = response_mask.sum(-1) > 0
            mean = (
                verl_F.masked_mean(weights, response_mask, axis=-1)[seq_ok].mean()
                if seq_ok.any()
                else weights.new_ones(())
            )
        else:
            mean = verl_F.masked_mean(weights, response_mask)
        factor = float(mean) if float(mean) > 1e-8 else 1.0
        weights = weights / factor
        rc_metrics["rollout_corr/rollout_is_batch_norm_factor"] = factor
    if loss_type == "reinforce":
        pg_loss, metrics = compute_policy_loss_reinforce(
            old_log_prob, log_prob, advantages, kept_mask, loss_agg_mode, config, rollout_is_weights=weights
        )
    else:
        pg_loss, metrics = compute_policy_loss_vanilla(
            old_log_prob, log_prob, advantages, kept_mask, loss_agg_mode, config, rollout_is_weights=None
        )
    metrics = dict(metrics)
    metrics.update(rc_metrics)
    return pg_loss, metrics


def compute_policy_loss(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    cliprange=None,
    cliprange_low=None,
    cliprange_high=None,
    clip_ratio_c=3.0,
    loss_agg_mode: str = "token-mean",
):
    """Legacy upstream entry point: vanilla PPO loss returning the 4-tuple
    `(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)` (metrics as 0-d tensors)."""
    clip = 0.2 if cliprange is None else cliprange
    config = {
        "clip_ratio": clip,
        "clip_ratio_low": cliprange_low if cliprange_low is not None else clip,
        "clip_ratio_high": cliprange_high if cliprange_high is not None else clip,
        "clip_ratio_c": clip_ratio_c,
    }
    pg_loss, m = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config)
    as_t = lambda v: torch.tensor(v, device=pg_loss.device)  # noqa: E731
    return pg_loss, as_t(m["actor/pg_clipfrac"]), as_t(m["actor/ppo_kl"]), as_t(m["actor/pg_clipfrac_lower"])


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Aggregated categorical entropy of `logits` [B, L, V] over `response_mask` [B, L]."""
    entropy = verl_F.entropy_from_logits(logits)
    return agg_loss(entropy, response_mask, loss_agg_mode)


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float | None,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
    group_num_tokens: torch.Tensor | None = None,
    global_num_groups: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss `max(0.5*(V-R)^2, 0.5*(clip(V, V_old-c, V_old+c)-R)^2)`, aggregated.

    Args (all [B, L]): vpreds (current values, requires grad), returns (targets R), values
        (V_old from the rollout), response_mask. cliprange_value: c (None disables clipping).
        dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: forwarded to `agg_loss`
        (mini-batch-global denominators; without them the loss is this batch's own mean).
        group_num_tokens, global_num_groups: the same for `prompt-mean` (not in upstream).
    Returns:
        vf_loss (0-d tensor) and vf_clipfrac (0-d detached tensor: share of tokens where the
        clipped term is the larger one).
    """
    if cliprange_value is None:
        vpred_clipped = vpreds
    else:
        vpred_clipped = verl_F.clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    losses1 = (vpreds - returns).square()
    losses2 = (vpred_clipped - returns).square()
    vf_loss = 0.5 * agg_loss(
        torch.maximum(losses1, losses2),
        response_mask,
        loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
        group_num_tokens=group_num_tokens,
        global_num_groups=global_num_groups,
    )
    vf_clipfrac = verl_F.masked_mean((losses2 > losses1).float(), response_mask).detach()
    return vf_loss, vf_clipfrac
