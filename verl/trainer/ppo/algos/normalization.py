"""Grouping by prompt id and the `NormConfig`-driven normalisation (`normalize_by_config`) shared by
the advantage estimators. Groups come from `index` (the uid array), never from row order."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

from verl.utils.py_functional import config_get


def _group_ids(
    index: Sequence[Hashable] | np.ndarray | None, batch_size: int, device, who: str
) -> tuple[torch.Tensor, int]:
    """Map prompt ids to dense group ids 0..G-1 (first-appearance order): ([B] long, G)."""
    if index is None:
        raise ValueError(f"{who} groups responses by prompt and needs `index` (the uid array of the batch)")
    if len(index) != batch_size:
        raise ValueError(f"{who}: index has {len(index)} entries but the batch has {batch_size} rows")
    mapping: dict = {}
    try:
        ids = [mapping.setdefault(uid, len(mapping)) for uid in index]
    except TypeError as exc:
        raise TypeError(f"{who}: prompt ids in `index` must be hashable (got {type(index[0]).__name__})") from exc
    return torch.tensor(ids, dtype=torch.long, device=device), len(mapping)


def _group_sum(values: torch.Tensor, ids: torch.Tensor, n_groups: int) -> torch.Tensor:
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, ids, values)


def _group_count_mean(values: torch.Tensor, ids: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows per group and the group mean of `values` [B], both [G]."""
    count = _group_sum(torch.ones_like(values), ids, n_groups)
    return count, _group_sum(values, ids, n_groups) / count.clamp(min=1)


def _group_members(
    index: Sequence[Hashable] | np.ndarray | None, batch_size: int, device, who: str, include=None
) -> list[list[int]]:
    """The row numbers of each prompt group, in first-appearance order (`index` checked as in
    `_group_ids`); with `include` ([B] bools) only those rows are members."""
    _group_ids(index, batch_size, device, who)
    rows: dict = {}
    for i, uid in enumerate(index):
        if include is None or bool(include[i]):
            rows.setdefault(uid, []).append(i)
    return list(rows.values())


def normalize_by_config(
    values: torch.Tensor,
    norm_config: Any,
    index: Sequence[Hashable] | np.ndarray | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """AReaL-style normalisation `(x - mean) / (std + eps)` described by a `NormConfig`.

    Args:
        values: [B] one value per response, or [B, L] per token (then `mask` [B, L] selects the
            tokens that enter the statistics and the output is 0 elsewhere).
        norm_config: `mean_level` / `std_level` in {"batch", "group", None}, `mean_leave1out`,
            `std_unbiased` (default True), `eps` (default 1e-5); dataclass or dict.
        index: [B] prompt ids; required when a level is "group".
    Semantics:
        - mean: of the group or the batch; with `mean_leave1out` the mean of the *other*
          responses (all tokens of the own response are left out). None: no centring.
        - std: of the raw values at `std_level` (unbiased by default). None: no scaling. A batch
          std over fewer than 2 elements is taken as 1 (no scaling).
        - a response whose group has a single response gets 0 whenever a level is "group" (no
          contrast, no signal), and so does a response with no valid tokens.
    """
    mean_level = config_get(norm_config, "mean_level", None)
    std_level = config_get(norm_config, "std_level", None)
    leave1out = bool(config_get(norm_config, "mean_leave1out", False))
    unbiased = bool(config_get(norm_config, "std_unbiased", True))
    eps = float(config_get(norm_config, "eps", 1e-5))
    for key, level in (("mean_level", mean_level), ("std_level", std_level)):
        if level not in ("batch", "group", None):
            raise ValueError(f"normalisation {key}={level!r}; expected one of ['batch', 'group', None]")

    per_token = values.dim() == 2
    valid = mask.bool() if mask is not None else torch.ones_like(values, dtype=torch.bool)
    x = torch.where(valid, values, torch.zeros((), dtype=values.dtype, device=values.device))
    w = valid.to(values.dtype)
    # per-response sums and counts of the elements entering the statistics
    row_sum = x.sum(dim=-1) if per_token else x
    row_cnt = w.sum(dim=-1) if per_token else w
    batch_size = values.shape[0]

    uses_group = "group" in (mean_level, std_level)
    out_ok = row_cnt > 0
    if uses_group:
        ids, n_groups = _group_ids(index, batch_size, values.device, "normalisation with level 'group'")
        g_rows = _group_sum(torch.ones_like(row_cnt), ids, n_groups)
        out_ok = out_ok & (g_rows[ids] > 1)

    def expand(row_stat: torch.Tensor) -> torch.Tensor:
        return row_stat.unsqueeze(-1) if per_token else row_stat

    groups = (ids, n_groups) if uses_group else None
    centred = values - expand(_norm_mean(mean_level, leave1out, row_sum, row_cnt, groups))
    if std_level is None:
        scaled = centred
    else:
        std = _norm_std(std_level, unbiased, eps, values, valid, row_sum, row_cnt, groups, expand)
        scaled = centred / (expand(std) + eps)

    keep = valid & expand(out_ok) if per_token else valid & out_ok
    return torch.where(keep, scaled, torch.zeros((), dtype=values.dtype, device=values.device))


def _norm_mean(level, leave1out: bool, row_sum: torch.Tensor, row_cnt: torch.Tensor, groups) -> torch.Tensor:
    """[B] mean each response is centred by (0 when `level` is None); with `leave1out` the mean of
    the other responses' elements."""
    if level is None:
        return torch.zeros_like(row_sum)
    if level == "group":
        ids, n_groups = groups
        tot_sum = _group_sum(row_sum, ids, n_groups)[ids]
        tot_cnt = _group_sum(row_cnt, ids, n_groups)[ids]
    else:
        tot_sum = row_sum.sum().expand_as(row_sum)
        tot_cnt = row_cnt.sum().expand_as(row_cnt)
    if leave1out:
        return (tot_sum - row_sum) / (tot_cnt - row_cnt).clamp(min=1)
    return tot_sum / tot_cnt.clamp(min=1)


def _norm_std(level, unbiased: bool, eps: float, values, valid, row_sum, row_cnt, groups, expand) -> torch.Tensor:
    """[B] std of the raw values at `level` ("group" or "batch"); a batch of fewer than 2 elements
    (1 when biased) gets 1 - eps, so that dividing by std + eps leaves the values unscaled."""
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    if level == "group":
        ids, n_groups = groups
        g_cnt = _group_sum(row_cnt, ids, n_groups)
        g_mean = (_group_sum(row_sum, ids, n_groups) / g_cnt.clamp(min=1))[ids]
        dev = torch.where(valid, values - expand(g_mean), zero)
        row_sq = dev.square().sum(dim=-1) if dev.dim() == 2 else dev.square()
        cnt = g_cnt[ids]
        denom = (cnt - 1).clamp(min=1) if unbiased else cnt.clamp(min=1)
        return torch.sqrt(_group_sum(row_sq, ids, n_groups)[ids] / denom)
    b_cnt = row_cnt.sum()
    b_mean = row_sum.sum() / b_cnt.clamp(min=1)
    b_sq = torch.where(valid, values - b_mean, zero).square().sum()
    denom = (b_cnt - 1).clamp(min=1) if unbiased else b_cnt.clamp(min=1)
    too_few = b_cnt < (2 if unbiased else 1)
    b_std = torch.where(too_few, torch.ones_like(b_sq) - eps, torch.sqrt(b_sq / denom))
    return b_std.expand_as(row_sum)
