"""Weight transfer from the actor to rollout workers of their own (upstream's package name).

`CheckpointEngineRegistry.new(backend, bucket_bytes, ...)`; backends `gloo` (CPU) and `nccl`
(CUDA), see `broadcast`. `resolve_backend` maps upstream's backend names onto these.
"""

from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    TensorMeta,
    WeightSyncError,
    iter_chunks,
    resolve_backend,
)
from verl.checkpoint_engine.broadcast import BroadcastCheckpointEngine, GlooCheckpointEngine, NCCLCheckpointEngine

__all__ = [
    "BroadcastCheckpointEngine",
    "CheckpointEngine",
    "CheckpointEngineRegistry",
    "GlooCheckpointEngine",
    "NCCLCheckpointEngine",
    "TensorMeta",
    "WeightSyncError",
    "iter_chunks",
    "resolve_backend",
]
