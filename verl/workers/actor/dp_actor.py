"""`DataParallelPPOActor`: the policy engine over an FSDP2-sharded (or single-process) causal LM.

Data layout (upstream contract). A batch row is a left-padded prompt followed by a right-padded
response: `input_ids`, `attention_mask`, `position_ids` are [b, P + R], `responses` and
`response_mask` are [b, R]. Log-probabilities, entropies and advantages live on the response
columns only ([b, R]); positions where the response mask is 0 hold 0.

The actor is a thin facade over `verl.workers.engine.DataParallelEngine` (the loop shared with the
critic and the reward model) and `verl.workers.utils.losses.ppo_loss` (the loss, a plain function).
Padding is not computed: micro-batches are built from rows of similar length and each row's padding
is removed (`verl.workers.engine.padding_free`); with `actor.use_prefix_grouper` rows repeating a
prompt share one prompt forward where that is exact. Models that accept transformers'
`logits_to_keep` project only the positions from the first response token on onto the vocabulary.
`padding_waste` in the metrics is the share of computed token slots that are padding. With
`use_remove_padding=False` the padded rows are fed as they are (reference path).

Temperature. The rollout samples from softmax(logits / T) and reports log-probs under that
distribution; `compute_log_prob` and `update_policy` divide the logits by the same T
(`meta_info["temperature"]`, default 1.0), so rollout, old and current log-probs are all of the
same distribution; T = 0 (greedy decoding) means T = 1 on both sides
(`verl.workers.rollout.base.logprob_temperature`). Top-k / top-p truncation is not applied to
log-probs (as upstream).

Loss (per mini-batch, summed over micro-batches without any 1/n_micro factor):
`policy_loss - entropy_coeff * agg(entropy) + kl_loss_coef * agg(kl(logp, ref_logp))`, where every
`agg` is `core_algos.agg_loss(..., **config.global_batch_info)`: the engine gives each micro-batch's
loss the mini-batch totals over all data-parallel ranks (written into this actor's
`config.global_batch_info` for the call, cleared after the update), so every aggregation mode gives
exactly the full mini-batch loss and gradient whatever the micro-batch split and world size. With
rollout correction the rejection mask is applied once to this rank's batch before any of those totals is taken.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import torch

import verl.utils.torch_functional as verl_F
from verl.trainer.ppo import core_algos
from verl.utils.py_functional import config_get
from verl.workers.actor.base import BasePPOActor
from verl.workers.engine.dp_engine import (
    DataParallelEngine,
    InferOutput,
    StepMeter,
    check_micro_batching,
    clip_and_step,
    global_loss_stats,
    mini_batch_order,
    prompt_ids,
)
from verl.workers.rollout.base import logprob_temperature
from verl.workers.utils.losses import ppo_loss

# the loop helpers lived here before the engine had its own module; kept importable from here
__all__ = [
    "DataParallelPPOActor",
    "UpdateOutput",
    "StepMeter",
    "clip_and_step",
    "global_loss_stats",
    "mini_batch_order",
]

logger = logging.getLogger(__name__)

_MODEL_INPUTS = ("responses", "input_ids", "attention_mask", "position_ids")


@dataclass
class UpdateOutput:
    """Result of `DataParallelPPOActor.update`.

    metrics: name -> one value per optimizer step (see `update_policy`).
    old_log_probs, entropys: with `use_current_as_old_log_prob`, the detached log-probs (and
        entropies when the entropy bonus is on) [b, R] in the row order of the batch; else None.
    padding: `valid_tokens`, `token_slots`, `padding_waste` of the update's forwards.
    """

    metrics: dict[str, list[float]]
    old_log_probs: torch.Tensor | None
    entropys: torch.Tensor | None
    padding: dict[str, float]


class DataParallelPPOActor(BasePPOActor):
    """PPO policy engine (upstream name and constructor).

    Args:
        config: `ActorConfig` whose `ppo_mini_batch_size` is already *per rank in sequences*
            (the worker multiplies by rollout.n and divides by the data-parallel size) and whose
            `loss_scale_factor` is filled (the worker sets it to the response length when null).
        actor_module: the causal LM (FSDP2-sharded or plain).
        actor_optimizer: its optimizer (None for a reference policy that only computes log-probs).
        process_group: the data-parallel group (None = the default group, if any).
        compute_dtype: autocast dtype (None = full precision), see `fsdp_utils.resolve_compute_dtype`.
        use_remove_padding: drop padding inside micro-batches (default) or feed padded rows.
        pad_token_id: id used for the compact padding (masked out).
    """

    def __init__(
        self,
        config,
        actor_module: torch.nn.Module,
        actor_optimizer: torch.optim.Optimizer | None = None,
        process_group=None,
        compute_dtype: torch.dtype | None = None,
        use_remove_padding: bool = True,
        pad_token_id: int = 0,
    ):
        super().__init__(config)
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.engine = DataParallelEngine(
            actor_module,
            actor_optimizer,
            process_group,
            compute_dtype,
            use_remove_padding,
            pad_token_id,
            use_prefix_grouper=bool(config.get("use_prefix_grouper", False)),
        )

    @property
    def prefix_groups_used(self) -> int:
        """Micro-batches computed with shared prompts (the prefix grouper) so far."""
        return self.engine.prefix_groups_used

    def _forward_micro_batch(self, micro, temperature: float, calculate_entropy: bool = False):
        """Log-probs (and entropies) of the response tokens of one micro-batch.

        Args:
            micro: mapping with `responses` [m, R], `input_ids`, `attention_mask`, `position_ids`
                [m, P + R].
            temperature: logits are divided by it before the softmax.
        Returns:
            (entropy [m, R] or None, log_probs [m, R]); 0 where the response token is padding.
            Also returns the (valid tokens, token slots) of the forward for the padding metric.
        """
        resp_logits, resp_valid, stats = self.engine.response_outputs(micro)
        responses = micro["responses"].to(resp_logits.device)
        resp_logits = resp_logits.float()
        if temperature != 1.0:
            resp_logits = resp_logits / temperature
        log_probs = verl_F.logprobs_from_logits(resp_logits, responses)
        zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
        log_probs = torch.where(resp_valid, log_probs, zero)
        entropy = None
        if calculate_entropy:
            if self.config.get("entropy_from_logits_with_chunking", False):
                entropy = verl_F.entropy_from_logits_with_chunking(resp_logits)
            else:
                entropy = verl_F.entropy_from_logits(resp_logits)
            entropy = torch.where(resp_valid, entropy, zero)
        return entropy, log_probs, stats

    def _forward(self, temperature: float, calculate_entropy: bool):
        """The engine's per-micro-batch forward: `micro -> ({log_probs, entropys}, padding stats)`."""

        def forward(micro):
            entropy, log_probs, stats = self._forward_micro_batch(micro, temperature, calculate_entropy)
            return {"log_probs": log_probs, "entropys": entropy}, stats

        return forward

    # -- log-prob passes ---------------------------------------------------------------------------

    def infer(self, data, calculate_entropy: bool = False) -> InferOutput:
        """`compute_log_prob` with its padding figures: outputs `log_probs` (and `entropys`)."""
        meta = data.meta_info
        temperature = logprob_temperature(meta.get("temperature", 1.0))
        return self.engine.infer(
            data.batch.select(*_MODEL_INPUTS),
            self._forward(temperature, calculate_entropy),
            meta.get("micro_batch_size"),
            bool(meta.get("use_dynamic_bsz", False)),
            meta.get("max_token_len"),
        )

    def compute_log_prob(self, data, calculate_entropy: bool = False):
        """Log-probs of `data.batch["responses"]` under the current policy.

        meta_info: `micro_batch_size` (rows per forward), or `use_dynamic_bsz` with
        `max_token_len` (token budget per forward); `temperature` (default 1.0).
        Returns:
            log_probs [b, R] (and entropys [b, R] when `calculate_entropy`, else None), in the
            row order of `data`.
        """
        out = self.infer(data, calculate_entropy)
        return out.outputs["log_probs"], out.outputs.get("entropys")

    # -- update ------------------------------------------------------------------------------------

    def update_policy(self, data) -> dict[str, list[float]]:
        """PPO update: `ppo_epochs` x mini-batches (one optimizer step each) x micro-batches.

        Batch keys: `responses`, `response_mask`, `input_ids`, `attention_mask`, `position_ids`,
        `advantages`, `old_log_probs` (unless `meta_info["use_current_as_old_log_prob"]`),
        `ref_log_prob` (with `use_kl_loss`), optional `rollout_log_probs`, `rollout_is_weights`.
        non_tensor_batch: `uid` (needed by `prompt-mean`).
        meta_info: `temperature`; `use_current_as_old_log_prob` (valid only with one
        mini-batch and one epoch: the detached current log-prob is the old one, ratio exactly 1);
        `rollout_correction` (the `algorithm.rollout_correction` config): unless the batch already
        holds `rollout_is_weights`, IS weights and the rejection mask are computed here once for
        this rank's batch from `old_log_probs` and `rollout_log_probs`
        (`rollout_corr_helper.compute_rollout_correction`), before any loss denominator, and their
        `rollout_corr/*` metrics are reported once; with `bypass_mode` the `old_log_probs` are the
        rollout's and the `bypass_mode` loss handles IS / rejection against the current policy.

        Returns:
            metrics: name -> list with one value per optimizer step (reduced over ranks). `update`
            returns them with the detached log-probs of the `use_current_as_old_log_prob` shortcut.
        """
        return self.update(data).metrics

    def update(self, data) -> UpdateOutput:
        """`update_policy` returning an `UpdateOutput` (metrics, on-policy log-probs, padding)."""
        cfg = self.config
        if self.actor_optimizer is None:
            raise RuntimeError("update_policy called on an actor without optimizer (reference policy?)")
        meta = data.meta_info
        temperature = logprob_temperature(meta.get("temperature", 1.0))
        use_current = bool(meta.get("use_current_as_old_log_prob", False))
        rc_config = meta.get("rollout_correction")
        # micro-batching of the update comes from the config only (meta_info's micro-batch keys
        # belong to the log-prob passes)
        check_micro_batching(cfg, "actor")
        batch = data.batch.select(*_update_keys(cfg, data.batch.keys(), use_current))
        uid = prompt_ids(data, cfg, "actor")
        bypass = _check_rollout_correction(batch.keys(), rc_config, use_current)
        n = batch.batch_size[0]
        num_mini = n // self.engine.mini_batch_rows(n, cfg, "actor")
        if use_current and (cfg.ppo_epochs != 1 or num_mini != 1):
            raise ValueError(
                f"use_current_as_old_log_prob is exact only with one mini-batch and one epoch; got {num_mini} "
                f"mini-batches (rows {n} / mini-batch {int(cfg.ppo_mini_batch_size)}) and "
                f"actor.ppo_epochs={cfg.ppo_epochs}"
            )
        on_mini_batch = None
        if rc_config is not None and "rollout_is_weights" not in batch.keys() and not use_current and not bypass:
            on_mini_batch = _reject_once(batch, rc_config)
        loss_fn = functools.partial(
            ppo_loss,
            cfg,
            use_current_as_old=use_current,
            rollout_correction=rc_config,
            **_policy_loss(cfg, rc_config, bypass),
        )
        calc_entropy = cfg.entropy_coeff != 0
        try:
            out = self.engine.train(
                batch,
                self._forward(temperature, calc_entropy),
                loss_fn,
                cfg,
                "actor",
                uid=uid,
                loss_scale_factor=cfg.loss_scale_factor,
                on_mini_batch=on_mini_batch,
                keep=("log_probs", "entropys") if use_current else (),
                row_separable=_row_separable(cfg, rc_config, bypass),
            )
        finally:
            cfg.global_batch_info.clear()  # the last micro-batch's totals mean nothing after the update
        metrics = out.metrics
        if cfg.use_kl_loss:
            metrics["actor/kl_coef"] = [float(cfg.kl_loss_coef)]
        metrics["actor/padding_waste"] = [out.padding["padding_waste"]]
        return UpdateOutput(
            metrics,
            out.outputs.get("log_probs"),
            out.outputs.get("entropys") if calc_entropy else None,
            out.padding,
        )


