"""Loss functions of the engines (upstream path and names): `ppo_loss` for the actor, `value_loss`
for the critic.

Each is `fn(config, model_output, data, dp_group=None) -> (loss, metrics)` for ONE micro-batch:

- `model_output`: the forward's outputs on the response columns, [m, R] each (`log_probs`,
  `entropys` when computed, `values`), 0 where the response token is padding.
- `data`: the micro-batch TensorDict on the model's device (`response_mask` [m, R], `advantages`,
  `old_log_probs`, `values`, `returns`, ...).
- `batch_info`: the mini-batch totals over all data-parallel ranks for this micro-batch
  (`core_algos.make_global_batch_info`, given by the engine). `ppo_loss` writes it into
  `config.global_batch_info`, as upstream main's does, and every term is aggregated with
  `core_algos.agg_loss(..., **config.global_batch_info)`, so summing the shares over micro-batches
  and ranks gives the mini-batch loss exactly (no 1/n_micro factor). None: each term is the plain
  mean of this micro-batch (and `config.global_batch_info` is left as it is).
- `metrics`: `LossShare` values (summed over micro-batches, as the loss) or floats (token-weighted
  means over the mini-batch).

Loss functions run no collectives (the engine agrees on skips across ranks); the only state they
touch is their own config's `global_batch_info`.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.trainer.ppo import core_algos
from verl.utils.py_functional import config_get
from verl.workers.engine.dp_engine import LossShare

__all__ = ["ppo_loss", "sft_loss", "value_loss"]


def sft_loss(
    config, model_output: dict[str, torch.Tensor], data, dp_group=None, *, batch_info: dict | None = None
) -> tuple[torch.Tensor, dict]:
    """Supervised loss: the token mean of -log p over the trained tokens of the whole global batch.

    Args:
        config: unused (upstream's signature).
        model_output: `log_probs` [m, R] of the micro-batch (with gradient), 0 on padding.
        data: `response_mask` [m, R]: 1 on the tokens to train on (assistant tokens).
        batch_info: the micro-batch's global denominators (see the module docstring).
    Returns:
        (loss, {"train/loss": LossShare}): the micro-batch's share of the global token mean
        (`agg_loss` token-mean under the engine's global batch info).
    """
    mask = data["response_mask"].to(model_output["log_probs"].dtype)
    loss = core_algos.agg_loss(-model_output["log_probs"], mask, "token-mean", **(batch_info or {}))
    return loss, {"train/loss": LossShare(loss.item())}


def ppo_loss(
    config,
    model_output: dict[str, torch.Tensor],
    data,
    dp_group=None,
    *,
    batch_info: dict | None = None,
    policy_loss_fn=None,
    loss_config: Any = None,
    use_current_as_old: bool = False,
    rollout_correction: Any = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`policy_loss - entropy_coeff * agg(entropy) + kl_loss_coef * agg(kl(logp, ref_logp))`.

    Args:
        config: `ActorConfig` (`loss_agg_mode`, `entropy_coeff`, `use_kl_loss`, `kl_loss_coef`,
            `kl_loss_type`, `policy_loss.loss_mode`, `global_batch_info`).
        model_output: `log_probs` [m, R] (with gradient); `entropys` [m, R] when the entropy bonus
            is on (`entropy_coeff != 0`).
        data: `response_mask`, `advantages`, `old_log_probs` (unless `use_current_as_old`),
            `ref_log_prob` (with `use_kl_loss`), optional `rollout_is_weights`, `rollout_log_probs`.
        batch_info: the micro-batch's global denominators (see the module docstring).
        policy_loss_fn: the registered policy loss to use (default: `config.policy_loss.loss_mode`).
        loss_config: the config the policy loss reads (default `config`).
        use_current_as_old: the detached `log_probs` are the old log-probs (ratio exactly 1); with
            `rollout_log_probs` in `data` the rollout mismatch is reported under `rollout_mismatch/*`,
            and with `rollout_correction` (and no precomputed weights) the IS weights come from them.
    Returns:
        (loss, metrics): `actor/pg_loss`, `actor/loss`, `actor/entropy`, `actor/kl_loss` shares and
        the policy loss's own metrics.
    """
    del dp_group  # the engine owns the collectives
    if batch_info is not None:
        config.global_batch_info.clear()
        config.global_batch_info.update(batch_info)
    agg_kwargs = core_algos.batch_info_of(config)
    log_prob = model_output["log_probs"]
    entropy = model_output.get("entropys")
    mask = data["response_mask"]
    old_log_prob = log_prob.detach() if use_current_as_old else data["old_log_probs"]
    weights = data["rollout_is_weights"] if "rollout_is_weights" in data.keys() else None
    metrics: dict[str, float] = {}
    if use_current_as_old and "rollout_log_probs" in data.keys():
        weights, rc_metrics = _on_policy_correction(
            old_log_prob, data["rollout_log_probs"], mask, weights, rollout_correction
        )
        metrics.update(rc_metrics)
    if policy_loss_fn is None:
        policy_loss_fn = core_algos.get_policy_loss_fn(config_get(config.policy_loss, "loss_mode", "vanilla"))
    pg_loss, pg_metrics = core_algos.unpack_policy_loss_output(
        policy_loss_fn(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=data["advantages"],
            response_mask=mask,
            loss_agg_mode=config.loss_agg_mode,
            config=config if loss_config is None else loss_config,
            rollout_is_weights=weights,
        )
    )
    loss = pg_loss
    if entropy is not None:
        entropy_term = core_algos.agg_loss(entropy, mask, config.loss_agg_mode, **agg_kwargs)
        loss = loss - config.entropy_coeff * entropy_term
        metrics["actor/entropy"] = LossShare(entropy_term.item())
    if config.use_kl_loss:
        kl = core_algos.kl_penalty(log_prob, data["ref_log_prob"], config.kl_loss_type)
        kl_term = core_algos.agg_loss(kl, mask, config.loss_agg_mode, **agg_kwargs)
        loss = loss + config.kl_loss_coef * kl_term
        metrics["actor/kl_loss"] = LossShare(kl_term.item())
    metrics["actor/pg_loss"] = LossShare(pg_loss.item())
    metrics["actor/loss"] = LossShare(loss.item())
    metrics.update({name: float(value) for name, value in pg_metrics.items()})
    return loss, metrics


def _on_policy_correction(old_log_prob, rollout_log_prob, mask, weights, rc_config):
    """With the current policy as the old one, the mismatch against the rollout is measured here
    (compute_log_prob, which would report it, did not run), and the IS weights are derived from it
    when rollout correction is on and the batch carries none."""
    from verl.trainer.ppo.algos.rollout_rejection import compute_mismatch_metrics, compute_rollout_correction

    metrics = compute_mismatch_metrics(old_log_prob, rollout_log_prob, mask, prefix="rollout_mismatch/")
    bypass = bool(config_get(rc_config, "bypass_mode", False))
    if rc_config is not None and weights is None and not bypass:
        weights, _, rc_only = compute_rollout_correction(old_log_prob, rollout_log_prob, mask, rc_config)
        metrics.update(rc_only)
    return weights, metrics


def value_loss(
    config, model_output: dict[str, torch.Tensor], data, dp_group=None, *, batch_info: dict | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss (`core_algos.compute_value_loss`) of one micro-batch.

    Args:
        config: `CriticConfig` (`cliprange_value`, `loss_agg_mode`).
        model_output: `values` [m, R] (with gradient), V(s) before each response token.
        data: `response_mask`, `values` (V_old), `returns` [m, R].
        batch_info: the micro-batch's global denominators (see the module docstring).
    Returns:
        (loss, metrics): the `critic/vf_loss` share, `critic/vf_clipfrac` and `critic/vpred_mean`.
        (`critic/vf_explained_var` has one producer: the driver's `compute_data_metrics`.)
    """
    del dp_group
    vpreds = model_output["values"]
    mask = data["response_mask"]
    vf_loss, vf_clipfrac = core_algos.compute_value_loss(
        vpreds,
        data["returns"],
        data["values"],
        mask,
        config.cliprange_value,
        config.loss_agg_mode,
        **(batch_info or {}),
    )
    v = vpreds.detach()[mask.bool()].double().cpu()
    return vf_loss, {
        "critic/vf_loss": LossShare(vf_loss.item()),
        "critic/vf_clipfrac": float(vf_clipfrac),
        "critic/vpred_mean": float(v.mean()) if v.numel() else 0.0,
    }
