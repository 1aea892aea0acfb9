"""In-process backend: `LocalWorkerGroup` runs a one-worker group inside the driver process."""

from verl.single_controller.local.base import LocalWorkerGroup, WorkerRngs, create_local_colocated_worker_cls

__all__ = ["LocalWorkerGroup", "WorkerRngs", "create_local_colocated_worker_cls"]