# policy losses whose value is a sum of per-token terms over the global batch info: their gradient
# may be taken over chunks of rows (`DataParallelEngine.train(row_separable=True)`); losses that
# select tokens by batch statistics (clip_cov, kl_cov, ...) are not listed
_ROW_SEPARABLE_LOSSES = frozenset({"vanilla"})


def _row_separable(cfg, rc_config, bypass: bool) -> bool:
    """The update's loss is a sum of per-row terms: a listed policy loss, no rollout correction
    computed inside the loss (bypass mode, IS weights of the on-policy shortcut)."""
    loss_mode = config_get(cfg.policy_loss, "loss_mode", "vanilla")
    return loss_mode in _ROW_SEPARABLE_LOSSES and rc_config is None and not bypass


def _update_keys(cfg, present, use_current: bool) -> list[str]:
    """Batch keys the update reads, checking the required ones are there."""
    keys = list(_MODEL_INPUTS) + ["response_mask", "advantages"]
    if not use_current:
        if "old_log_probs" not in present:
            raise KeyError(
                "update_actor: the batch has no 'old_log_probs'; compute them first or set "
                "meta_info['use_current_as_old_log_prob']=True"
            )
        keys.append("old_log_probs")
    if cfg.use_kl_loss:
        if "ref_log_prob" not in present:
            raise KeyError(
                "actor.use_kl_loss=True but the batch has no 'ref_log_prob' (is the reference policy enabled?)"
            )
        keys.append("ref_log_prob")
    return keys + [k for k in ("rollout_log_probs", "rollout_is_weights") if k in present]


