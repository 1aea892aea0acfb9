"""Free functions over a DataProto's rows: padding to a divisor, folding the batch dimension, all-gather.

Upstream's names, re-exported by `verl.protocol` (import them from there). They only use the
DataProto they are given (its class included), so this module does not import `verl.protocol`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict

if TYPE_CHECKING:
    from verl.dataproto.base import DataProtoBase as DataProto  # annotations: a verl.protocol.DataProto

__all__ = ["all_gather_data_proto", "fold_batch_dim", "pad_dataproto_to_divisor", "unfold_batch_dim", "unpad_dataproto"]


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Append copies of the leading rows (cycling) until ``len`` divides `size_divisor`.

    Returns ``(padded, pad_size)``; `unpad_dataproto(result, pad_size)` drops the padding rows
    again. The input is not modified.
    """
    if not isinstance(size_divisor, int) or size_divisor <= 0:
        raise ValueError(f"size_divisor must be a positive int, got {size_divisor!r}")
    n = len(data)
    pad_size = (-n) % size_divisor
    if pad_size == 0:  # includes the empty DataProto
        return data, 0
    padded = type(data).concat([data, data.select_idxs(np.arange(pad_size) % n)])
    padded.meta_info = dict(data.meta_info)
    return padded, pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last `pad_size` rows (those appended by `pad_dataproto_to_divisor`)."""
    if pad_size < 0 or pad_size > len(data):
        raise ValueError(f"pad_size {pad_size} is out of range for a DataProto of {len(data)} rows")
    return data[: len(data) - pad_size] if pad_size else data


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Group consecutive rows: ``(bs, ...) -> (new_batch_size, bs // new_batch_size, ...)``."""
    n = len(data)
    if new_batch_size <= 0 or n % new_batch_size != 0:
        raise ValueError(f"cannot fold {n} rows into batch size {new_batch_size}: it must divide the row count")
    group = n // new_batch_size
    batch = None
    if data.batch is not None:
        batch = TensorDict(
            {k: v.reshape(new_batch_size, group, *v.shape[1:]) for k, v in data.batch.items()},
            batch_size=[new_batch_size],
            device=data.batch.device,
        )
    non_tensor = {k: v.reshape(new_batch_size, group, *v.shape[1:]) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """Inverse of `fold_batch_dim`: merge the first `batch_dims` dimensions into the row dimension."""
    if batch_dims < 1:
        raise ValueError(f"batch_dims must be >= 1, got {batch_dims}")

    def flat(v):
        if v.ndim < batch_dims:
            raise ValueError(f"an entry of shape {tuple(v.shape)} has fewer than batch_dims={batch_dims} dimensions")
        return v.reshape(-1, *v.shape[batch_dims:])

    batch = None
    if data.batch is not None:
        tensors = {k: flat(v) for k, v in data.batch.items()}
        rows = next(iter(tensors.values())).shape[0] if tensors else len(data)
        batch = TensorDict(tensors, batch_size=[rows], device=data.batch.device)
    non_tensor = {k: flat(v) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))


def all_gather_data_proto(data: DataProto, process_group=None) -> DataProto:
    """All-gather `data` over `process_group` in place (rank order) and return it.

    Ranks may hold different row counts. Every rank must have the same keys, dtypes and trailing
    shapes. Tensors travel as raw bytes, so every dtype works on gloo and nccl; with nccl they go
    through the current CUDA device and come back to their original device. Non-tensor entries use
    `all_gather_object`.
    """
    import torch.distributed as dist

    world = dist.get_world_size(group=process_group)
    comm_device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend(process_group) == "nccl"
        else torch.device("cpu")
    )
    local = torch.tensor([len(data)], dtype=torch.int64, device=comm_device)
    sizes_t = [torch.zeros_like(local) for _ in range(world)]
    dist.all_gather(sizes_t, local, group=process_group)
    sizes = [int(s.item()) for s in sizes_t]
    longest = max(sizes)
    if data.batch is not None:
        gathered = {}
        for key in sorted(data.batch.keys()):
            tensor = data.batch.get(key)
            origin = tensor.device
            shape_rest = tuple(tensor.shape[1:])
            raw = (
                tensor.detach().to(comm_device).contiguous().reshape(len(data), math.prod(shape_rest)).view(torch.uint8)
            )
            if raw.shape[0] < longest:
                raw = torch.cat([raw, raw.new_zeros(longest - raw.shape[0], raw.shape[1])])
            bufs = [torch.empty_like(raw) for _ in range(world)]
            dist.all_gather(bufs, raw, group=process_group)
            rows = torch.cat([b[:s] for b, s in zip(bufs, sizes, strict=False)])
            gathered[key] = rows.view(tensor.dtype).reshape(sum(sizes), *shape_rest).to(origin)
        data.batch = TensorDict(gathered, batch_size=[sum(sizes)], device=data.batch.device)
    if data.non_tensor_batch:
        objs: list[Any] = [None] * world
        dist.all_gather_object(objs, data.non_tensor_batch, group=process_group)
        data.non_tensor_batch = {k: np.concatenate([o[k] for o in objs], axis=0) for k in sorted(data.non_tensor_batch)}
    data.check_consistency()
    return data
