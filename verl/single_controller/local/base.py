"""In-process backend of the single controller: a worker group whose one worker lives in the driver.

A job of one worker process on one machine (the default CPU job) needs none of what Ray adds: no
placement, no second process, no object store. `LocalWorkerGroup` runs the same worker class
through the same `@register` dispatch and collect functions as `RayWorkerGroup`, with what a
separate process would give the worker:

- **its own random generators.** Python's `random`, NumPy's global generator and torch's CPU
  generator start as a fresh process's (torch's fixed default seed, the others from the OS) and
  are swapped in around every call, so the driver's and the worker's random streams are the ones
  they would be in two processes (`WorkerRngs`);
- **arguments and results by value.** Both are copied (`copy.deepcopy`; Ray pickles them), so a
  worker that changes a batch in place, or returns a view of a buffer it reuses, does not reach
  into the driver's objects;
- **its environment.** The driver's environment when the group was created plus `RANK=0`,
  `WORLD_SIZE=1`, a free `MASTER_PORT` on 127.0.0.1 and the thread count (what Ray's group gives
  its actors), swapped in around every call; what the worker sets there stays its own.
  `kill_workers` drops the worker, destroys the process group it created and restores the
  process's torch thread count;
- **errors named like Ray's.** A raising worker method raises `WorkerCallError` ("<Class>.<method>
  on rank 0 (in-process) raised an exception: ...") with the original exception as its cause.

Coroutine methods run on an event loop of the group. A non-blocking method (`register(blocking=
False)`) runs at once; a DataProto result comes back as an already-resolved `DataProtoFuture`.
Calls cannot time out (the worker is this thread). The group holds exactly one worker: a job with
more ranks, GPUs or several machines uses `RayWorkerGroup`.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import inspect
import logging
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from verl.dataproto.futures import WorkerCallError
from verl.protocol import DataProto, DataProtoFuture
from verl.single_controller.base.colocation import colocated_worker_class, unwrap_worker_class
from verl.single_controller.base.decorator import _padding_size_key, unpad_output
from verl.single_controller.base.worker import NUM_THREADS_ENV, WorkerHelper
from verl.single_controller.base.worker_group import ClassWithInitArgs, ResourcePool, WorkerGroup
from verl.utils.reproducibility import current_determinism as determinism_state
from verl.utils.reproducibility import restore_determinism

logger = logging.getLogger(__name__)

__all__ = ["LocalWorkerGroup", "WorkerRngs", "create_local_colocated_worker_cls"]


class WorkerRngs:
    """The global random generators of one in-process worker (Python, NumPy, torch CPU).

    Created as a fresh process has them; `active()` swaps them in for the duration of a block
    and keeps whatever the block did to them for the next one."""

    def __init__(self) -> None:
        self.python = random.Random().getstate()
        self.numpy = np.random.RandomState().get_state()
        self.torch = torch.Generator().get_state()  # torch's fixed default seed, as at process start

    @contextmanager
    def active(self) -> Iterator[None]:
        outside = random.getstate(), np.random.get_state(), torch.get_rng_state()
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch)
        try:
            yield
        finally:
            self.python, self.numpy, self.torch = random.getstate(), np.random.get_state(), torch.get_rng_state()
            random.setstate(outside[0])
            np.random.set_state(outside[1])
            torch.set_rng_state(outside[2])


def _replace_environ(target: dict[str, str]) -> None:
    """Make `os.environ` equal to `target`, touching only the variables that differ."""
    for key in [k for k in os.environ if k not in target]:
        del os.environ[key]
    for key, value in target.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _resolved(values: list, labels=None, timeout=None) -> list:
    # the "refs" of an in-process future are its values
    return values


class _InProcessWorker:
    """The one worker object, its generators, environment and event loop; shared by the group and
    the per-role groups `spawn` makes."""

    def __init__(self, cls_with_init: ClassWithInitArgs, env: dict[str, str]) -> None:
        self.cls_name = unwrap_worker_class(cls_with_init.cls).__name__
        self.rngs = WorkerRngs()
        self.loop: asyncio.AbstractEventLoop | None = None
        # the worker's whole environment, as a process started now with `env` added would have it;
        # what the worker sets in it stays its own (and out of the driver's)
        self.environ = {**os.environ, **env}
        self.driver_threads = torch.get_num_threads()
        self.driver_determinism = determinism_state()
        import torch.distributed as dist

        self.had_process_group = dist.is_available() and dist.is_initialized()
        cls = unwrap_worker_class(cls_with_init.cls)
        args, kwargs = copy.deepcopy((cls_with_init.args, cls_with_init.kwargs))
        self.instance: Any = None
        try:
            with self.active():
                self.instance = cls(*args, **kwargs)
        except Exception as err:
            self.close()
            raise WorkerCallError(
                f"{self.label('__init__')} raised an exception: {type(err).__name__}: {err}",
                self.label("__init__"),
                0,
                "__init__",
            ) from err

    @contextmanager
    def active(self) -> Iterator[None]:
        """The worker's environment and random generators, for one call."""
        driver_environ = dict(os.environ)
        _replace_environ(self.environ)
        try:
            with self.rngs.active():
                yield
        finally:
            self.environ = dict(os.environ)
            _replace_environ(driver_environ)

    def label(self, method_name: str) -> str:
        return f"{self.cls_name}.{method_name} on rank 0 (in-process)"

    def call(self, method_name: str, args: tuple, kwargs: dict) -> Any:
        if self.instance is None:
            raise RuntimeError(f"{self.label(method_name)}: the worker was shut down (kill_workers)")
        try:
            method = getattr(self.instance, method_name)
        except AttributeError:
            raise AttributeError(f"worker class {self.cls_name} has no method {method_name!r}") from None
        args, kwargs = copy.deepcopy((args, kwargs))
        try:
            with self.active():
                out = method(*args, **kwargs)
                if inspect.iscoroutine(out):
                    if self.loop is None:
                        self.loop = asyncio.new_event_loop()
                    out = self.loop.run_until_complete(out)
        except Exception as err:
            label = self.label(method_name)
            raise WorkerCallError(
                f"{label} raised an exception: {type(err).__name__}: {err}", label, 0, method_name
            ) from err
        return copy.deepcopy(out)

    def close(self) -> None:
        """Drop the worker, its process group and its event loop; give the process its torch
        thread count and deterministic-algorithms settings back (the worker set its own)."""
        self.instance = None
        if self.loop is not None:
            self.loop.close()
            self.loop = None
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and not self.had_process_group:
            dist.destroy_process_group()
        if torch.get_num_threads() != self.driver_threads:
            torch.set_num_threads(self.driver_threads)
        restore_determinism(self.driver_determinism)
        gc.collect()