def _check_rollout_correction(present, rc_config, use_current: bool) -> bool:
    """Check that the batch carries what `meta_info["rollout_correction"]` needs; returns bypass_mode."""
    has_weights = "rollout_is_weights" in present
    has_rollout_lp = "rollout_log_probs" in present
    if rc_config is not None and not has_weights and not has_rollout_lp:
        raise KeyError(
            "meta_info['rollout_correction'] is set but the batch has no 'rollout_log_probs' "
            "(rollout.calculate_log_probs=True)"
        )
    rs_mode = config_get(rc_config, "rollout_rs")
    bypass = bool(config_get(rc_config, "bypass_mode", False))
    if bypass and use_current:
        raise ValueError(
            "algorithm.rollout_correction.bypass_mode=True uses the rollout log-probs as old_log_probs; "
            "it cannot be combined with meta_info['use_current_as_old_log_prob']"
        )
    if bypass and not has_rollout_lp:
        raise KeyError(
            "algorithm.rollout_correction.bypass_mode=True needs 'rollout_log_probs' in the batch "
            "(rollout.calculate_log_probs=True)"
        )
    batch_norm = bool(config_get(rc_config, "rollout_is_batch_normalize", False))
    if use_current and rc_config is not None and not has_weights and not bypass and (rs_mode is not None or batch_norm):
        key = f"rollout_rs={rs_mode!r}" if rs_mode is not None else "rollout_is_batch_normalize=True"
        raise ValueError(
            f"algorithm.rollout_correction.{key} needs the learner's old log-probs of the whole batch before the "
            "update (rejection changes the loss denominators; normalisation needs the batch mean): compute "
            "old_log_probs (do not use use_current_as_old_log_prob)"
        )
    return bypass


