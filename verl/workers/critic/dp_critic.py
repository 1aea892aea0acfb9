"""`DataParallelPPOCritic`: the value model engine (FSDP2-sharded or single process).

The model is a token-classification head with one output over a causal-LM backbone
(`verl.utils.model.build_value_model`): `logits[..., 0]` at position t is V(s_t). The value of
response token j is read at the position *before* it (the state in which token j was chosen), the
same convention as the log-probs. The critic is a thin facade over the engine shared with the actor
(`verl.workers.engine.DataParallelEngine`: length-sorted padding-free micro-batches, the prefix
grouper where exact, the epoch x mini-batch x micro-batch loop) and the loss function
`verl.workers.utils.losses.value_loss`, given the mini-batch totals (`batch_info`) so gradient
accumulation is exact for any micro-batch split and world size. A micro-batch whose loss is not
finite on any rank is skipped on every rank; a mini-batch whose gradient norm is not finite takes
no optimizer step.
"""

from __future__ import annotations

import functools

import torch

from verl.workers.critic.base import BasePPOCritic
from verl.workers.engine.dp_engine import DataParallelEngine, InferOutput, check_micro_batching, prompt_ids
from verl.workers.utils.losses import value_loss

__all__ = ["DataParallelPPOCritic"]

_MODEL_INPUTS = ("responses", "input_ids", "attention_mask", "position_ids")


class DataParallelPPOCritic(BasePPOCritic):
    """PPO critic engine (upstream name and constructor).

    Args:
        config: `CriticConfig` with `ppo_mini_batch_size` already per rank in sequences.
        critic_module: value model whose output `.logits` is [b, T, 1].
        critic_optimizer: its optimizer.
        process_group, compute_dtype, use_remove_padding, pad_token_id: as `DataParallelPPOActor`.
        use_prefix_grouper: rows repeating a prompt share one prompt forward where exact (the
            values equal the per-row forward's up to float summation order).
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
        use_prefix_grouper: bool = True,
    ):
        super().__init__(config)
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.engine = DataParallelEngine(
            critic_module,
            critic_optimizer,
            process_group,
            compute_dtype,
            use_remove_padding,
            pad_token_id,
            use_prefix_grouper=use_prefix_grouper,
            value_head=True,
        )

    def _forward_micro_batch(self, micro):
        """Values [m, R] of the response positions (0 where the response token is padding), and the
        (valid tokens, token slots) of the forward."""
        vpreds, resp_valid, stats = self.engine.response_outputs(micro)
        vpreds = vpreds.float()
        return torch.where(resp_valid, vpreds, torch.zeros((), dtype=vpreds.dtype, device=vpreds.device)), stats

    def _forward(self, micro):
        values, stats = self._forward_micro_batch(micro)
        return {"values": values}, stats

    def infer(self, data) -> InferOutput:
        """`compute_values` with its padding figures: output `values` [b, R] (not yet masked)."""
        meta = data.meta_info
        return self.engine.infer(
            data.batch.select(*_MODEL_INPUTS),
            self._forward,
            meta.get("micro_batch_size"),
            bool(meta.get("use_dynamic_bsz", False)),
            meta.get("max_token_len"),
        )

    def compute_values(self, data) -> torch.Tensor:
        """V(s) of every response position [b, R], times the response mask.

        meta_info: `micro_batch_size`, or `use_dynamic_bsz` + `max_token_len`.
        """
        values = self.infer(data).outputs["values"]
        return values * data.batch["response_mask"].to(values.dtype)

    def update_critic(self, data) -> dict[str, list[float]]:
        """Clipped value-loss updates: `ppo_epochs` x mini-batches x micro-batches.

        Batch keys: model inputs, `response_mask`, `values` (V_old from compute_values), `returns`.
        Returns metrics (one value per optimizer step): `critic/vf_loss`, `critic/vf_clipfrac`,
        `critic/vpred_mean`, `critic/grad_norm`, `critic/lr`; `critic/nonfinite_loss_skipped` (micro-batches) and
        `critic/nonfinite_grad_skipped_steps` (one value each for the whole call).
        """
        cfg = self.config
        check_micro_batching(cfg, "critic")
        for key in ("values", "returns"):
            if key not in data.batch.keys():
                raise KeyError(f"update_critic: the batch has no {key!r}")
        batch = data.batch.select(*_MODEL_INPUTS, "response_mask", "values", "returns")
        uid = prompt_ids(data, cfg, "critic")
        out = self.engine.train(batch, self._forward, functools.partial(value_loss, cfg), cfg, "critic", uid=uid)
        return out.metrics
