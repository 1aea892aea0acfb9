"""`DataParallelPPOCritic`: the value model engine (FSDP2-sharded or single process).

The model is a token-classification head with one output over a causal-LM backbone
(`verl.utils.model.build_value_model`): `logits[..., 0]` at position t is V(s_t). The value of
response token j is read at the position *before* it (the state in which token j was chosen), the
same convention as the log-probs. Micro-batches are length-sorted and padding-free like the actor's,
with the same machinery (`plan_micro_batches_for_mask`, `response_outputs`, and the mini-batch
helpers of `dp_actor`), and the clipped value loss is aggregated with
`core_algos.global_batch_info` so gradient accumulation is exact for any micro-batch split and
world size. A micro-batch whose loss is not finite on any rank is skipped on every rank; a
mini-batch whose gradient norm is not finite takes no optimizer step.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from verl.trainer.ppo import core_algos
from verl.utils.fsdp_utils import all_ranks_finite, autocast_context, dp_world_size
from verl.utils.seqlen_balancing import plan_micro_batches_for_mask, response_outputs
from verl.workers.actor.dp_actor import StepMeter, clip_and_step, global_loss_stats, mini_batch_order
from verl.workers.critic.base import BasePPOCritic

__all__ = ["DataParallelPPOCritic"]

logger = logging.getLogger(__name__)

_MODEL_INPUTS = ("responses", "input_ids", "attention_mask", "position_ids")


class DataParallelPPOCritic(BasePPOCritic):
    """PPO critic engine (upstream name and constructor).

    Args:
        config: `CriticConfig` with `ppo_mini_batch_size` already per rank in sequences.
        critic_module: value model whose output `.logits` is [b, T, 1].
        critic_optimizer: its optimizer.
        process_group, compute_dtype, use_remove_padding, pad_token_id: as `DataParallelPPOActor`.
    """

    def __init__(
        self,
        config,
        critic_module,
        critic_optimizer=None,
        process_group=None,
        compute_dtype=None,
        use_remove_padding: bool = True,
        pad_token_id: int = 0,
    ):
        super().__init__(config)
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.process_group = process_group
        self.dp_size = dp_world_size(process_group)
        self.compute_dtype = compute_dtype
        self.use_remove_padding = use_remove_padding
        self.pad_token_id = int(pad_token_id or 0)
        self.last_padding_stats: dict[str, float] = {}

    @property
    def _device(self) -> torch.device:
        return next(self.critic_module.parameters()).device

    def _forward_micro_batch(self, micro):
        """Values [m, R] of the response positions (0 where the response token is padding)."""
        device = self._device

        def values(keep, **inputs):
            return self.critic_module(**inputs, use_cache=False).logits[..., 0]

        device_type = "cuda" if device.type == "cuda" else "cpu"
        with autocast_context(device_type, self.compute_dtype):
            vpreds, resp_valid, stats = response_outputs(
                values,
                micro["input_ids"].to(device),
                micro["attention_mask"].to(device),
                micro["position_ids"].to(device),
                micro["responses"].shape[-1],
                self.pad_token_id,
                self.use_remove_padding,
            )
        vpreds = vpreds.float()
        return torch.where(resp_valid, vpreds, torch.zeros((), dtype=vpreds.dtype, device=vpreds.device)), stats

    def _plan(self, batch, micro_batch_size, use_dynamic_bsz: bool, max_token_len):
        return plan_micro_batches_for_mask(
            batch["attention_mask"],
            micro_batch_size,
            use_dynamic_bsz,
            max_token_len,
            self.use_remove_padding,
            self.process_group,
        )

    @torch.no_grad()
    def compute_values(self, data) -> torch.Tensor:
        """V(s) of every response position [b, R], times the response mask.

        meta_info: `micro_batch_size`, or `use_dynamic_bsz` + `max_token_len`.
        """
        meta = data.meta_info
        batch = data.batch.select(*_MODEL_INPUTS, "response_mask")
        groups = self._plan(
            batch, meta.get("micro_batch_size"), bool(meta.get("use_dynamic_bsz", False)), meta.get("max_token_len")
        )
        n, resp_len = batch["responses"].shape
        values = torch.zeros((n, resp_len), dtype=torch.float32)
        valid_sum = slot_sum = 0
        was_training = self.critic_module.training
        self.critic_module.eval()
        try:
            for group in groups:
                idx = torch.tensor(group, dtype=torch.long)
                v, (valid, slots) = self._forward_micro_batch(batch[idx])
                values[idx] = v.cpu()
                valid_sum += valid
                slot_sum += slots
        finally:
            self.critic_module.train(was_training)
        self.last_padding_stats = {"padding_waste": 1.0 - valid_sum / slot_sum if slot_sum else 0.0}
        return values * batch["response_mask"].to(values.dtype)

    def update_critic(self, data) -> dict[str, list[float]]:
        """Clipped value-loss updates: `ppo_epochs` x mini-batches x micro-batches.

        Batch keys: model inputs, `response_mask`, `values` (V_old from compute_values), `returns`.
        Returns metrics (one value per optimizer step): `critic/vf_loss`, `critic/vf_clipfrac`,
        `critic/vpred_mean`, `critic/grad_norm`, `critic/lr`; `critic/nonfinite_loss_skipped` (micro-batches) and
        `critic/nonfinite_grad_skipped_steps` (one value each for the whole call).
        """
        cfg = self.config
        micro_batch_size = cfg.ppo_micro_batch_size_per_gpu
        use_dynamic_bsz = bool(cfg.use_dynamic_bsz)
        max_token_len = cfg.ppo_max_token_len_per_gpu
        if not use_dynamic_bsz and micro_batch_size is None:
            raise ValueError(
                "critic.ppo_micro_batch_size_per_gpu is null and use_dynamic_bsz is False: set one of them"
            )
        for key in ("values", "returns"):
            if key not in data.batch.keys():
                raise KeyError(f"update_critic: the batch has no {key!r}")
        batch = data.batch.select(*_MODEL_INPUTS, "response_mask", "values", "returns")
        prompt_mean = cfg.loss_agg_mode == "prompt-mean"
        uid = data.non_tensor_batch.get("uid")
        if prompt_mean and uid is None:
            raise KeyError("critic.loss_agg_mode=prompt-mean needs the prompt ids: non_tensor_batch['uid'] is missing")
        uid = np.asarray(uid) if uid is not None else None
        n = batch.batch_size[0]
        mini = int(cfg.ppo_mini_batch_size)
        if n % mini:
            raise ValueError(
                f"update_critic got {n} rows on this rank, not a multiple of the per-rank mini-batch "
                f"of {mini} sequences "
                "(critic.ppo_mini_batch_size x rollout.n / data-parallel size)"
            )
        meter = StepMeter()
        self.critic_module.train()
        params = [p for p in self.critic_module.parameters() if p.requires_grad]
        skipped_micro = 0
        skipped_steps = 0
        for epoch in range(cfg.ppo_epochs):
            order = mini_batch_order(n, cfg.shuffle, cfg.data_loader_seed, epoch)
            for k in range(n // mini):
                rows = order[k * mini : (k + 1) * mini]
                mb = batch[rows]
                mb_uid = uid[rows.numpy()] if prompt_mean else None
                meter.new_step()
                stats = global_loss_stats(mb["response_mask"], mb_uid, self.process_group)
                self.critic_optimizer.zero_grad(set_to_none=True)
                contributed = 0
                for group in self._plan(mb, micro_batch_size, use_dynamic_bsz, max_token_len):
                    micro = mb[torch.tensor(group, dtype=torch.long)]
                    mask = micro["response_mask"].to(self._device)
                    vpreds, _ = self._forward_micro_batch(micro)
                    returns = micro["returns"].to(self._device)
                    info = core_algos.make_global_batch_info(
                        stats, index=mb_uid[group] if prompt_mean else None, dp_size=self.dp_size, device=self._device
                    )
                    with core_algos.global_batch_info(**info):
                        vf_loss, vf_clipfrac = core_algos.compute_value_loss(
                            vpreds,
                            returns,
                            micro["values"].to(self._device),
                            mask,
                            cfg.cliprange_value,
                            cfg.loss_agg_mode,
                        )
                    if not all_ranks_finite(vf_loss, self.process_group):
                        skipped_micro += 1
                        logger.warning("critic: non-finite value loss in a micro-batch; skipped (not back-propagated)")
                        continue
                    vf_loss.backward()
                    contributed += 1
                    n_tok = float(mask.sum())
                    meter.add_sum("critic/vf_loss", vf_loss.item() / self.dp_size)
                    meter.add_weighted("critic/vf_clipfrac", float(vf_clipfrac), n_tok)
                    # critic/vf_explained_var has one producer: the driver's compute_data_metrics
                    v = vpreds.detach()[mask.bool()].double().cpu()
                    meter.add_weighted("critic/vpred_mean", float(v.mean()) if v.numel() else 0.0, n_tok)
                if contributed == 0:
                    skipped_steps += 1
                    meter.set("critic/grad_norm", float("nan"))
                    continue
                if not clip_and_step(self.critic_optimizer, params, cfg.grad_clip, meter, "critic"):
                    skipped_steps += 1
        self.critic_optimizer.zero_grad(set_to_none=True)
        metrics = meter.reduce(self.process_group, self.dp_size)
        metrics["critic/nonfinite_loss_skipped"] = [float(skipped_micro)]
        metrics["critic/nonfinite_grad_skipped_steps"] = [float(skipped_steps)]
        return metrics
