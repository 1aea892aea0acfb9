"""Per-group statistics on tensors (upstream's `verl.utils.groupwise`), for vectorised
group-relative advantages: rows sharing an id (``uid``) form a group."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["as_torch_index", "group_mean_std"]


def as_torch_index(index: Any, device: torch.device | str | None = None) -> torch.Tensor:
    """Group ids of any kind (strings, ints, a numpy object array, a tensor) as dense int64 ids
    ``0..G-1`` in order of first appearance: ``["b", "a", "b"] -> [0, 1, 0]``."""
    if isinstance(index, torch.Tensor) and not index.is_floating_point():
        values = index.detach().cpu().tolist()
    else:
        values = list(np.asarray(index, dtype=object).reshape(-1))
    seen: dict[Any, int] = {}
    dense = [seen.setdefault(v, len(seen)) for v in values]
    return torch.tensor(dense, dtype=torch.long, device=device)


def group_mean_std(
    scores: torch.Tensor, gidx: torch.Tensor, eps: float = 1e-6, device: torch.device | str | None = None
):
    """(mean, std, count) per group, each a [G] tensor, from `scores` [bs] and dense ids `gidx` [bs].

    std is the unbiased (n - 1) standard deviation. A group of one row gets mean 0 and std 1
    (its advantage is then its own score), as the loop form of GRPO does; `eps` is added to
    the std only for groups of two or more rows.
    """
    device = scores.device if device is None else device
    scores = scores.to(device=device, dtype=torch.float32)
    gidx = gidx.to(device)
    groups = int(gidx.max().item()) + 1 if gidx.numel() else 0
    count = torch.zeros(groups, device=device).index_add_(0, gidx, torch.ones_like(scores))
    total = torch.zeros(groups, device=device).index_add_(0, gidx, scores)
    mean = total / count.clamp(min=1)
    sq = torch.zeros(groups, device=device).index_add_(0, gidx, (scores - mean[gidx]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1)) + eps
    single = count <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean, std, count
