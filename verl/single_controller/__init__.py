"""The single controller: one driver calls methods on groups of workers.

`verl.single_controller.base` holds the backend-neutral pieces (`Worker`, `WorkerGroup`,
`@register`); `verl.single_controller.ray` the Ray backend (`RayWorkerGroup`, `RayResourcePool`).
See docs/single_controller.md.
"""

from verl.single_controller.base import ClassWithInitArgs, ResourcePool, Worker, WorkerGroup

__all__ = ["ClassWithInitArgs", "ResourcePool", "Worker", "WorkerGroup"]
