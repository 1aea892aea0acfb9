"""Backend-neutral parts of a worker group: resource pools, deferred construction, method binding.

A `WorkerGroup` is the driver's handle on N identical workers. For every method of the worker
class decorated with `@register`, the group gets an attribute of the same name: calling it on the
driver dispatches the arguments over the workers, runs the method on them and collects the
results, as the method's dispatch and execute modes say. The backend (`RayWorkerGroup`) supplies
the actual remote execution (`execute_all`, `execute_rank_zero`) and the proxy factory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from verl.single_controller.base.decorator import (
    MAGIC_ATTR,
    Dispatch,
    get_predefined_dispatch_fn,
    get_predefined_execute_fn,
)

logger = logging.getLogger(__name__)

__all__ = ["ClassWithInitArgs", "ResourcePool", "WorkerGroup"]


class ResourcePool:
    """How many worker processes to place on each node.

    Args:
        process_on_nodes: ``[n_0, n_1, ...]``: ``n_i`` processes (one per GPU on GPU nodes) on node i.
        max_colocate_count: how many worker groups may share each process slot (colocated roles
            of different groups); each group's worker then takes ``1 / max_colocate_count`` of the
            slot's resources.
        n_gpus_per_node: GPUs per node (informational; used by upstream-style callers).
    """

    def __init__(
        self, process_on_nodes: list[int] | None = None, max_colocate_count: int = 10, n_gpus_per_node: int = 8
    ) -> None:
        process_on_nodes = list(process_on_nodes or [])
        for i, n in enumerate(process_on_nodes):
            if not isinstance(n, int) or n <= 0:
                raise ValueError(f"process_on_nodes[{i}] must be a positive int, got {n!r}")
        if not isinstance(max_colocate_count, int) or max_colocate_count <= 0:
            raise ValueError(f"max_colocate_count must be a positive int, got {max_colocate_count!r}")
        self._store = process_on_nodes
        self.max_colocate_count = max_colocate_count
        self.n_gpus_per_node = n_gpus_per_node

    def add_node(self, process_count: int) -> None:
        if not isinstance(process_count, int) or process_count <= 0:
            raise ValueError(f"process_count must be a positive int, got {process_count!r}")
        self._store.append(process_count)

    @property
    def world_size(self) -> int:
        return sum(self._store)

    def __call__(self) -> list[int]:
        return self._store

    @property
    def store(self) -> list[int]:
        return self._store

    def local_world_size_list(self) -> list[int]:
        """For each global rank, the number of processes on its node."""
        return [count for count in self._store for _ in range(count)]

    def local_rank_list(self) -> list[int]:
        """For each global rank, its position on its node."""
        return [i for count in self._store for i in range(count)]


class ClassWithInitArgs:
    """A class and the arguments to construct it with, instantiated later (in the worker)."""

    def __init__(self, cls, *args, **kwargs) -> None:
        self.cls = cls
        self.args = args
        self.kwargs = kwargs

    def __call__(self) -> Any:
        return self.cls(*self.args, **self.kwargs)


class WorkerGroup:
    """Driver-side handle of a set of workers; see the module docstring.

    Subclasses provide ``execute_all(method_name, *args, **kwargs)`` and
    ``execute_rank_zero(method_name, *args, **kwargs)`` and a proxy factory for
    `_bind_worker_method`.
    """

    def __init__(self, resource_pool: ResourcePool | None, **kwargs) -> None:
        # `resource_pool` is part of the upstream signature; the backend subclass places the workers
        self._workers: list = []
        self._worker_names: list[str] = []
        # mesh name -> per-rank dp rank / collect flag, filled lazily by the nd dispatch mode
        self._dispatch_info: dict[str, list[int]] = {}
        self._collect_info: dict[str, list[bool]] = {}
        self._master_addr: str | None = None
        self._master_port: str | None = None
        self._bound_methods: list[str] = []

    @property
    def world_size(self) -> int:
        return len(self._workers)

    @property
    def worker_names(self) -> list[str]:
        return self._worker_names

    @property
    def workers(self) -> list:
        """The backend's worker handles (Ray actor handles; the in-process worker)."""
        return self._workers

    @property
    def master_address(self) -> str | None:
        """Rendezvous address of rank 0 (MASTER_ADDR of the workers)."""
        return self._master_addr

    @property
    def master_port(self) -> str | None:
        return self._master_port

    def execute_all(self, method_name: str, *args, **kwargs):
        raise NotImplementedError

    def execute_rank_zero(self, method_name: str, *args, **kwargs):
        raise NotImplementedError

    def _bind_worker_method(self, user_defined_cls: type, func_generator: Callable) -> list[str]:
        """Create a driver-side proxy for every `@register`ed method of `user_defined_cls`.

        ``func_generator(self, method_name, dispatch_fn, collect_fn, execute_fn, blocking)`` builds
        the proxy. Returns the bound method names.
        """
        bound = []
        for name in dir(user_defined_cls):
            try:
                method = getattr(user_defined_cls, name)
            except AttributeError:
                continue
            if not callable(method) or not hasattr(method, MAGIC_ATTR):
                continue
            attrs = getattr(method, MAGIC_ATTR)
            dispatch_mode = attrs["dispatch_mode"]
            if isinstance(dispatch_mode, Dispatch):
                fns = get_predefined_dispatch_fn(dispatch_mode)
            elif isinstance(dispatch_mode, dict):
                fns = dispatch_mode
            else:
                raise TypeError(f"{user_defined_cls.__name__}.{name}: invalid dispatch mode {dispatch_mode!r}")
            execute_fn_name = get_predefined_execute_fn(attrs["execute_mode"])["execute_fn_name"]
            execute_fn = getattr(self, execute_fn_name)
            proxy = func_generator(
                self,
                name,
                dispatch_fn=fns["dispatch_fn"],
                collect_fn=fns["collect_fn"],
                execute_fn=execute_fn,
                blocking=attrs["blocking"],
            )
            if name not in self.__dict__ and hasattr(type(self), name):
                logger.warning(
                    "%s.%s shadows the worker group's own attribute of that name", user_defined_cls.__name__, name
                )
            try:
                setattr(self, name, proxy)
            except AttributeError as err:
                raise ValueError(
                    f"cannot expose {user_defined_cls.__name__}.{name} on the worker group: the name is a read-only "
                    f"attribute of {type(self).__name__}"
                ) from err
            bound.append(name)
        self._bound_methods = bound
        return bound

    def _expose_role(self, role: str) -> None:
        """For a group over colocated workers: the proxies of `role` (bound as ``<role>_<name>``)
        also under their own names, so the group looks like one of that role alone."""
        head = f"{role}_"
        for method_name in list(self._bound_methods):
            if method_name.startswith(head):
                setattr(self, method_name[len(head) :], getattr(self, method_name))
