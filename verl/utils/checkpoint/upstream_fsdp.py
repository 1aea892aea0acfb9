"""Reading checkpoints in upstream verl's FSDP layout (what its `FSDPCheckpointManager` writes):

    actor/
      fsdp_config.json                          {"FSDP_version": 2, "world_size": W}
      model_world_size_W_rank_r.pt              rank r's `model.state_dict()`: DTensors holding its shard
      optim_world_size_W_rank_r.pt              rank r's `optimizer.state_dict()` (state keyed by index)
      extra_state_world_size_W_rank_r.pt        {"lr_scheduler": ..., "rng": ...}
      huggingface/                              config, generation config, tokenizer
      lora_train_meta.json                      {"r", "lora_alpha", "task_type"} for LoRA runs

Used by `python -m verl.model_merger` (to write a Hugging Face model) and by
`FSDPCheckpointManager.load_checkpoint` (to continue training from its weights and optimizer).
Files are read with `torch.load(weights_only=True, mmap=True)`: DTensors are admitted once
`torch.distributed.tensor` is imported, nothing else runs code, and memory-mapping means a full
tensor is assembled from the W files without reading the rest of them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "FSDP_CONFIG_FILE",
    "full_optimizer_state",
    "is_upstream_fsdp_dir",
    "iter_full_model_tensors",
    "load_extra_state",
    "model_tensor_specs",
    "upstream_world_size",
]

FSDP_CONFIG_FILE = "fsdp_config.json"
_MODEL_FILE = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")


def is_upstream_fsdp_dir(path: str) -> bool:
    """True when `path` holds upstream's per-rank FSDP files (fsdp_config.json + model shards)."""
    return os.path.isfile(os.path.join(path, FSDP_CONFIG_FILE)) and any(_MODEL_FILE.match(n) for n in os.listdir(path))


def upstream_world_size(path: str) -> int:
    with open(os.path.join(path, FSDP_CONFIG_FILE)) as fh:
        config = json.load(fh)
    world = config.get("world_size")
    if not isinstance(world, int) or world < 1:
        raise ValueError(
            f"{os.path.join(path, FSDP_CONFIG_FILE)} has world_size={world!r}; expected a positive integer"
        )
    return world


def _load(path: str) -> Any:
    import torch.distributed.tensor  # noqa: F401 - registers DTensor for weights_only loading

    if not os.path.isfile(path):
        raise FileNotFoundError(f"upstream checkpoint file {path} is missing")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - re-raised naming the file
        raise ValueError(
            f"upstream checkpoint file {path} cannot be read safely ({type(exc).__name__}: {exc})"
        ) from exc


def _rank_files(path: str, kind: str) -> list[Any]:
    world = upstream_world_size(path)
    return [_load(os.path.join(path, f"{kind}_world_size_{world}_rank_{r}.pt")) for r in range(world)]


def _merge(parts: list[Any], where: str) -> torch.Tensor:
    """The full tensor from each rank's piece: a DTensor's placement says how they join."""
    from torch.distributed.tensor import DTensor

    first = parts[0]
    if not isinstance(first, DTensor):
        if all(isinstance(p, torch.Tensor) and torch.equal(p, first) for p in parts):
            return first  # a replicated plain tensor (e.g. Adam's step counter)
        raise ValueError(f"{where}: ranks hold different plain tensors; only FSDP2 DTensor shards can be merged")
    if len(first.placements) != 1:
        raise ValueError(f"{where}: a {len(first.placements)}-D device mesh (FSDP + TP/DDP) is not supported")
    placement = first.placements[0]
    if placement.is_replicate():
        return first.to_local()
    if placement.is_shard():
        full = torch.cat([p.to_local() for p in parts], dim=placement.dim)
        if tuple(full.shape) != tuple(first.shape):
            raise ValueError(f"{where}: the shards join to {tuple(full.shape)}, the DTensor says {tuple(first.shape)}")
        return full
    raise ValueError(f"{where}: placement {placement} is not supported")


def model_tensor_specs(path: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """{name: (global shape, dtype)} of the model state dict, from rank 0's file (no data read)."""
    return {k: (tuple(v.shape), v.dtype) for k, v in _rank_files(path, "model")[0].items()}


def iter_full_model_tensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of the model state dict, one at a time, in rank 0's key order."""
    parts = _rank_files(path, "model")
    for key in parts[0]:
        yield key, _merge([p[key] for p in parts], f"{path}: {key}")


def full_optimizer_state(path: str, param_names: list[str]) -> dict[str, Any]:
    """Upstream's per-rank `optimizer.state_dict()` files joined into one full state dict keyed by
    parameter name (`param_names[i]` is the name of parameter index i of the first group order),
    the form `set_optimizer_state_dict(full_state_dict=True)` loads."""
    parts = _rank_files(path, "optim")
    groups = parts[0]["param_groups"]
    indices = [i for g in groups for i in g["params"]]
    if len(indices) != len(param_names):
        raise ValueError(
            f"{path}: the optimizer holds {len(indices)} parameters, this model trains {len(param_names)}; "
            "the checkpoint belongs to another model or LoRA setting"
        )
    name_of = dict(zip(indices, param_names, strict=True))
    state = {}
    for index, moments in parts[0]["state"].items():
        state[name_of[index]] = {
            m: _merge([p["state"][index][m] for p in parts], f"{path}: optimizer state {index}.{m}") for m in moments
        }
    new_groups = [{**g, "params": [name_of[i] for i in g["params"]]} for g in groups]
    return {"state": state, "param_groups": new_groups}


def load_extra_state(path: str, rank: int = 0) -> dict[str, Any] | None:
    """Rank `rank`'s LR scheduler state (upstream's RNG states hold numpy arrays and are not read:
    weights_only loading refuses them); None when the file is missing."""
    world = upstream_world_size(path)
    file = os.path.join(path, f"extra_state_world_size_{world}_rank_{rank}.pt")
    if not os.path.isfile(file):
        return None
    import numpy as np

    allowed = [np.ndarray, np.dtype, np.dtypes.UInt32DType, np._core.multiarray._reconstruct]
    with torch.serialization.safe_globals(allowed):
        return torch.load(file, map_location="cpu", weights_only=True)
