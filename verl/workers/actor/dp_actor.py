"""`DataParallelPPOActor`: the policy engine over an FSDP2-sharded (or single-process) causal LM.

Data layout (upstream contract). A batch row is a left-padded prompt followed by a right-padded
response: `input_ids`, `attention_mask`, `position_ids` are [b, P + R], `responses` and
`response_mask` are [b, R]. Log-probabilities, entropies and advantages live on the response
columns only ([b, R]); positions where the response mask is 0 hold 0.

Padding is not computed. Each micro-batch is built from rows of similar length (rows sorted by
valid length, see `verl.utils.seqlen_balancing.plan_micro_batches_for_mask`), and each row's
padding is removed (`compact_rows`, through `response_outputs`): the model runs on
[m, longest valid row of the micro-batch] with the original position ids, which is the same
function of the valid tokens as the padded forward. Models that accept transformers'
`logits_to_keep` project only the positions from the first response token on onto the vocabulary.
`padding_waste` in the metrics is the share of computed token slots that are padding. With
`use_remove_padding=False` the padded rows are fed as they are (reference path). The critic
(`dp_critic.py`) shares this machinery and the mini-batch helpers of this module.

Temperature. The rollout samples from softmax(logits / T) and reports log-probs under that
distribution; `compute_log_prob` and `update_policy` divide the logits by the same T
(`meta_info["temperature"]`, default 1.0), so rollout, old and current log-probs are all of the
same distribution; T = 0 (greedy decoding) means T = 1 on both sides
(`verl.workers.rollout.base.logprob_temperature`). Top-k / top-p truncation is not applied to
log-probs (as upstream).

Loss (per mini-batch, summed over micro-batches without any 1/n_micro factor):
`policy_loss - entropy_coeff * agg(entropy) + kl_loss_coef * agg(kl(logp, ref_logp))`, where every
`agg` is `core_algos.agg_loss` under `core_algos.global_batch_info` holding the mini-batch totals
over all data-parallel ranks, so every aggregation mode gives exactly the full mini-batch loss and
gradient whatever the micro-batch split and world size.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import verl.utils.torch_functional as verl_F
from verl.trainer.ppo import core_algos
from verl.utils.fsdp_utils import all_ranks_finite, autocast_context, clip_grad_norm_, collective_device, dp_world_size
from verl.utils.model import accepts_logits_to_keep
from verl.utils.seqlen_balancing import (
    group_shared_prompts,
    plan_micro_batches_for_mask,
    response_outputs,
    shared_prefix_outputs,
)
from verl.workers.actor.base import BasePPOActor
from verl.workers.rollout.base import logprob_temperature

__all__ = ["DataParallelPPOActor"]

logger = logging.getLogger(__name__)

_MODEL_INPUTS = ("responses", "input_ids", "attention_mask", "position_ids")


def global_loss_stats(response_mask: torch.Tensor, uid, group=None) -> core_algos.BatchLossStats:
    """Aggregation denominators of a mini-batch summed over the data-parallel ranks of `group`.

    `uid` ([b] prompt ids) is needed only for `prompt-mean`; groups split across ranks are merged
    by id (an all_gather_object of the per-rank counts), else two integers are all-reduced.
    """
    local = core_algos.compute_batch_loss_stats(response_mask, uid)
    dp_size = dp_world_size(group)
    if dp_size == 1:
        return local
    if uid is not None:
        gathered = [None] * dp_size
        dist.all_gather_object(gathered, local, group=group)
        return core_algos.merge_batch_loss_stats(gathered)
    t = torch.tensor([local.num_tokens, local.num_seqs], dtype=torch.int64, device=collective_device(group))
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return core_algos.BatchLossStats(num_tokens=int(t[0]), num_seqs=int(t[1]))


class StepMeter:
    """Per-optimizer-step metrics, reduced over data-parallel ranks in one collective at the end.

    - `add_sum(name, v)`: values whose sum over micro-batches and ranks is the mini-batch value
      (loss shares).
    - `add_weighted(name, v, w)`: weighted means (token-weighted clip fractions, KL...).
    - `set(name, v)`: values already identical on every rank (grad norm, lr, counters).
    """

    def __init__(self):
        self.steps: list[dict[str, Any]] = []

    def new_step(self):
        self.steps.append({"sum": defaultdict(float), "wsum": defaultdict(float), "w": defaultdict(float), "set": {}})

    def add_sum(self, name, value):
        self.steps[-1]["sum"][name] += float(value)

    def add_weighted(self, name, value, weight):
        self.steps[-1]["wsum"][name] += float(value) * float(weight)
        self.steps[-1]["w"][name] += float(weight)

    def set(self, name, value):
        self.steps[-1]["set"][name] = float(value)

    def reduce(self, group, dp_size: int) -> dict[str, list[float]]:
        sum_names = sorted({k for s in self.steps for k in s["sum"]})
        w_names = sorted({k for s in self.steps for k in s["w"]})
        if dp_size > 1:
            # a metric seen on some ranks only (e.g. a user loss that reports a key conditionally)
            # must not misalign the table: agree on the names first
            gathered = [None] * dp_size
            dist.all_gather_object(gathered, (sum_names, w_names), group=group)
            sum_names = sorted({k for names, _ in gathered for k in names})
            w_names = sorted({k for _, names in gathered for k in names})
        rows = []
        for s in self.steps:
            rows.append(
                [s["sum"].get(k, 0.0) for k in sum_names]
                + [s["wsum"].get(k, 0.0) for k in w_names]
                + [s["w"].get(k, 0.0) for k in w_names]
            )
        table = torch.tensor(rows, dtype=torch.float64) if rows else torch.zeros((0, 0), dtype=torch.float64)
        if dp_size > 1 and table.numel():
            t = table.to(collective_device(group))
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
            table = t.cpu()
        out: dict[str, list[float]] = defaultdict(list)
        n_sum, n_w = len(sum_names), len(w_names)
        for i, s in enumerate(self.steps):
            for j, k in enumerate(sum_names):
                out[k].append(float(table[i, j]))
            for j, k in enumerate(w_names):
                weight = float(table[i, n_sum + n_w + j])
                if weight > 0:
                    out[k].append(float(table[i, n_sum + j]) / weight)
            for k, v in s["set"].items():
                out[k].append(v)
        return dict(out)


def mini_batch_order(n: int, shuffle: bool, seed: int, epoch: int) -> torch.Tensor:
    """Row order of one epoch: a permutation seeded by `seed + epoch` (the same on every rank), or
    0..n-1."""
    if shuffle:
        return torch.randperm(n, generator=torch.Generator().manual_seed(int(seed) + epoch))
    return torch.arange(n)


def clip_and_step(optimizer: torch.optim.Optimizer, params, grad_clip, meter: StepMeter, prefix: str) -> bool:
    """End of a mini-batch: clip the gradients, record `<prefix>/grad_norm` and `<prefix>/lr`, and
    take the optimizer step unless the norm is not finite (then the gradients are dropped).
    Returns whether the step was taken."""
    grad_norm = clip_grad_norm_(params, grad_clip)
    meter.set(f"{prefix}/grad_norm", float(grad_norm))
    meter.set(f"{prefix}/lr", optimizer.param_groups[0]["lr"])
    if not torch.isfinite(grad_norm):
        logger.warning("%s: grad norm is %s; optimizer step skipped", prefix, float(grad_norm))
        optimizer.zero_grad(set_to_none=True)
        return False
    optimizer.step()
    return True


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
        self.process_group = process_group
        self.dp_size = dp_world_size(process_group)
        self.compute_dtype = compute_dtype
        self.use_remove_padding = use_remove_padding
        self.pad_token_id = int(pad_token_id or 0)
        self.last_padding_stats: dict[str, float] = {}
        self._logits_to_keep = accepts_logits_to_keep(actor_module)
        self._cache_kwarg = prefix_cache_kwarg(actor_module)
        self.prefix_groups_used = 0  # micro-batches computed with shared prompts (the prefix grouper)

    # ------------------------------------------------------------------------------------------
    # forward
    # ------------------------------------------------------------------------------------------

    @property
    def _device(self) -> torch.device:
        return next(self.actor_module.parameters()).device

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
        device = self._device
        responses = micro["responses"].to(device)

        def logits(keep, **inputs):
            extra = {"logits_to_keep": keep} if self._logits_to_keep else {}
            return self.actor_module(**inputs, use_cache=False, **extra).logits

        device_type = "cuda" if device.type == "cuda" else "cpu"
        input_ids = micro["input_ids"].to(device)
        attention_mask = micro["attention_mask"].to(device)
        position_ids = micro["position_ids"].to(device)
        groups = self._prompt_groups(input_ids, attention_mask, position_ids, responses.shape[-1])
        with autocast_context(device_type, self.compute_dtype):
            if groups is not None:
                self.prefix_groups_used += 1
                resp_logits, resp_valid, (valid_tokens, slots) = shared_prefix_outputs(
                    self.actor_module,
                    groups,
                    input_ids,
                    attention_mask,
                    position_ids,
                    responses.shape[-1],
                    cache_kwarg=self._cache_kwarg,
                    logits_to_keep=self._logits_to_keep,
                )
            else:
                resp_logits, resp_valid, (valid_tokens, slots) = response_outputs(
                    logits,
                    input_ids,
                    attention_mask,
                    position_ids,
                    responses.shape[-1],
                    self.pad_token_id,
                    self.use_remove_padding,
                )
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
        return entropy, log_probs, (valid_tokens, slots)

    def _prompt_groups(self, input_ids, attention_mask, position_ids, response_length):
        """Rows sharing a prompt, when the prefix grouper applies (`actor.use_prefix_grouper`, a model
        with a KV cache, `use_remove_padding`, 1-D position ids per row, no gradient checkpointing
        while training), else None."""
        if not self.config.get("use_prefix_grouper", False) or self._cache_kwarg is None or not self.use_remove_padding:
            return None
        if position_ids.dim() != 2:  # multi-axis rope (vision-language models): plain path
            return None
        if self.actor_module.training and _activation_checkpointing(self.actor_module):
            return None
        return group_shared_prompts(input_ids, attention_mask, response_length)

    def _plan(
        self, batch, micro_batch_size: int | None, use_dynamic_bsz: bool, max_token_len: int | None
    ) -> list[list[int]]:
        return plan_micro_batches_for_mask(
            batch["attention_mask"],
            micro_batch_size,
            use_dynamic_bsz,
            max_token_len,
            self.use_remove_padding,
            self.process_group,
        )

    # ------------------------------------------------------------------------------------------
    # compute_log_prob
    # ------------------------------------------------------------------------------------------

    @torch.no_grad()
    def compute_log_prob(self, data, calculate_entropy: bool = False):
        """Log-probs of `data.batch["responses"]` under the current policy.

        meta_info: `micro_batch_size` (rows per forward), or `use_dynamic_bsz` with
        `max_token_len` (token budget per forward); `temperature` (default 1.0).
        Returns:
            log_probs [b, R] (and entropys [b, R] when `calculate_entropy`, else None), in the
            row order of `data`.
        """
        meta = data.meta_info
        temperature = logprob_temperature(meta.get("temperature", 1.0))
        batch = data.batch.select(*_MODEL_INPUTS)
        groups = self._plan(
            batch, meta.get("micro_batch_size"), bool(meta.get("use_dynamic_bsz", False)), meta.get("max_token_len")
        )
        was_training = self.actor_module.training
        self.actor_module.eval()
        n, resp_len = batch["responses"].shape
        log_probs = torch.zeros((n, resp_len), dtype=torch.float32)
        entropys = torch.zeros((n, resp_len), dtype=torch.float32) if calculate_entropy else None
        valid_sum = slot_sum = 0
        try:
            for group in groups:
                idx = torch.tensor(group, dtype=torch.long)
                entropy, lp, (valid, slots) = self._forward_micro_batch(batch[idx], temperature, calculate_entropy)
                log_probs[idx] = lp.float().cpu()
                if calculate_entropy:
                    entropys[idx] = entropy.float().cpu()
                valid_sum += valid
                slot_sum += slots
        finally:
            self.actor_module.train(was_training)
        self.last_padding_stats = {
            "valid_tokens": float(valid_sum),
            "token_slots": float(slot_sum),
            "padding_waste": 1.0 - valid_sum / slot_sum if slot_sum else 0.0,
            "num_micro_batches": float(len(groups)),
        }
        return log_probs, entropys

    # ------------------------------------------------------------------------------------------
    # update_policy
    # ------------------------------------------------------------------------------------------

    def _loss_stats(self, response_mask: torch.Tensor, uid) -> core_algos.BatchLossStats:
        return global_loss_stats(response_mask, uid, self.process_group)

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
            metrics: name -> list with one value per optimizer step (reduced over ranks).
            With `use_current_as_old_log_prob`, `self.last_old_log_probs` / `last_entropys` hold
            the detached log-probs [b, R] in the row order of `data`.
        """
        cfg = self.config
        if self.actor_optimizer is None:
            raise RuntimeError("update_policy called on an actor without optimizer (reference policy?)")
        meta = data.meta_info
        temperature = logprob_temperature(meta.get("temperature", 1.0))
        use_current = bool(meta.get("use_current_as_old_log_prob", False))
        rc_config = meta.get("rollout_correction")
        # micro-batching of the update comes from the config only (meta_info's micro-batch keys
        # belong to the log-prob passes)
        micro_batch_size = cfg.ppo_micro_batch_size_per_gpu
        use_dynamic_bsz = bool(cfg.use_dynamic_bsz)
        max_token_len = cfg.ppo_max_token_len_per_gpu
        if not use_dynamic_bsz and micro_batch_size is None:
            raise ValueError("actor.ppo_micro_batch_size_per_gpu is null and use_dynamic_bsz is False: set one of them")

        keys = list(_MODEL_INPUTS) + ["response_mask", "advantages"]
        if not use_current:
            if "old_log_probs" not in data.batch.keys():
                raise KeyError(
                    "update_actor: the batch has no 'old_log_probs'; compute them first or set "
                    "meta_info['use_current_as_old_log_prob']=True"
                )
            keys.append("old_log_probs")
        if cfg.use_kl_loss:
            if "ref_log_prob" not in data.batch.keys():
                raise KeyError(
                    "actor.use_kl_loss=True but the batch has no 'ref_log_prob' (is the reference policy enabled?)"
                )
            keys.append("ref_log_prob")
        for optional in ("rollout_log_probs", "rollout_is_weights"):
            if optional in data.batch.keys():
                keys.append(optional)
        batch = data.batch.select(*keys)
        prompt_mean = cfg.loss_agg_mode == "prompt-mean"
        uid = data.non_tensor_batch.get("uid")
        if prompt_mean and uid is None:
            raise KeyError("actor.loss_agg_mode=prompt-mean needs the prompt ids: non_tensor_batch['uid'] is missing")
        if uid is not None:
            uid = np.asarray(uid)
        has_weights = "rollout_is_weights" in batch.keys()
        has_rollout_lp = "rollout_log_probs" in batch.keys()
        if rc_config is not None and not has_weights and not has_rollout_lp:
            raise KeyError(
                "meta_info['rollout_correction'] is set but the batch has no 'rollout_log_probs' "
                "(rollout.calculate_log_probs=True)"
            )
        rs_mode = core_algos.config_get(rc_config, "rollout_rs")
        bypass = bool(core_algos.config_get(rc_config, "bypass_mode", False))
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
        batch_norm = bool(core_algos.config_get(rc_config, "rollout_is_batch_normalize", False))
        if (
            use_current
            and rc_config is not None
            and not has_weights
            and not bypass
            and (rs_mode is not None or batch_norm)
        ):
            key = f"rollout_rs={rs_mode!r}" if rs_mode is not None else "rollout_is_batch_normalize=True"
            raise ValueError(
                f"algorithm.rollout_correction.{key} needs the learner's old log-probs of the whole batch before the "
                "update (rejection changes the loss denominators; normalisation needs the batch mean): compute "
                "old_log_probs (do not use use_current_as_old_log_prob)"
            )

        n = batch.batch_size[0]
        mini = int(cfg.ppo_mini_batch_size)
        if n % mini:
            raise ValueError(
                f"update_actor got {n} rows on this rank, not a multiple of the per-rank mini-batch "
                f"of {mini} sequences "
                "(actor.ppo_mini_batch_size x rollout.n / data-parallel size)"
            )
        num_mini = n // mini
        if use_current and (cfg.ppo_epochs != 1 or num_mini != 1):
            raise ValueError(
                f"use_current_as_old_log_prob is exact only with one mini-batch and one epoch; got {num_mini} "
                f"mini-batches (rows {n} / mini-batch {mini}) and actor.ppo_epochs={cfg.ppo_epochs}"
            )

        loss_config: Any = cfg
        if bypass:
            # bypass mode (upstream): old_log_probs are the rollout's; the bypass_mode loss computes IS
            # weights / rejection of the current policy against them and reads its settings from
            # policy_loss.rollout_correction
            policy_loss_fn = core_algos.get_policy_loss_fn("bypass_mode")
            loss_config = _Overlay(
                cfg, policy_loss=_Overlay(cfg.policy_loss, rollout_correction=rc_config, loss_mode="bypass_mode")
            )
        else:
            policy_loss_fn = core_algos.get_policy_loss_fn(
                core_algos.config_get(cfg.policy_loss, "loss_mode", "vanilla")
            )
        rc_metrics: dict[str, float] = {}
        if rc_config is not None and not has_weights and not use_current and not bypass:
            # depends only on the data: once for this rank's batch, before any loss denominator
            weights, new_mask, rc_metrics = _rollout_correction(
                batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"], rc_config
            )
            batch["response_mask"] = new_mask.to(batch["response_mask"].dtype)
            if weights is not None:
                batch["rollout_is_weights"] = weights
        rc_tokens = float(batch["response_mask"].sum())
        calc_entropy = cfg.entropy_coeff != 0
        meter = StepMeter()
        self.actor_module.train()
        params = [p for p in self.actor_module.parameters() if p.requires_grad]
        resp_len = batch["responses"].shape[-1]
        last_old = torch.zeros((n, resp_len), dtype=torch.float32) if use_current else None
        last_ent = torch.zeros((n, resp_len), dtype=torch.float32) if use_current else None
        skipped_micro = 0
        skipped_steps = 0
        valid_sum = slot_sum = 0

        for epoch in range(cfg.ppo_epochs):
            order = mini_batch_order(n, cfg.shuffle, cfg.data_loader_seed, epoch)
            for k in range(num_mini):
                rows = order[k * mini : (k + 1) * mini]
                mb = batch[rows]
                mb_uid = uid[rows.numpy()] if uid is not None else None
                meter.new_step()
                if rc_metrics and len(meter.steps) == 1:
                    # reported once per call (one value per rank, token-weighted over ranks)
                    for name, value in rc_metrics.items():
                        meter.add_weighted(name, value, rc_tokens)
                stats = self._loss_stats(mb["response_mask"], mb_uid if prompt_mean else None)
                groups = self._plan(mb, micro_batch_size, use_dynamic_bsz, max_token_len)
                self.actor_optimizer.zero_grad(set_to_none=True)
                contributed = 0
                for group in groups:
                    gidx = torch.tensor(group, dtype=torch.long)
                    micro = mb[gidx]
                    mask = micro["response_mask"].to(self._device)
                    n_tok = float(mask.sum())
                    entropy, log_prob, (valid, slots) = self._forward_micro_batch(micro, temperature, calc_entropy)
                    valid_sum += valid
                    slot_sum += slots
                    if use_current:
                        old_log_prob = log_prob.detach()
                        last_old[rows[gidx]] = old_log_prob.float().cpu()
                        if entropy is not None:
                            last_ent[rows[gidx]] = entropy.detach().float().cpu()
                    else:
                        old_log_prob = micro["old_log_probs"].to(self._device)
                    advantages = micro["advantages"].to(self._device)
                    weights = (
                        micro["rollout_is_weights"].to(self._device) if "rollout_is_weights" in micro.keys() else None
                    )
                    if use_current and has_rollout_lp:
                        rollout_lp = micro["rollout_log_probs"].to(self._device)
                        # compute_log_prob did not run: report the mismatch under its names
                        micro_rc = _mismatch_metrics(old_log_prob, rollout_lp, mask)
                        if rc_config is not None and weights is None and not bypass:
                            weights, _, rc_only = _rollout_correction(old_log_prob, rollout_lp, mask, rc_config)
                            micro_rc.update(rc_only)
                        for name, value in micro_rc.items():
                            meter.add_weighted(name, value, n_tok)

                    info = core_algos.make_global_batch_info(
                        stats,
                        index=mb_uid[group] if prompt_mean else None,
                        dp_size=self.dp_size,
                        loss_scale_factor=cfg.loss_scale_factor,
                        device=self._device,
                    )
                    with core_algos.global_batch_info(**info):
                        pg_loss, pg_metrics = core_algos.unpack_policy_loss_output(
                            policy_loss_fn(
                                old_log_prob=old_log_prob,
                                log_prob=log_prob,
                                advantages=advantages,
                                response_mask=mask,
                                loss_agg_mode=cfg.loss_agg_mode,
                                config=loss_config,
                                rollout_is_weights=weights,
                            )
                        )
                        loss = pg_loss
                        if calc_entropy:
                            entropy_term = core_algos.agg_loss(entropy, mask, cfg.loss_agg_mode)
                            loss = loss - cfg.entropy_coeff * entropy_term
                        if cfg.use_kl_loss:
                            ref = micro["ref_log_prob"].to(self._device)
                            kl = core_algos.kl_penalty(log_prob, ref, cfg.kl_loss_type)
                            kl_term = core_algos.agg_loss(kl, mask, cfg.loss_agg_mode)
                            loss = loss + cfg.kl_loss_coef * kl_term
                    if not all_ranks_finite(loss, self.process_group):
                        skipped_micro += 1
                        logger.warning("actor: non-finite loss in a micro-batch; skipped (not back-propagated)")
                        continue
                    loss.backward()
                    contributed += 1
                    # shares carry a dp_size factor (FSDP averages gradients); undo it for the values
                    meter.add_sum("actor/pg_loss", pg_loss.item() / self.dp_size)
                    meter.add_sum("actor/loss", loss.item() / self.dp_size)
                    if calc_entropy:
                        meter.add_sum("actor/entropy", entropy_term.item() / self.dp_size)
                    if cfg.use_kl_loss:
                        meter.add_sum("actor/kl_loss", kl_term.item() / self.dp_size)
                    for name, value in pg_metrics.items():
                        meter.add_weighted(name, value, n_tok)

                if contributed == 0:
                    skipped_steps += 1
                    meter.set("actor/grad_norm", float("nan"))
                    continue
                if not clip_and_step(self.actor_optimizer, params, cfg.grad_clip, meter, "actor"):
                    skipped_steps += 1
        self.actor_optimizer.zero_grad(set_to_none=True)

        metrics = meter.reduce(self.process_group, self.dp_size)
        if cfg.use_kl_loss:
            metrics["actor/kl_coef"] = [float(cfg.kl_loss_coef)]
        metrics["actor/nonfinite_loss_skipped"] = [float(skipped_micro)]
        metrics["actor/nonfinite_grad_skipped_steps"] = [float(skipped_steps)]
        metrics["actor/padding_waste"] = [1.0 - valid_sum / slot_sum if slot_sum else 0.0]
        self.last_padding_stats = {
            "valid_tokens": float(valid_sum),
            "token_slots": float(slot_sum),
            "padding_waste": metrics["actor/padding_waste"][0],
        }
        self.last_old_log_probs = last_old
        self.last_entropys = last_ent if calc_entropy else None
        return metrics


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


