"""The checkpoint-engine interface: how the actor's weights reach rollout workers of their own.

A colocated rollout shares the actor's process and needs no engine (`naive`). A rollout worker
group of its own (`actor_rollout_ref.hybrid_engine=False`) receives every weight update through an
engine built once per run:

    sender (actor rank 0)                      receivers (every rollout rank)
    meta = engine.prepare()                    -
    engine.init_process_group(rank=0, ...)     engine.init_process_group(rank=1.., **meta)
    engine.send_weights(named_tensors, v)      for name, t in engine.receive_weights(v): ...

`send_weights` packs the tensors into buckets of `update_weights_bucket_megabytes` (a tensor
larger than a bucket travels in chunks) and stamps every bucket with the version `v` (the global
step whose weights these are). `receive_weights` yields each tensor once it is complete and raises
`WeightSyncError` when a bucket carries another version or the last bucket's tensor count does not
match what arrived (a partial sync): a receiver never applies half of an update silently.

Backends register by name (`CheckpointEngineRegistry.register`); `custom_backend_module` may
register more.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = [
    "CheckpointEngine",
    "CheckpointEngineRegistry",
    "TensorMeta",
    "WeightSyncError",
    "iter_chunks",
    "resolve_backend",
]


class WeightSyncError(RuntimeError):
    """A weight update that did not arrive whole (wrong version, missing or extra tensors)."""


@dataclass(frozen=True)
class TensorMeta:
    """Where one chunk of one tensor lies in a bucket (all sizes in bytes)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int  # the whole tensor
    chunk_offset: int  # where this chunk starts inside the tensor's bytes
    chunk_size: int
    offset: int  # where this chunk starts inside the bucket


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's storage as a flat uint8 view (no copy for a contiguous tensor)."""
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)


def iter_chunks(
    weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[TensorMeta, torch.Tensor]]]:
    """Group `weights` into buckets of at most `bucket_bytes` bytes: each bucket is a list of
    (meta, uint8 chunk). A tensor larger than a bucket is split over consecutive buckets."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size must be positive, got {bucket_bytes} bytes")
    bucket: list[tuple[TensorMeta, torch.Tensor]] = []
    used = 0
    for name, tensor in weights:
        data = _as_bytes(tensor)
        total = data.numel()
        start = 0
        while True:
            if used == bucket_bytes:
                yield bucket
                bucket, used = [], 0
            size = min(bucket_bytes - used, total - start)
            meta = TensorMeta(name, tuple(tensor.shape), tensor.dtype, total, start, size, used)
            bucket.append((meta, data[start : start + size]))
            used += size
            start += size
            if start >= total:
                break
    if bucket:
        yield bucket


class CheckpointEngine(ABC):
    """Moves named tensors from one sender to every receiver, in versioned buckets (see the
    module docstring). One instance per process, built once per run."""

    def __init__(self, bucket_bytes: int, device: str = "cpu", **engine_kwargs: Any) -> None:
        self.bucket_bytes = int(bucket_bytes)
        self.device = device

    @abstractmethod
    def prepare(self, host: str = "127.0.0.1") -> dict[str, Any]:
        """On the sender: open what receivers connect to at `host` (this node's address); returns
        their connection arguments."""

    @abstractmethod
    def init_process_group(self, rank: int, world_size: int, **connection: Any) -> None:
        """Join the group (sender rank 0, receivers 1..world_size-1)."""

    @abstractmethod
    def send_weights(self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: int) -> dict[str, float]:
        """Send every tensor of `weights` stamped with version `global_steps`; returns figures
        (`buckets`, `bytes`)."""

    @abstractmethod
    def receive_weights(self, global_steps: int) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield every tensor of the update of version `global_steps`; raises WeightSyncError."""

    @abstractmethod
    def finalize(self) -> None:
        """Leave the group and free the buffers."""


class CheckpointEngineRegistry:
    """Backend name -> engine class."""

    _registry: dict[str, type[CheckpointEngine]] = {}

    @staticmethod
    def register(backend: str):
        def wrapper(cls: type[CheckpointEngine]) -> type[CheckpointEngine]:
            CheckpointEngineRegistry._registry[backend] = cls
            return cls

        return wrapper

    @classmethod
    def names(cls) -> list[str]:
        return sorted(cls._registry)

    @classmethod
    def get(cls, backend: str) -> type[CheckpointEngine]:
        if backend not in cls._registry:
            raise ValueError(f"checkpoint engine {backend!r} is not registered; registered: {cls.names()}")
        return cls._registry[backend]

    @classmethod
    def new(cls, backend: str, *args, **kwargs) -> CheckpointEngine:
        return cls.get(backend)(*args, **kwargs)


# Upstream's backends for GPUs and RDMA fabrics move the same bytes as a broadcast does; here they
# run as the broadcast of the device at hand (`nccl` on CUDA, `gloo` on CPU).
UPSTREAM_BROADCAST_BACKENDS = ("nccl", "nixl", "kimi", "mooncake")
# backends this project does not have at all (NPU collectives, sparse deltas applied by sglang)
UNAVAILABLE_BACKENDS = {"hccl": "Ascend NPU (HCCL)", "delta_sharded": "sparse weight deltas (sglang only)"}


_logged_mappings: set[tuple[str, str]] = set()  # each mapping is logged once per process


def resolve_backend(backend: str, device: str) -> str:
    """The registered backend that serves `checkpoint_engine.backend=backend` on `device`.

    `gloo`/`nccl` as given (nccl needs cuda); upstream's GPU names map to the device's broadcast
    with one log line; `naive` (in-process copy) serves only a colocated rollout. Raises
    ValueError naming the key for anything else."""
    key = "actor_rollout_ref.rollout.checkpoint_engine.backend"
    if backend in UNAVAILABLE_BACKENDS:
        raise ValueError(
            f"{key}={backend}: {UNAVAILABLE_BACKENDS[backend]} weight sync is not available in this verl "
            "(available: gloo on CPU, nccl on CUDA)"
        )
    if backend == "naive":
        raise ValueError(
            f"{key}=naive copies weights inside one process, but the rollout has workers of its own "
            "(actor_rollout_ref.hybrid_engine=False); use gloo (CPU) or nccl (CUDA)"
        )
    if backend == "gloo":
        return "gloo"
    if backend in UPSTREAM_BROADCAST_BACKENDS:
        ours = "nccl" if device == "cuda" else "gloo"
        if ours != backend and (backend, ours) not in _logged_mappings:
            _logged_mappings.add((backend, ours))
            logger.warning("%s=%s runs here as the %s broadcast engine (device %s)", key, backend, ours, device)
        return ours
    if backend in CheckpointEngineRegistry.names():
        return backend
    raise ValueError(
        f"{key}={backend!r} is not a checkpoint engine; expected gloo, nccl, one of upstream's "
        f"{list(UPSTREAM_BROADCAST_BACKENDS)} or a backend registered by custom_backend_module "
        f"(registered: {CheckpointEngineRegistry.names()})"
    )
