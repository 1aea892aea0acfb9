"""`Worker`: base class of everything a worker group runs, one instance per process (Ray actor).

A worker learns its place in the group from environment variables set by the worker group
before the process starts (the torchrun convention):

====================  =========================================================
``RANK``              global rank in the group, 0..WORLD_SIZE-1
``WORLD_SIZE``        number of workers in the group
``LOCAL_RANK``        position among the group's workers on this node
``LOCAL_WORLD_SIZE``  the group's workers on this node
``MASTER_ADDR``       address of rank 0's node, for torch.distributed rendezvous
``MASTER_PORT``       a free port on that node
``VERL_WORKER_NUM_THREADS``  torch CPU threads for this worker (Ray sets OMP_NUM_THREADS=1)
====================  =========================================================

`init_process_group_if_needed` turns these into the default torch.distributed process group
(gloo on CPU, nccl on CUDA) over which workers build their device meshes.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch

from verl.single_controller.base.decorator import Dispatch, Execute, register
from verl.utils.device import get_dist_backend, get_torch_device, is_cuda_available

__all__ = ["Worker", "WorkerHelper", "init_process_group_if_needed"]

NUM_THREADS_ENV = "VERL_WORKER_NUM_THREADS"


class WorkerHelper:
    """Network helpers used to choose the rendezvous address of a group."""

    @staticmethod
    def _get_node_ip() -> str:
        try:
            import ray

            if ray.is_initialized():
                return ray.util.get_node_ip_address()
        except ImportError:  # pragma: no cover - ray is a dependency
            pass
        return "127.0.0.1"

    @staticmethod
    def _get_free_port() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return sock.getsockname()[1]

    def get_available_master_addr_port(self) -> tuple[str, str]:
        return self._get_node_ip().strip("[]"), str(self._get_free_port())


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} must be an integer") from None


def init_process_group_if_needed(backend: str | None = None, timeout_s: float = 600.0) -> bool:
    """Create torch.distributed's default process group from RANK / WORLD_SIZE / MASTER_ADDR /
    MASTER_PORT, unless one exists already. Returns True when it created one.

    Args:
        backend: ``"gloo"``, ``"nccl"`` or ``"cpu:gloo,cuda:nccl"``; default `get_dist_backend()`
            (nccl on CUDA, gloo on CPU).
        timeout_s: how long collectives wait for a missing peer before failing.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise RuntimeError(
            f"cannot create the process group: environment variables {missing} are not set (a RayWorkerGroup sets "
            "them for its workers)"
        )
    backend = backend or get_dist_backend()
    if "nccl" in backend and is_cuda_available:
        get_torch_device().set_device(_local_device_index())
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    timeout = timedelta(seconds=timeout_s)
    if address in _LOOPBACK:
        # every rank is on this machine: the rendezvous store listens on loopback only (torch's
        # TCPStore server binds all interfaces unless it is handed a socket bound elsewhere)
        store = _loopback_store(port, rank, world_size, timeout)
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        return True
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )
    return True


_LOOPBACK = ("127.0.0.1", "localhost")


def _loopback_store(port: int, rank: int, world_size: int, timeout: timedelta):
    """torch.distributed's TCPStore on 127.0.0.1:`port`; rank 0 serves it from a socket bound to
    loopback, the other ranks connect to it."""
    import socket

    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore("127.0.0.1", port, world_size, False, timeout=timeout)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    # detach: the store owns the descriptor from here on (Python must not close it when `listener` goes)
    return dist.TCPStore("127.0.0.1", port, world_size, True, timeout=timeout, master_listen_fd=listener.detach())


def _local_device_index() -> int:
    # Ray gives each GPU actor its own CUDA_VISIBLE_DEVICES, so the actor usually sees one device
    # (index 0); without that isolation, LOCAL_RANK picks the device.
    count = torch.cuda.device_count()
    if count <= 1:
        return 0
    return _env_int("LOCAL_RANK", 0) % count