def _policy_loss(cfg, rc_config, bypass: bool) -> dict[str, Any]:
    """`policy_loss_fn` / `loss_config` for `ppo_loss`: the configured loss mode, or in bypass mode
    (upstream) the `bypass_mode` loss, which computes IS weights / rejection of the current policy
    against the rollout's log-probs (the old ones) and reads its settings from
    `policy_loss.rollout_correction`."""
    if not bypass:
        return {"policy_loss_fn": core_algos.get_policy_loss_fn(config_get(cfg.policy_loss, "loss_mode", "vanilla"))}
    overlay = _Overlay(
        cfg, policy_loss=_Overlay(cfg.policy_loss, rollout_correction=rc_config, loss_mode="bypass_mode")
    )
    return {"policy_loss_fn": core_algos.get_policy_loss_fn("bypass_mode"), "loss_config": overlay}


def _reject_once(batch, rc_config):
    """Rollout correction of this rank's batch, from the data alone: IS weights and the rejection
    mask are written into `batch` now, before any loss denominator is taken; the returned
    `on_mini_batch` hook reports the `rollout_corr/*` metrics once (token-weighted over ranks)."""
    from verl.trainer.ppo.algos.rollout_rejection import compute_rollout_correction

    weights, new_mask, rc_metrics = compute_rollout_correction(
        batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"], rc_config
    )
    batch["response_mask"] = new_mask.to(batch["response_mask"].dtype)
    if weights is not None:
        batch["rollout_is_weights"] = weights
    tokens = float(batch["response_mask"].sum())

    def report(_mb, meter: StepMeter) -> None:
        if len(meter.steps) == 1:
            for name, value in rc_metrics.items():
                meter.add_weighted(name, value, tokens)

    return report


class _Overlay:
    """`base` with some attributes replaced, read through attributes or `.get` like a config."""

    def __init__(self, base: Any, **overrides: Any):
        self.__dict__["_base"] = base
        self.__dict__["_overrides"] = overrides

    def __getattr__(self, name: str) -> Any:
        overrides = self.__dict__["_overrides"]
        if name in overrides:
            return overrides[name]
        return getattr(self.__dict__["_base"], name)

    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key, default)
        return default if value is None else value
