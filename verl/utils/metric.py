"""Metric reduction shared by the trainers (upstream's `verl.utils.metric`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["reduce_metrics"]


def _flat_numbers(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in _flat_numbers(item)]
    if isinstance(value, np.ndarray):
        return _flat_numbers(value.tolist()) if value.dtype == object else value.reshape(-1).tolist()
    if isinstance(value, torch.Tensor):
        return value.detach().float().reshape(-1).tolist()
    return [value]


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Mean of each list-valued metric (workers return one value per micro-batch or rank);
    nested lists (one entry per worker, each a list) are averaged over all their numbers,
    tensors over their elements; anything else is passed through."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, (list, tuple, np.ndarray)):
            # DataProto.concat keeps one entry per worker (as upstream), and a worker's entry may
            # itself be a list (one value per micro-batch, counts may differ): average all numbers
            arr = np.asarray(_flat_numbers(v), dtype=np.float64)
            out[k] = float(arr.mean()) if arr.size else float("nan")
        elif isinstance(v, torch.Tensor):
            out[k] = float(v.float().mean().item())
        else:
            out[k] = v
    return out