def _activation_checkpointing(module) -> bool:
    # transformers 5 renamed is_gradient_checkpointing (deprecated) to is_activation_checkpointing
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(module), name) or hasattr(module, name):
            return bool(getattr(module, name))
    return False


def prefix_cache_kwarg(module) -> str | None:
    """Name of the KV-cache argument of `module`'s forward (`cache` in transformers >= 5.2x,
    `past_key_values` before), or None when it takes neither (the prefix grouper is then off)."""
    import inspect

    # a peft model forwards its keyword arguments to the wrapped model: read that one's signature
    inner = module.get_base_model() if callable(getattr(module, "get_base_model", None)) else module
    try:
        params = inspect.signature(type(inner).forward).parameters
    except (TypeError, ValueError):
        return None
    if "use_cache" not in params:
        return None
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


def _rollout_correction(old_log_prob, rollout_log_prob, response_mask, rc_config):
    from verl.trainer.ppo.algos.rollout_rejection import compute_rollout_correction

    return compute_rollout_correction(old_log_prob, rollout_log_prob, response_mask, rc_config)


def _mismatch_metrics(old_log_prob, rollout_log_prob, response_mask) -> dict[str, float]:
    """`rollout_mismatch/*`, the names the worker's compute_log_prob reports them under."""
    from verl.trainer.ppo.algos.rollout_rejection import compute_mismatch_metrics

    return compute_mismatch_metrics(old_log_prob, rollout_log_prob, response_mask, prefix="rollout_mismatch/")
