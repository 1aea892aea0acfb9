"""`DataParallelEngine`: the data-parallel loop shared by the actor, the critic and the reward model.

An engine owns one model (FSDP2-sharded or plain), its optimizer (None for a frozen model) and its
data-parallel group, and knows nothing of PPO. It offers:

- `plan(batch, ...)`: the micro-batches of a batch (rows of similar length together; with a token
  budget every rank runs the same number, see `verl.utils.seqlen_balancing`).
- `response_outputs(micro, ...)`: one forward of a micro-batch, read at the positions that predict
  the response tokens (padding-free, or with the prefix grouper where exact; see `padding_free`).
- `infer(batch, fn, ...)`: a no-grad pass in eval mode; `fn(micro)` gives per-row outputs [m, R]
  that are scattered back into [b, R] tensors in the row order of the batch.
- `train(batch, forward, loss_fn, config, ...)`: `ppo_epochs` x mini-batches (one optimizer step
  each) x micro-batches, returning a `TrainOutput`.

Exactness contract of `train`. Every loss is a sum over micro-batches with no 1/n_micro factor: the
loss function is given the mini-batch totals over all data-parallel ranks (`global_loss_stats`) as
`batch_info=` and aggregates with `core_algos.agg_loss(..., **batch_info)`, so each aggregation mode gives
the full mini-batch loss and gradient whatever the micro-batch split and world size. Those totals are
taken per mini-batch after the `on_mini_batch` hook (which may rewrite the response mask, e.g.
rollout rejection). Collectives run here and never in a loss function: every rank runs the same
number of micro-batches, and a micro-batch whose loss is not finite on any rank is skipped on every
rank (`all_ranks_finite`); a mini-batch whose gradient norm is not finite takes no optimizer step.
"""

from __future__ import annotations

import logging
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from verl.trainer.ppo import core_algos
from verl.utils.fsdp_utils import all_ranks_finite, autocast_context, clip_grad_norm_, collective_device, dp_world_size
from verl.utils.model import accepts_logits_to_keep
from verl.utils.seqlen_balancing import plan_micro_batches_for_mask
from verl.workers.engine.padding_free import (
    activation_checkpointing,
    group_shared_prompts,
    prefix_cache_kwarg,
    response_outputs,
    row_chunks,
    shared_prefix_outputs,
)

__all__ = [
    "DataParallelEngine",
    "InferOutput",
    "LossShare",
    "StepMeter",
    "TrainOutput",
    "check_micro_batching",
    "clip_and_step",
    "global_loss_stats",
    "mini_batch_order",
    "prompt_ids",
    "step_lr_scheduler",
]

logger = logging.getLogger(__name__)

# On CPU, a training micro-batch computing more tokens than this runs its forward + backward in
# chunks of whole prompt groups when the loss is a sum of per-row terms (`train(row_separable=
# True)`): only one chunk's activations are alive at a time (the long shape's update: -4% to -12%,
# docs/performance.md).
CPU_CHUNK_TOKENS = 4096


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


class LossShare(float):
    """A loss-function metric whose sum over micro-batches and ranks is the mini-batch value (a
    share of the loss). Shares carry the data-parallel factor of the loss (FSDP averages gradients
    over ranks); the engine divides it out. Plain floats are token-weighted means instead."""


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

    def _names(self, group, dp_size: int) -> tuple[list[str], list[str]]:
        sum_names = sorted({k for s in self.steps for k in s["sum"]})
        w_names = sorted({k for s in self.steps for k in s["w"]})
        if dp_size > 1:
            # a metric seen on some ranks only (e.g. a user loss that reports a key conditionally)
            # must not misalign the table: agree on the names first
            gathered = [None] * dp_size
            dist.all_gather_object(gathered, (sum_names, w_names), group=group)
            sum_names = sorted({k for names, _ in gathered for k in names})
            w_names = sorted({k for _, names in gathered for k in names})
        return sum_names, w_names

    def reduce(self, group, dp_size: int) -> dict[str, list[float]]:
        sum_names, w_names = self._names(group, dp_size)
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


