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

The computation is pure torch on [B, L] tensors and only changes weights and the loss mask, so it
composes with every policy loss. It lives in `verl.trainer.ppo.algos.rollout_correction` and
`verl.trainer.ppo.algos.rollout_rejection` (the algorithm layer, which knows nothing of
`DataProto`); this module re-exports their names (the same objects) and adds the three batch-level
entry points whose upstream signatures take or return a `DataProto`, so it sits in the trainer
layer. Engines and losses import the tensor functions from the `algos` modules.

Notation: `log_ratio = old_log_prob - rollout_log_prob = log(pi_learner / pi_rollout)`; the
k-estimates are of KL(pi_rollout || pi_learner): k1 = -log_ratio, k2 = log_ratio^2 / 2,
k3 = exp(log_ratio) - 1 - log_ratio.

Upstream entry points (same signatures and return values): `compute_rollout_correction_and_rejection_mask`,
`compute_rollout_correction_weights`, `compute_rollout_rejection_mask`, `compute_is_metrics`,
`compute_rs_metrics`, `compute_offpolicy_metrics`, `compute_rollout_corr_metrics_from_logprobs`,
`compute_rollout_correction_and_add_to_batch`, `apply_bypass_mode`.
Ours: `compute_rollout_correction(old, rollout, mask, config)` (the actor's call),
`compute_rollout_correction_tensors` (the upstream entry point with a plain weights tensor), extra rejection
rules (`icepop`, `kpop`, `token`, `sequence`, `geometric`), `validate_rollout_correction_config`.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.protocol import DataProto
from verl.trainer.ppo.algos.rollout_correction import (
    ROLLOUT_IS_LEVELS,
    ROLLOUT_RS_MODES,
    SAFETY_BOUND,
    SUPPORTED_ROLLOUT_RS_OPTIONS,
    TOKEN_LEVEL_ROLLOUT_RS_OPTIONS,
    binary_kl,
    compute_binary_kl_divergence,
    compute_is_metrics,
    compute_rollout_correction_weights,
    compute_rollout_is_weights,
    icepop_mask,
    kpop_mask,
    parse_rollout_rs_options,
    token_kl_estimate,
    validate_rollout_correction_config,
)
from verl.trainer.ppo.algos.rollout_rejection import (
    _rc_kwargs,
    compute_mismatch_metrics,
    compute_offpolicy_metrics,
    compute_rollout_corr_metrics_from_logprobs,
    compute_rollout_correction,
    compute_rollout_correction_tensors,
    compute_rollout_rejection_mask,
    compute_rs_metrics,
)
from verl.utils.py_functional import config_get as config_get  # the shared config reader, as before the split

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
    "compute_rollout_correction_tensors",
    "compute_rollout_is_weights",
    "compute_mismatch_metrics",
    "icepop_mask",
    "kpop_mask",
    "binary_kl",
    "token_kl_estimate",
    "parse_rollout_rs_options",
    "validate_rollout_correction_config",
]


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
) -> tuple[DataProto | None, torch.Tensor, dict[str, float]]:
    """Upstream's entry point: `compute_rollout_correction_tensors` with the weights wrapped as a
    `DataProto` holding `rollout_is_weights` [B, L] (None without IS weights); the mask after
    rejection [B, L] and the metrics under `rollout_corr/` are returned as they are."""
    weights, new_mask, metrics = compute_rollout_correction_tensors(
        old_log_prob,
        rollout_log_prob,
        response_mask,
        rollout_is=rollout_is,
        rollout_is_threshold=rollout_is_threshold,
        rollout_is_batch_normalize=rollout_is_batch_normalize,
        rollout_rs=rollout_rs,
        rollout_rs_threshold=rollout_rs_threshold,
        rollout_rs_threshold_lower=rollout_rs_threshold_lower,
    )
    proto = DataProto.from_dict(tensors={"rollout_is_weights": weights}) if weights is not None else None
    return proto, new_mask, metrics


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