def _local_proxy(group: LocalWorkerGroup, method_name: str, dispatch_fn, collect_fn, execute_fn, blocking: bool):
    """Driver-side proxy of a registered worker method: dispatch -> execute -> collect -> unpad."""

    def proxy(*args, **kwargs):
        args, kwargs = dispatch_fn(group, *args, **kwargs)
        pad = kwargs.pop(_padding_size_key, 0)
        output = collect_fn(group, execute_fn(method_name, *args, **kwargs))
        if pad:
            output = unpad_output(output, pad)
        if not blocking and isinstance(output, DataProto):
            output = DataProtoFuture(collect_fn=_first, futures=[output], resolve_fn=_resolved)
        return output

    proxy.__name__ = method_name
    proxy.__qualname__ = f"{type(group).__name__}.{method_name}"
    return proxy


def _first(outputs: list):
    return outputs[0]


class LocalWorkerGroup(WorkerGroup):
    """One worker in the driver process, behind the `WorkerGroup` interface (module docstring).

    Args (those of `RayWorkerGroup` that apply):
        resource_pool: a pool of exactly one process slot (`ResourcePool([1])`).
        ray_cls_with_init: the worker class (plain or `ray.remote`) and its constructor arguments.
        name_prefix: the worker's `WG_PREFIX`.
        num_threads_per_worker: torch CPU threads of the process while the worker lives. Default:
            env ``VERL_WORKER_NUM_THREADS``, else torch's current count.
        device_name: must be ``"cpu"``: the in-process backend runs CPU jobs.
    """

    in_process = True

    def __init__(
        self,
        resource_pool: ResourcePool | None = None,
        ray_cls_with_init: ClassWithInitArgs | None = None,
        name_prefix: str | None = None,
        *,
        num_threads_per_worker: int | None = None,
        device_name: str = "cpu",
        _shared: _InProcessWorker | None = None,
        **kwargs,
    ) -> None:
        super().__init__(resource_pool=resource_pool)
        if kwargs:
            logger.warning("LocalWorkerGroup ignores arguments that only a Ray worker group has: %s", sorted(kwargs))
        if device_name not in ("cpu",):
            raise ValueError(
                f"LocalWorkerGroup runs CPU jobs only, got device_name={device_name!r}; use RayWorkerGroup "
                "(trainer.worker_backend=ray)"
            )
        if ray_cls_with_init is None:
            raise ValueError("LocalWorkerGroup needs ray_cls_with_init (the worker class and its arguments)")
        self.ray_cls_with_init = ray_cls_with_init
        self.user_cls = unwrap_worker_class(ray_cls_with_init.cls)
        self.name_prefix = name_prefix or "local_"
        if _shared is None:
            world = resource_pool.world_size if resource_pool is not None else 1
            if world != 1:
                raise ValueError(
                    f"LocalWorkerGroup runs exactly one worker in this process; the resource pool has {world} "
                    "slots: use RayWorkerGroup (trainer.worker_backend=ray)"
                )
            _shared = _InProcessWorker(ray_cls_with_init, self._worker_env(num_threads_per_worker))
        self._shared = _shared
        self._workers = [_shared]
        self._worker_names = [f"{self.name_prefix}{self.user_cls.__name__}_0:0"]
        self._master_addr, self._master_port = _shared.environ["MASTER_ADDR"], _shared.environ["MASTER_PORT"]
        self._bind_worker_method(self.user_cls, _local_proxy)

    def _worker_env(self, num_threads_per_worker: int | None) -> dict[str, str]:
        if num_threads_per_worker is None:
            from_env = os.environ.get(NUM_THREADS_ENV)
            num_threads_per_worker = int(from_env) if from_env else torch.get_num_threads()
        if num_threads_per_worker < 1:
            raise ValueError(f"num_threads_per_worker must be >= 1, got {num_threads_per_worker}")
        return {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(WorkerHelper._get_free_port()),
            "WG_PREFIX": self.name_prefix,
            "WG_BACKEND": "local",
            NUM_THREADS_ENV: str(num_threads_per_worker),
        }

    # ------------------------------------------------------------------ execution

    def execute_all(self, method_name: str, *args, **kwargs) -> list:
        """Run `method_name` on the worker; per-worker lists (one entry) are unwrapped."""
        scatter = all(isinstance(a, list) and len(a) == 1 for a in args) and all(
            isinstance(v, list) and len(v) == 1 for v in kwargs.values()
        )
        if scatter:
            args = tuple(a[0] for a in args)
            kwargs = {k: v[0] for k, v in kwargs.items()}
        return [self._shared.call(method_name, args, kwargs)]

    execute_all_sync = execute_all
    execute_all_async = execute_all

    def execute_rank_zero(self, method_name: str, *args, **kwargs):
        return self._shared.call(method_name, args, kwargs)

    execute_rank_zero_sync = execute_rank_zero
    execute_rank_zero_async = execute_rank_zero

    # ------------------------------------------------------------------ colocation and lifecycle

    def spawn(self, prefix_set) -> dict[str, LocalWorkerGroup]:
        """For a colocated group (`create_local_colocated_worker_cls`): one group per role over
        the same worker, exposing that role's methods under their own names."""
        groups = {}
        for prefix in prefix_set:
            group = LocalWorkerGroup(
                ray_cls_with_init=self.ray_cls_with_init, name_prefix=self.name_prefix, _shared=self._shared
            )
            group._expose_role(prefix)
            groups[prefix] = group
        return groups

    def kill_workers(self) -> None:
        """Drop the worker (all roles of a colocated group) and the process group it created."""
        self._shared.close()


def create_local_colocated_worker_cls(class_dict: dict[str, ClassWithInitArgs]) -> ClassWithInitArgs:
    """`create_colocated_worker_cls` for `LocalWorkerGroup`: one worker object holding every role."""
    if not class_dict:
        raise ValueError("create_local_colocated_worker_cls needs at least one role")
    for role, cia in class_dict.items():
        if not isinstance(cia, ClassWithInitArgs):
            raise TypeError(f"class_dict[{role!r}] must be a ClassWithInitArgs, got {type(cia).__name__}")
    # by value, as a Ray actor receives them: a role that edits its config leaves the driver's alone
    roles = {role: (cia.cls, *copy.deepcopy((cia.args, cia.kwargs))) for role, cia in class_dict.items()}
    return ClassWithInitArgs(colocated_worker_class(roles, module=__name__))
