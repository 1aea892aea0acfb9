"""Loss aggregation (`agg_loss`, `LOSS_AGG_MODES`) and the mini-batch-global denominators that make
it exact under micro-batching (`BatchLossStats`, `make_global_batch_info`).

`agg_loss` is a pure function of its arguments. The denominators of the micro-batch being computed
travel in the loss's config, as upstream main: the engine fills `config.global_batch_info` (a
plain dict field of `ActorConfig`) and every loss passes it on,
`agg_loss(..., **batch_info_of(config))`. `core_algos` re-exports these names (the same objects);
built-in losses call this module's `agg_loss`, so rebinding `core_algos.agg_loss` (e.g.
monkeypatching it) does not change them."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl.trainer.ppo.mode_names import LOSS_AGG_MODES  # noqa: F401 - re-exported
from verl.utils.py_functional import config_get

GLOBAL_BATCH_INFO_KEYS = (
    "dp_size",
    "batch_num_tokens",
    "global_batch_size",
    "loss_scale_factor",
    "group_num_tokens",
    "global_num_groups",
)


def batch_info_of(config: Any) -> dict:
    """The `agg_loss` keywords a loss given `config` passes on: `config.global_batch_info` (what the
    engine wrote for the current micro-batch; {} for a config without one, e.g. a plain dict), with
    `loss_scale_factor` from `config.loss_scale_factor` when the info has none. Unknown keys fail
    here, naming the accepted ones."""
    info = dict(config_get(config, "global_batch_info", None) or {})
    unknown = sorted(set(info) - set(GLOBAL_BATCH_INFO_KEYS))
    if unknown:
        raise ValueError(f"global_batch_info: unknown key(s) {unknown}; accepted: {list(GLOBAL_BATCH_INFO_KEYS)}")
    info = {key: value for key, value in info.items() if value is not None}
    scale = config_get(config, "loss_scale_factor", None)
    if "loss_scale_factor" not in info and scale is not None:
        info["loss_scale_factor"] = scale
    return info


@dataclass
class BatchLossStats:
    """Denominators of the loss aggregation for one mini-batch (summed over data-parallel ranks
    with `merge_batch_loss_stats`).

    num_tokens: valid tokens (mask sum).
    num_seqs: sequences with at least one valid token.
    group_num_tokens: prompt id -> valid tokens of that group (empty when no index was given).
    """

    num_tokens: int = 0
    num_seqs: int = 0
    group_num_tokens: dict = field(default_factory=dict)

    @property
    def num_groups(self) -> int:
        """Groups with at least one valid token (empty groups do not count in prompt-mean)."""
        return sum(1 for n in self.group_num_tokens.values() if n > 0)


def compute_batch_loss_stats(
    response_mask: torch.Tensor, index: Sequence[Hashable] | np.ndarray | None = None
) -> BatchLossStats:
    """Local aggregation denominators of a (mini-)batch.

    Args:
        response_mask: [B, L] loss mask (after any rollout-correction rejection).
        index: [B] prompt ids (uid); needed only for `prompt-mean`.
    """
    row_tokens = response_mask.to(torch.int64).sum(dim=-1).tolist()
    groups: dict = {}
    if index is not None:
        if len(index) != len(row_tokens):
            raise ValueError(f"compute_batch_loss_stats: index has {len(index)} entries for {len(row_tokens)} rows")
        for uid, n in zip(index, row_tokens, strict=False):
            groups[uid] = groups.get(uid, 0) + int(n)
    return BatchLossStats(
        num_tokens=int(sum(row_tokens)), num_seqs=sum(1 for n in row_tokens if n > 0), group_num_tokens=groups
    )


def merge_batch_loss_stats(stats: Sequence[BatchLossStats]) -> BatchLossStats:
    """Sum the stats of several ranks (`torch.distributed.all_gather_object` output). Groups that
    straddle ranks are merged by prompt id, so each group is counted once."""
    merged = BatchLossStats()
    for item in stats:
        merged.num_tokens += item.num_tokens
        merged.num_seqs += item.num_seqs
        for uid, n in item.group_num_tokens.items():
            merged.group_num_tokens[uid] = merged.group_num_tokens.get(uid, 0) + n
    return merged


def make_global_batch_info(
    stats: BatchLossStats,
    index: Sequence[Hashable] | np.ndarray | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
    device: torch.device | str | None = None,
) -> dict:
    """`config.global_batch_info` / `agg_loss(...)` keywords for one micro-batch.

    Args:
        stats: mini-batch stats over all data-parallel ranks.
        index: prompt ids of the micro-batch rows ([b]); adds `group_num_tokens` ([b] float tensor)
            and `global_num_groups` for `prompt-mean`.
        dp_size: number of data-parallel ranks whose gradients FSDP averages.
        loss_scale_factor: constant divisor of `seq-mean-token-sum-norm` (the response length limit).
    """
    info: dict = {
        "dp_size": int(dp_size),
        "batch_num_tokens": stats.num_tokens,
        "global_batch_size": stats.num_seqs,
    }
    if loss_scale_factor is not None:
        info["loss_scale_factor"] = float(loss_scale_factor)
    if index is not None:
        missing = [uid for uid in index if uid not in stats.group_num_tokens]
        if missing:
            raise ValueError(f"make_global_batch_info: prompt ids {missing[:5]} are not in the mini-batch stats")
        info["group_num_tokens"] = torch.tensor(
            [float(stats.group_num_tokens[uid]) for uid in index], dtype=torch.float32, device=device
        )
        info["global_num_groups"] = stats.num_groups
    return info


def compute_group_num_tokens(response_mask: torch.Tensor, index: Sequence[Hashable] | np.ndarray) -> torch.Tensor:
    """[B] valid-token count of each row's group (the `prompt-mean` denominator D_g), float."""
    stats = compute_batch_loss_stats(response_mask, index)
    return torch.tensor(
        [float(stats.group_num_tokens[uid]) for uid in index], dtype=torch.float32, device=response_mask.device
    )