def step_lr_scheduler(scheduler) -> None:
    """Advance a learning-rate schedule by one trainer step. The schedule counts steps, taken or
    skipped (a non-finite gradient norm skips `optimizer.step()`); when the very first steps were
    skipped, PyTorch's warning that the scheduler ran before the optimizer is expected and muted."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        scheduler.step()


@dataclass
class InferOutput:
    """Result of `DataParallelEngine.infer`.

    outputs: name -> float32 CPU tensor [b, R] in the row order of the batch.
    padding: `valid_tokens`, `token_slots`, `padding_waste` (share of computed slots that are
        padding) and `num_micro_batches` of the pass.
    """

    outputs: dict[str, torch.Tensor]
    padding: dict[str, float]


@dataclass
class TrainOutput:
    """Result of `DataParallelEngine.train`.

    metrics: name -> one value per optimizer step (reduced over ranks), then
        `<prefix>/nonfinite_loss_skipped` (micro-batches) and `<prefix>/nonfinite_grad_skipped_steps`.
    outputs: the `keep` names of the forward's outputs, detached, float32 CPU [b, R] in the row order
        of the batch (from the last epoch that saw each row).
    padding: `valid_tokens`, `token_slots`, `padding_waste` over every forward of the call.
    """

    metrics: dict[str, list[float]]
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    padding: dict[str, float] = field(default_factory=dict)


def _padding(valid: int, slots: int) -> dict[str, float]:
    return {
        "valid_tokens": float(valid),
        "token_slots": float(slots),
        "padding_waste": 1.0 - valid / slots if slots else 0.0,
    }


class _Tally:
    """Counters of one `train` call."""

    def __init__(self):
        self.skipped_micro = 0
        self.skipped_steps = 0
        self.valid = 0
        self.slots = 0


class DataParallelEngine:
    """One model over a data-parallel group (see the module docstring).

    Args:
        module: the model (FSDP2-sharded or plain).
        optimizer: its optimizer (None: `infer` only).
        process_group: the data-parallel group (None = the default group, if any).
        compute_dtype: autocast dtype (None = full precision), see `fsdp_utils.resolve_compute_dtype`.
        use_remove_padding: drop padding inside micro-batches (default) or feed padded rows.
        pad_token_id: id used for the compact padding (masked out).
        use_prefix_grouper: run each distinct prompt of a micro-batch once where exact.
        value_head: the model returns per-position values `logits[..., 0]` and no cache (a
            token-classification head), not a causal LM's logits.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        process_group=None,
        compute_dtype: torch.dtype | None = None,
        use_remove_padding: bool = True,
        pad_token_id: int = 0,
        use_prefix_grouper: bool = False,
        value_head: bool = False,
    ):
        self.module = module
        self.optimizer = optimizer
        self.process_group = process_group
        self.dp_size = dp_world_size(process_group)
        self.compute_dtype = compute_dtype
        self.use_remove_padding = use_remove_padding
        self.pad_token_id = int(pad_token_id or 0)
        self.use_prefix_grouper = use_prefix_grouper
        self.value_head = value_head
        self.logits_to_keep = accepts_logits_to_keep(module)
        self.cache_kwarg = prefix_cache_kwarg(module)
        self.prefix_groups_used = 0  # micro-batches computed with shared prompts (the prefix grouper)
        # token budget of one chunk of a row-separable training micro-batch on CPU (None: never chunk)
        self.chunk_tokens: int | None = CPU_CHUNK_TOKENS

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def plan(self, batch, micro_batch_size: int | None, use_dynamic_bsz: bool, max_token_len: int | None):
        """Index lists of the micro-batches of `batch` (needs `attention_mask` [b, T])."""
        return plan_micro_batches_for_mask(
            batch["attention_mask"],
            micro_batch_size,
            use_dynamic_bsz,
            max_token_len,
            self.use_remove_padding,
            self.process_group,
        )

    # -- one forward ----------------------------------------------------------------------------

    def _prompt_groups(self, input_ids, attention_mask, position_ids, response_length):
        """Rows sharing a prompt when the prefix grouper applies (switched on, a model with a KV
        cache, `use_remove_padding`, 1-D position ids per row, no activation checkpointing while
        training), else None."""
        if not self.use_prefix_grouper or self.cache_kwarg is None or not self.use_remove_padding:
            return None
        if position_ids.dim() != 2:  # multi-axis rope (vision-language models): plain path
            return None
        if self.module.training and activation_checkpointing(self.module):
            return None
        return group_shared_prompts(input_ids, attention_mask, response_length)

    def response_outputs(self, micro):
        """The model's output at the positions that predict the response tokens of a micro-batch.

        Args:
            micro: mapping with `responses` [m, R], `input_ids`, `attention_mask`, `position_ids`
                [m, P + R].
        Returns:
            (outputs [m, R, V] logits, or [m, R] values with `value_head`, in the compute dtype;
            valid [m, R] bool, where a real response token can be read; (valid tokens, token slots)
            of the forward).
        """
        device = self.device
        input_ids = micro["input_ids"].to(device)
        attention_mask = micro["attention_mask"].to(device)
        position_ids = micro["position_ids"].to(device)
        response_length = micro["responses"].shape[-1]
        keep_arg = self.logits_to_keep and not self.value_head

        def forward(keep, **inputs):
            extra = {"logits_to_keep": keep} if keep_arg else {}
            logits = self.module(**inputs, use_cache=False, **extra).logits
            return logits[..., 0] if self.value_head else logits

        groups = self._prompt_groups(input_ids, attention_mask, position_ids, response_length)
        device_type = "cuda" if device.type == "cuda" else "cpu"
        with autocast_context(device_type, self.compute_dtype):
            if groups is None:
                return response_outputs(
                    forward,
                    input_ids,
                    attention_mask,
                    position_ids,
                    response_length,
                    self.pad_token_id,
                    self.use_remove_padding,
                )
            self.prefix_groups_used += 1
            out, valid, stats = shared_prefix_outputs(
                self.module,
                groups,
                input_ids,
                attention_mask,
                position_ids,
                response_length,
                cache_kwarg=self.cache_kwarg,
                logits_to_keep=keep_arg,
                pass_cache=self.value_head,
            )
        return (out[..., 0] if self.value_head else out), valid, stats

    # -- passes ---------------------------------------------------------------------------------

    @torch.no_grad()
    def infer(self, batch, fn: Callable, micro_batch_size=None, use_dynamic_bsz=False, max_token_len=None):
        """A no-grad pass over `batch` in eval mode (the mode is restored afterwards).

        Args:
            batch: TensorDict [b] with `attention_mask` and whatever `fn` reads.
            fn: `fn(micro) -> (outputs, (valid tokens, token slots))` where outputs maps names to
                [m, R] tensors (None entries are skipped).
        Returns:
            `InferOutput` with every name of `fn`'s outputs as float32 CPU [b, R].
        """
        groups = self.plan(batch, micro_batch_size, bool(use_dynamic_bsz), max_token_len)
        n = batch.batch_size[0]
        outputs: dict[str, torch.Tensor] = {}
        valid_sum = slot_sum = 0
        was_training = self.module.training
        self.module.eval()
        try:
            for group in groups:
                idx = torch.tensor(group, dtype=torch.long)
                values, (valid, slots) = fn(batch[idx])
                for name, value in values.items():
                    if value is None:
                        continue
                    if name not in outputs:
                        outputs[name] = torch.zeros((n, *value.shape[1:]), dtype=torch.float32)
                    outputs[name][idx] = value.float().cpu()
                valid_sum += valid
                slot_sum += slots
        finally:
            self.module.train(was_training)
        return InferOutput(outputs, {**_padding(valid_sum, slot_sum), "num_micro_batches": float(len(groups))})

    def mini_batch_rows(self, n: int, config, prefix: str) -> int:
        """The per-rank mini-batch (`config.ppo_mini_batch_size`, already in sequences per rank),
        checked to divide this rank's `n` rows."""
        mini = int(config.ppo_mini_batch_size)
        if n % mini:
            raise ValueError(
                f"update_{prefix} got {n} rows on this rank, not a multiple of the per-rank mini-batch "
                f"of {mini} sequences "
                f"({prefix}.ppo_mini_batch_size x rollout.n / data-parallel size)"
            )
        return mini

    def train(
        self,
        batch,
        forward: Callable,
        loss_fn: Callable,
        config,
        prefix: str,
        uid=None,
        loss_scale_factor: float | None = None,
        on_mini_batch: Callable | None = None,
        keep: Sequence[str] = (),
        row_separable: bool = False,
    ) -> TrainOutput:
        """`config.ppo_epochs` x mini-batches (one optimizer step each) x micro-batches.

        Args:
            batch: TensorDict [b] with `response_mask` [b, R], the model inputs and what `loss_fn`
                reads.
            forward: `forward(micro) -> (model_output, (valid tokens, token slots))`, model_output a
                dict of [m, R] tensors (e.g. `log_probs`, `entropys`, `values`).
            loss_fn: `loss_fn(model_output, micro, batch_info=...) -> (loss, metrics)`; `batch_info`
                is the micro-batch's `make_global_batch_info` dict (the `agg_loss` keywords);
                metrics map names to `LossShare`s or token-weighted floats. It must not run
                collectives.
            config: an actor or critic config (`ppo_epochs`, `shuffle`, `data_loader_seed`,
                `ppo_mini_batch_size` per rank in sequences, `ppo_micro_batch_size_per_gpu`,
                `use_dynamic_bsz`, `ppo_max_token_len_per_gpu`, `grad_clip`, `loss_agg_mode`).
            prefix: metric prefix and name in messages (`actor`, `critic`).
            uid: [b] prompt ids (numpy), needed by `prompt-mean`.
            loss_scale_factor: passed to `core_algos.make_global_batch_info`.
            on_mini_batch: `on_mini_batch(mb, meter)` at the start of each mini-batch, before its loss
                denominators are taken (it may rewrite `mb["response_mask"]`).
            keep: names of `forward`'s outputs to return detached (`TrainOutput.outputs`).
            row_separable: `loss_fn`'s loss is a sum of per-row terms (each depends on its row's
                outputs and the global batch info only): on CPU with one data-parallel rank a
                micro-batch of more than `self.chunk_tokens` tokens may then run per chunk of whole
                prompt groups (`_chunked_micro_step`: the same numbers up to summation order).
        """
        if self.optimizer is None:
            raise RuntimeError(f"update_{prefix} called on an engine without optimizer (a frozen model?)")
        n = batch.batch_size[0]
        mini = self.mini_batch_rows(n, config, prefix)
        resp_len = batch["response_mask"].shape[-1]
        kept = {name: torch.zeros((n, resp_len), dtype=torch.float32) for name in keep}
        uid = uid if config.loss_agg_mode == "prompt-mean" else None
        meter = StepMeter()
        tally = _Tally()
        self.module.train()
        params = [p for p in self.module.parameters() if p.requires_grad]
        sizes = (config.ppo_micro_batch_size_per_gpu, bool(config.use_dynamic_bsz), config.ppo_max_token_len_per_gpu)
        for epoch in range(config.ppo_epochs):
            order = mini_batch_order(n, config.shuffle, config.data_loader_seed, epoch)
            for k in range(n // mini):
                rows = order[k * mini : (k + 1) * mini]
                mb = batch[rows]
                mb_uid = uid[rows.numpy()] if uid is not None else None
                meter.new_step()
                if on_mini_batch is not None:
                    on_mini_batch(mb, meter)
                stats = global_loss_stats(mb["response_mask"], mb_uid, self.process_group)
                self.optimizer.zero_grad(set_to_none=True)
                contributed = 0
                for group in self.plan(mb, *sizes):
                    gidx = torch.tensor(group, dtype=torch.long)
                    info = core_algos.make_global_batch_info(
                        stats,
                        index=mb_uid[group] if mb_uid is not None else None,
                        dp_size=self.dp_size,
                        loss_scale_factor=loss_scale_factor,
                        device=self.device,
                    )
                    micro_kept = {name: (out, rows[gidx]) for name, out in kept.items()}
                    common = (forward, loss_fn, info, meter, tally, micro_kept, prefix)
                    contributed += self._train_micro(mb[gidx].to(self.device), row_separable, common)
                self._end_mini_batch(contributed, params, config.grad_clip, meter, tally, prefix)
        self.optimizer.zero_grad(set_to_none=True)
        metrics = meter.reduce(self.process_group, self.dp_size)
        metrics[f"{prefix}/nonfinite_loss_skipped"] = [float(tally.skipped_micro)]
        metrics[f"{prefix}/nonfinite_grad_skipped_steps"] = [float(tally.skipped_steps)]
        return TrainOutput(metrics, kept, _padding(tally.valid, tally.slots))

    def _train_micro(self, micro, row_separable: bool, common: tuple) -> int:
        """Forward, loss and backward of one micro-batch, whole or per chunk of rows (`train`'s
        `row_separable`); `common`: the arguments after `micro` of `_micro_step`."""
        chunks = self._train_chunks(micro) if row_separable else None
        if chunks is None:
            return self._micro_step(micro, *common)
        return self._chunked_micro_step(micro, chunks, *common)

    def _micro_step(self, micro, forward, loss_fn, info, meter, tally, kept, prefix) -> int:
        """Forward, loss and backward of one micro-batch (on the device); 1 if it contributed a
        gradient."""
        model_output, (valid, slots) = forward(micro)
        tally.valid += valid
        tally.slots += slots
        _keep(kept, model_output)
        loss, metrics = loss_fn(model_output, micro, batch_info=info)
        if not all_ranks_finite(loss, self.process_group):
            tally.skipped_micro += 1
            logger.warning("%s: non-finite loss in a micro-batch; skipped (not back-propagated)", prefix)
            return 0
        loss.backward()
        self._record(meter, metrics, micro)
        return 1

    def _record(self, meter: StepMeter, metrics: dict, micro) -> None:
        n_tok = float(micro["response_mask"].sum())
        for name, value in metrics.items():
            if isinstance(value, LossShare):
                meter.add_sum(name, value / self.dp_size)
            else:
                meter.add_weighted(name, value, n_tok)

    def _train_chunks(self, micro) -> list[torch.Tensor] | None:
        """Row chunks of a training micro-batch (see `train(row_separable=True)`), or None. One
        data-parallel rank only: the number of chunks depends on the rank's rows, and with FSDP
        every forward and backward is a collective that all ranks must run equally often."""
        if self.chunk_tokens is None or self.device.type != "cpu" or not self.use_remove_padding or self.dp_size != 1:
            return None
        return row_chunks(
            micro["input_ids"],
            micro["attention_mask"],
            micro["responses"].shape[-1],
            self.chunk_tokens,
            share_prompts=self.use_prefix_grouper,
        )

    def _chunked_micro_step(self, micro, chunks, forward, loss_fn, info, meter, tally, kept, prefix) -> int:
        """`_micro_step` of a micro-batch whose loss is a sum of per-row terms, run as forward,
        loss and backward per chunk of rows (`chunks`: ascending row indices into `micro`).

        The loss and metrics reported are `loss_fn` on the outputs of all chunks put together
        (detached): what `_micro_step` reports. A loss that is not finite on some rank (the
        micro-batch loss is not finite exactly when some chunk's is not) drops the whole
        micro-batch as `_micro_step` does: the gradients of the chunks already back-propagated
        are taken back (they are restored from a copy made first)."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        saved = [None if p.grad is None else p.grad.clone() for p in params]
        parts: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []
        finite = True
        for idx in chunks:
            sub = micro[idx]
            output, (valid, slots) = forward(sub)
            tally.valid += valid
            tally.slots += slots
            loss, _ = loss_fn(output, sub, batch_info=_info_rows(info, idx, micro.batch_size[0]))
            if not bool(torch.isfinite(loss).all()):
                finite = False
                break
            loss.backward()
            parts.append((idx, {name: value.detach() for name, value in output.items() if value is not None}))
        if not all_ranks_finite(torch.tensor(0.0 if finite else float("nan")), self.process_group):
            for p, grad in zip(params, saved, strict=True):
                p.grad = grad
            tally.skipped_micro += 1
            logger.warning("%s: non-finite loss in a micro-batch; skipped (not back-propagated)", prefix)
            return 0
        m = micro.batch_size[0]
        model_output: dict[str, torch.Tensor] = {}
        for idx, output in parts:
            for name, value in output.items():
                if name not in model_output:
                    model_output[name] = value.new_zeros((m, *value.shape[1:]))
                model_output[name][idx] = value
        _keep(kept, model_output)
        with torch.no_grad():
            _, metrics = loss_fn(model_output, micro, batch_info=info)
        self._record(meter, metrics, micro)
        return 1

    def _end_mini_batch(self, contributed, params, grad_clip, meter, tally, prefix) -> None:
        if contributed == 0:
            tally.skipped_steps += 1
            meter.set(f"{prefix}/grad_norm", float("nan"))
            return
        if not clip_and_step(self.optimizer, params, grad_clip, meter, prefix):
            tally.skipped_steps += 1


def _keep(kept, model_output) -> None:
    """Copy the kept outputs of a micro-batch (detached, float32, CPU) into their rows."""
    for name, (out, rows) in kept.items():
        if model_output.get(name) is not None:
            out[rows] = model_output[name].detach().float().cpu()


def _info_rows(info: dict, idx: torch.Tensor, m: int) -> dict:
    """The global batch info of a micro-batch of `m` rows restricted to the rows `idx`: per-row
    tensors (`group_num_tokens` of `prompt-mean`) are indexed, everything else is global."""
    return {
        key: value[idx.to(value.device)] if torch.is_tensor(value) and value.dim() and value.shape[0] == m else value
        for key, value in info.items()
    }


def check_micro_batching(config, prefix: str) -> None:
    """An update needs `ppo_micro_batch_size_per_gpu` or `use_dynamic_bsz`."""
    if not config.use_dynamic_bsz and config.ppo_micro_batch_size_per_gpu is None:
        raise ValueError(f"{prefix}.ppo_micro_batch_size_per_gpu is null and use_dynamic_bsz is False: set one of them")


def prompt_ids(data, config, prefix: str):
    """`non_tensor_batch["uid"]` as a numpy array (None when absent); required by `prompt-mean`."""
    uid = data.non_tensor_batch.get("uid")
    if config.loss_agg_mode == "prompt-mean" and uid is None:
        raise KeyError(f"{prefix}.loss_agg_mode=prompt-mean needs the prompt ids: non_tensor_batch['uid'] is missing")
    return None if uid is None else np.asarray(uid)