class Worker(WorkerHelper):
    """Base class of worker processes.

    Subclass it, call ``super().__init__()`` first, and decorate the methods the driver calls with
    `@register`. Properties: `rank`, `world_size`, `local_rank`; `get_master_addr_port()`.
    """

    def __init__(self, cuda_visible_devices: str | None = None) -> None:
        # `cuda_visible_devices` exists for upstream signature compatibility; Ray assigns devices.
        self._rank = _env_int("RANK", 0)
        self._world_size = _env_int("WORLD_SIZE", 1)
        self._local_rank = _env_int("LOCAL_RANK", 0)
        self._local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
        if not (0 <= self._rank < self._world_size):
            raise ValueError(f"RANK={self._rank} is outside [0, WORLD_SIZE={self._world_size})")
        if not os.environ.get("MASTER_ADDR") and self._world_size == 1:
            # a lone worker (e.g. created outside a group, in a test) can still form a group of one
            os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(self._get_free_port())
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
        self._master_addr = os.environ.get("MASTER_ADDR")
        self._master_port = os.environ.get("MASTER_PORT")
        threads = _env_int(NUM_THREADS_ENV, 0)
        if threads > 0 and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if is_cuda_available and torch.cuda.device_count() > 0:
            torch.cuda.set_device(_local_device_index())
        self.__dispatch_dp_rank: dict[str, int] = {}
        self.__collect_dp_rank: dict[str, bool] = {}

    # ------------------------------------------------------------------ identity

    @property
    def rank(self) -> int:
        return self.__dict__.get("_rank", _env_int("RANK", 0))

    @property
    def world_size(self) -> int:
        return self.__dict__.get("_world_size", _env_int("WORLD_SIZE", 1))

    @property
    def local_rank(self) -> int:
        return self.__dict__.get("_local_rank", _env_int("LOCAL_RANK", 0))

    def get_master_addr_port(self) -> tuple[str | None, str | None]:
        return self.__dict__.get("_master_addr", os.environ.get("MASTER_ADDR")), self.__dict__.get(
            "_master_port", os.environ.get("MASTER_PORT")
        )

    def get_cuda_visible_devices(self) -> str:
        return os.environ.get("CUDA_VISIBLE_DEVICES", "not set")

    def init_process_group_if_needed(self, backend: str | None = None, timeout_s: float = 600.0) -> bool:
        """Create the group's default torch.distributed process group (see the module function)."""
        return init_process_group_if_needed(backend=backend, timeout_s=timeout_s)

    # ------------------------------------------------------------------ mesh-aware dispatch

    def _mesh_tables(self) -> tuple[dict, dict]:
        # created lazily too, in case a subclass forgot super().__init__()
        if "_Worker__dispatch_dp_rank" not in self.__dict__:
            self.__dispatch_dp_rank, self.__collect_dp_rank = {}, {}
        return self.__dispatch_dp_rank, self.__collect_dp_rank

    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Declare this worker's data-parallel rank in `mesh_name` and whether the driver collects
        its output (one collect rank per dp rank, e.g. tensor-parallel rank 0)."""
        dispatch, collect = self._mesh_tables()
        if mesh_name in dispatch:
            raise ValueError(f"mesh {mesh_name!r} is already registered on rank {self.rank}")
        dispatch[mesh_name] = int(dp_rank)
        collect[mesh_name] = bool(is_collect)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:
        dispatch, _ = self._mesh_tables()
        if mesh_name not in dispatch:
            raise KeyError(
                f"mesh {mesh_name!r} is not registered on rank {self.rank} of {type(self).__name__}; "
                f"registered: {sorted(dispatch)}"
            )
        return dispatch[mesh_name]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        _, collect = self._mesh_tables()
        if mesh_name not in collect:
            raise KeyError(
                f"mesh {mesh_name!r} is not registered on rank {self.rank} of {type(self).__name__}; "
                f"registered: {sorted(collect)}"
            )
        return collect[mesh_name]

    # ------------------------------------------------------------------ generic remote execution

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(self, func, *args, **kwargs):
        """Run ``func(self, *args, **kwargs)`` on each worker's chunk of the data."""
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func, *args, **kwargs):
        """Run ``func(*args, **kwargs)`` on rank 0 and return its result."""
        return func(*args, **kwargs)