def _clamp_count(count: Any, like: torch.Tensor) -> torch.Tensor | float:
    if torch.is_tensor(count):
        return count.to(like.dtype).clamp(min=1)
    return float(max(count, 1))


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
    group_num_tokens: torch.Tensor | None = None,
    global_num_groups: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss matrix into a scalar.

    Modes (l = loss_mat, m = loss_mask, n_i = valid tokens of row i, B = rows with n_i > 0):
    - `token-mean`: sum(l*m) / sum(m)
    - `token-sum`: sum(l*m) (no normalisation; times `dp_size` so FSDP's gradient mean over
      ranks gives the sum over all ranks' tokens)
    - `seq-mean-token-sum`: sum_i sum_t l*m / B
    - `seq-mean-token-mean`: sum_i (sum_t l*m / n_i) / B
    - `seq-mean-token-sum-norm` (Dr.GRPO): sum(l*m) / (B * loss_scale_factor); the factor should be
      a constant (the response length limit); it defaults to the padded width `L` when not given
    - `prompt-mean`: mean over prompt groups g of (sum over the group's tokens / D_g), D_g = valid
      tokens of group g; needs `group_num_tokens` (row-aligned D_g)

    Exact micro-batching: when the mini-batch-global denominators are given (`batch_num_tokens`,
    `global_batch_size` = B, `global_num_groups` = number of non-empty groups, row-aligned
    `group_num_tokens`; all over every data-parallel rank) the result is this micro-batch's share of
    the mini-batch loss times `dp_size` (FSDP averages gradients over ranks), so summing the
    micro-batch losses gives exactly the full mini-batch loss and gradient. Without them the plain
    full-batch value of the given tensors is returned: the function reads nothing but its
    arguments (losses pass `**batch_info_of(config)`). Empty rows/masks give 0, never NaN.

    Args:
        loss_mat: [b, L] per-token loss.
        loss_mask: [b, L] 0/1 mask.
    Returns:
        0-d tensor.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"Invalid loss_agg_mode {loss_agg_mode!r}; expected one of {list(LOSS_AGG_MODES)}")
    mask = loss_mask.bool()
    selected = torch.where(mask, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))
    row_tokens = mask.sum(dim=-1)
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("agg_loss(token-mean): batch_num_tokens (global) is required when dp_size > 1")
            batch_num_tokens = row_tokens.sum()
        return selected.sum() / _clamp_count(batch_num_tokens, loss_mat) * dp_size
    if loss_agg_mode == "token-sum":
        return selected.sum() * dp_size
    if loss_agg_mode == "prompt-mean":
        return _prompt_mean(selected.sum(dim=-1), row_tokens, group_num_tokens, global_num_groups, dp_size)
    loss = _seq_mean(selected.sum(dim=-1), row_tokens, loss_agg_mode, global_batch_size, dp_size)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        if loss_scale_factor is None:
            loss_scale_factor = loss_mask.shape[-1]
        if not float(loss_scale_factor) > 0:
            raise ValueError(f"agg_loss: loss_scale_factor={loss_scale_factor} must be > 0")
        loss = loss / float(loss_scale_factor)
    return loss


def _prompt_mean(
    row_sums: torch.Tensor,
    row_tokens: torch.Tensor,
    group_num_tokens: torch.Tensor | None,
    global_num_groups: int | torch.Tensor | None,
    dp_size: int,
) -> torch.Tensor:
    """`prompt-mean` of `agg_loss` from the masked row sums [b] and row token counts [b]."""
    if group_num_tokens is None:
        raise ValueError(
            "agg_loss(prompt-mean) needs the group token counts: pass group_num_tokens (row-aligned [b]) "
            "and global_num_groups (the engine writes them into config.global_batch_info; see make_global_batch_info)"
        )
    group_tokens = torch.as_tensor(group_num_tokens, device=row_sums.device).to(row_sums.dtype).clamp(min=1)
    if group_tokens.shape != row_sums.shape:
        raise ValueError(
            f"agg_loss(prompt-mean): group_num_tokens shape {tuple(group_tokens.shape)} != rows {tuple(row_sums.shape)}"
        )
    if global_num_groups is None:
        if dp_size > 1:
            raise ValueError("agg_loss(prompt-mean): global_num_groups is required when dp_size > 1")
        # for a complete batch, sum_i n_i / D_g(i) counts each non-empty group exactly once
        global_num_groups = torch.round((row_tokens.to(row_sums.dtype) / group_tokens).sum())
    return (row_sums / group_tokens).sum() / _clamp_count(global_num_groups, row_sums) * dp_size


def _seq_mean(
    row_sums: torch.Tensor,
    row_tokens: torch.Tensor,
    loss_agg_mode: str,
    global_batch_size: int | torch.Tensor | None,
    dp_size: int,
) -> torch.Tensor:
    """The sequence-level modes of `agg_loss` before the `seq-mean-token-sum-norm` divisor."""
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError(f"agg_loss({loss_agg_mode}): global_batch_size is required when dp_size > 1")
        global_batch_size = (row_tokens > 0).sum()
    if loss_agg_mode == "seq-mean-token-mean":
        row_sums = row_sums / row_tokens.to(row_sums.dtype).clamp(min=1)
    return row_sums.sum() / _clamp_count(global_batch_size, row_sums) * dp_size
