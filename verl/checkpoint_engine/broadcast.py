"""Broadcast checkpoint engines: `gloo` (CPU tensors) and `nccl` (CUDA tensors), one code path.

The group holds the actor's rank 0 (group rank 0, the sender) and every rollout rank; it is built
once per run on a TCP store of its own, beside each worker group's default process group. One
update is a sequence of buckets; each bucket is three broadcasts from rank 0:

1. a header, int64 [version, meta bytes, data bytes, is_last, tensors sent so far];
2. the pickled list of `TensorMeta` of the bucket's chunks;
3. the bucket's bytes (a buffer of `bucket_bytes` allocated once, sent up to `data bytes`).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry, WeightSyncError, iter_chunks

__all__ = ["BroadcastCheckpointEngine", "GlooCheckpointEngine", "NCCLCheckpointEngine"]

ENGINE_KWARGS = {"timeout_s": "seconds a broadcast may wait for the other side (default 600)"}
_HEADER = 5


class BroadcastCheckpointEngine(CheckpointEngine):
    """Versioned bucketed broadcast from group rank 0 (see the module docstring)."""

    backend = "gloo"

    def __init__(self, bucket_bytes: int, device: str = "cpu", timeout_s: float = 600.0, **engine_kwargs: Any):
        unknown = sorted(set(engine_kwargs) - set(ENGINE_KWARGS))
        if unknown:
            raise ValueError(
                f"checkpoint_engine.engine_kwargs.{self.backend}: {unknown} are not read by the {self.backend} "
                f"engine; accepted: {sorted(ENGINE_KWARGS)}"
            )
        super().__init__(bucket_bytes, device)
        self.timeout = timedelta(seconds=float(timeout_s))
        self.rank: int | None = None
        self._store = None
        self._group = None
        self._bucket: torch.Tensor | None = None

    # ------------------------------------------------------------------ the group
    def _device(self) -> torch.device:
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def prepare(self, host: str = "127.0.0.1") -> dict[str, Any]:
        self._store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=self.timeout)
        return {"master_addr": host, "master_port": self._store.port}

    def init_process_group(self, rank: int, world_size: int, master_addr: str = "", master_port: int = 0) -> None:
        if self._group is not None:
            raise RuntimeError("the checkpoint engine's group is built once per run; it exists already")
        if rank == 0 and self._store is None:
            raise RuntimeError("the sender (rank 0) calls prepare() before init_process_group")
        if rank != 0:
            self._store = dist.TCPStore(master_addr, int(master_port), is_master=False, timeout=self.timeout)
        store = dist.PrefixStore("verl_checkpoint_engine", self._store)
        if self.backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = self.timeout
            self._group = dist.ProcessGroupNCCL(store, rank, world_size, opts)
        else:
            self._group = dist.ProcessGroupGloo(store, rank, world_size, self.timeout)
        self.rank = rank
        self._bucket = torch.empty(self.bucket_bytes, dtype=torch.uint8, device=self._device())

    def _broadcast(self, tensor: torch.Tensor) -> None:
        self._group.broadcast(tensor, 0).wait()

    def finalize(self) -> None:
        self._group = None
        self._store = None
        self._bucket = None

    # ------------------------------------------------------------------ sending
    def send_weights(self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: int) -> dict[str, float]:
        if self.rank != 0:
            raise RuntimeError(f"send_weights runs on the sender (group rank 0), not on rank {self.rank}")
        device = self._device()
        sent = buckets = total_bytes = 0
        pending = None
        for bucket in iter_chunks(weights, self.bucket_bytes):
            if pending is not None:
                self._send_bucket(pending, global_steps, is_last=False, sent=sent)
                buckets += 1
            for meta, chunk in bucket:
                self._bucket[meta.offset : meta.offset + meta.chunk_size].copy_(chunk.to(device, non_blocking=True))
                total_bytes += meta.chunk_size
                sent += int(meta.chunk_offset + meta.chunk_size == meta.nbytes)
            pending = [meta for meta, _ in bucket]
        self._send_bucket(pending or [], global_steps, is_last=True, sent=sent)
        return {"buckets": buckets + 1, "bytes": total_bytes, "tensors": sent}

    def _send_bucket(self, metas: list, version: int, is_last: bool, sent: int) -> None:
        device = self._device()
        meta_bytes = torch.frombuffer(bytearray(pickle.dumps(metas)), dtype=torch.uint8).to(device)
        used = sum(m.chunk_size for m in metas)
        header = torch.tensor([version, meta_bytes.numel(), used, int(is_last), sent], dtype=torch.int64)
        self._broadcast(header.to(device))
        self._broadcast(meta_bytes)
        if used:
            self._broadcast(self._bucket[:used])

    # ------------------------------------------------------------------ receiving
    def receive_weights(self, global_steps: int) -> Iterator[tuple[str, torch.Tensor]]:
        if self.rank in (None, 0):
            raise RuntimeError("receive_weights runs on a receiver (group rank >= 1) of a built group")
        device = self._device()
        partial: dict[str, torch.Tensor] = {}
        received = 0
        while True:
            header = torch.zeros(_HEADER, dtype=torch.int64, device=device)
            self._broadcast(header)
            version, n_meta, used, is_last, sent = (int(x) for x in header.cpu().tolist())
            if version != global_steps:
                raise WeightSyncError(
                    f"a bucket of weight version {version} arrived while version {global_steps} was due"
                )
            meta_bytes = torch.empty(n_meta, dtype=torch.uint8, device=device)
            self._broadcast(meta_bytes)
            metas = pickle.loads(meta_bytes.cpu().numpy().tobytes())
            if used:
                self._broadcast(self._bucket[:used])
            for meta in metas:
                done = self._take_chunk(meta, partial)
                if done is not None:
                    received += 1
                    yield meta.name, done
            if is_last:
                if received != sent or partial:
                    raise WeightSyncError(
                        f"weight version {global_steps}: {received} whole tensors arrived of {sent} sent"
                        + (f"; incomplete: {sorted(partial)}" if partial else "")
                    )
                return

    def _take_chunk(self, meta, partial: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """Copy one chunk out of the bucket; returns the tensor once its last chunk arrived."""
        chunk = self._bucket[meta.offset : meta.offset + meta.chunk_size]
        if meta.chunk_offset == 0 and meta.chunk_size == meta.nbytes:
            flat = chunk.clone()
        else:
            flat = partial.setdefault(meta.name, torch.empty(meta.nbytes, dtype=torch.uint8, device=chunk.device))
            flat[meta.chunk_offset : meta.chunk_offset + meta.chunk_size].copy_(chunk)
            if meta.chunk_offset + meta.chunk_size < meta.nbytes:
                return None
            partial.pop(meta.name)
        if meta.nbytes == 0:
            return torch.empty(meta.shape, dtype=meta.dtype, device=chunk.device)
        return flat.view(meta.dtype).reshape(meta.shape)


@CheckpointEngineRegistry.register("gloo")
class GlooCheckpointEngine(BroadcastCheckpointEngine):
    """CPU tensors over gloo."""

    backend = "gloo"


@CheckpointEngineRegistry.register("nccl")
class NCCLCheckpointEngine(BroadcastCheckpointEngine):
    """CUDA tensors over NCCL (the same protocol as gloo; buckets live on the current GPU)."""

    backend = "nccl"
