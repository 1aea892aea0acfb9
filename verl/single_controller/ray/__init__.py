"""Ray backend: `RayResourcePool`, `RayClassWithInitArgs`, `RayWorkerGroup`, `create_colocated_worker_cls`."""

from verl.single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerCallError,
    create_colocated_worker_cls,
)

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "WorkerCallError",
    "create_colocated_worker_cls",
]
