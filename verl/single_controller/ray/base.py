"""Ray backend of the single controller: resource pools on placement groups, worker groups of Ray
actors, and colocation of several roles in one actor process.

Typical use (identical to upstream verl)::

    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(MyWorker), config=cfg))
    out = wg.compute(data)          # a @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO) method

Placement: each entry of ``process_on_nodes`` becomes one placement group (STRICT_PACK: all its
bundles on one node); each bundle is one process slot holding ``num_cpus_per_worker`` CPUs (and
one GPU when ``use_gpu``). A worker group puts its rank r into slot r; up to
``max_colocate_count`` groups can share the slots, each actor taking that fraction of the slot.
"""

from __future__ import annotations

import logging
import math
import os
import random
import string
from typing import Any

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from verl.protocol import DataProto, DataProtoFuture
from verl.single_controller.base.colocation import colocated_worker_class, unwrap_worker_class
from verl.single_controller.base.decorator import _padding_size_key, unpad_output
from verl.single_controller.base.worker import NUM_THREADS_ENV, WorkerHelper
from verl.single_controller.base.worker_group import ClassWithInitArgs, ResourcePool, WorkerGroup
from verl.single_controller.ray.calls import RefLabel as _RefLabel
from verl.single_controller.ray.calls import WorkerCallError
from verl.single_controller.ray.calls import ray_get_labeled as _ray_get_labeled

logger = logging.getLogger(__name__)

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "WorkerCallError",
    "create_colocated_worker_cls",
    "func_generator",
    "get_random_string",
    "sort_placement_group_by_node_ip",
]

CPUS_PER_WORKER_ENV = "VERL_CPUS_PER_WORKER"
CALL_TIMEOUT_ENV = "VERL_WORKER_CALL_TIMEOUT_S"


def get_random_string(length: int) -> str:
    """Random letters and digits, used to keep actor names of different groups apart."""
    alphabet = string.ascii_letters + string.digits
    return "".join(random.SystemRandom().choices(alphabet, k=length))


def _floor4(x: float) -> float:
    # Ray keeps resource quantities to 4 decimals; rounding down keeps a full set of colocated
    # actors inside one bundle (3 x 0.3333 <= 1).
    return math.floor(x * 10_000) / 10_000


# ----------------------------------------------------------------------------- resource pool


class RayResourcePool(ResourcePool):
    """Process slots reserved with Ray placement groups (one group per node entry).

    Args:
        process_on_nodes: processes per node, e.g. ``[2]`` for two workers on one node.
        use_gpu: reserve one GPU per slot. False gives a CPU-only pool.
        name_prefix: prefix of the placement group names.
        max_colocate_count: worker groups that may share the slots (see the module docstring).
        detached: placement groups outlive the driver.
        accelerator_type: require this Ray accelerator type (e.g. ``"H100"``) for GPU slots.
        num_cpus_per_worker: CPUs reserved per slot; fractional values are allowed, so several
            workers fit on a small machine. Default: env ``VERL_CPUS_PER_WORKER``, else 1 for GPU
            pools and 0.5 for CPU pools (two slots per core).
        placement_timeout_s: how long to wait for Ray to reserve the slots before raising.
    """

    def __init__(
        self,
        process_on_nodes: list[int] | None = None,
        use_gpu: bool = True,
        name_prefix: str | None = None,
        max_colocate_count: int = 10,
        detached: bool = False,
        accelerator_type: str | None = None,
        *,
        num_cpus_per_worker: float | None = None,
        placement_timeout_s: float = 120.0,
    ) -> None:
        super().__init__(process_on_nodes, max_colocate_count)
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix or ""
        self.detached = detached
        self.accelerator_type = accelerator_type
        if num_cpus_per_worker is None:
            from_env = os.environ.get(CPUS_PER_WORKER_ENV)
            num_cpus_per_worker = float(from_env) if from_env else (1.0 if use_gpu else 0.5)
        if not num_cpus_per_worker > 0:
            raise ValueError(f"num_cpus_per_worker must be > 0, got {num_cpus_per_worker!r}")
        self.num_cpus_per_worker = float(num_cpus_per_worker)
        self.placement_timeout_s = placement_timeout_s
        self.request_description: str | None = None  # what the whole job asks for (set by the trainer)
        self.pgs: list[PlacementGroup] | None = None
        self._groups_placed = 0

    def bundle(self, device_name: str = "cuda") -> dict[str, float]:
        """Resources of one process slot."""
        bundle: dict[str, float] = {"CPU": self.num_cpus_per_worker}
        if self.use_gpu:
            if device_name not in ("cuda", "gpu"):
                raise ValueError(
                    f"device_name {device_name!r} is not supported; this implementation schedules CUDA GPUs only"
                )
            bundle["GPU"] = 1
            if self.accelerator_type:
                bundle[f"accelerator_type:{self.accelerator_type}"] = 1e-4
        return bundle

    def get_placement_groups(
        self, strategy: str = "STRICT_PACK", name: str | None = None, device_name: str = "cuda"
    ) -> list[PlacementGroup]:
        """Reserve the slots (once; later calls return the same placement groups)."""
        if self.pgs is not None:
            return self.pgs
        if not self._store:
            raise ValueError("the resource pool has no process slots (process_on_nodes is empty)")
        # placement group names must be unique in the cluster: without a prefix, add a random one
        prefix = self.name_prefix or f"{get_random_string(6)}_"
        name = name or f"{prefix}verl_group_{'_'.join(map(str, self._store))}:"
        bundle = self.bundle(device_name)
        lifetime = "detached" if self.detached else None
        pgs = [
            placement_group(
                [dict(bundle) for _ in range(count)], strategy=strategy, name=f"{name}{i}", lifetime=lifetime
            )
            for i, count in enumerate(self._store)
        ]
        try:
            ray.get([pg.ready() for pg in pgs], timeout=self.placement_timeout_s)
        except GetTimeoutError:
            for pg in pgs:
                remove_placement_group(pg)
            asked = self.request_description or f"{self._store} process slots per node of {bundle}"
            raise RuntimeError(
                f"Ray could not place the workers within {self.placement_timeout_s} s. Asked: {asked}. "
                f"Free now: {ray.available_resources()}; cluster total: {ray.cluster_resources()} on "
                f"{sum(1 for n in ray.nodes() if n.get('Alive'))} alive node(s). "
                f"Use fewer workers, a smaller num_cpus_per_worker, or start Ray with more resources "
                "(trainer.placement_timeout_s sets this wait)."
            ) from None
        self.pgs = pgs
        return pgs

    def release(self) -> None:
        """Give the reservation back to Ray; actors still running in the slots are killed by Ray."""
        for pg in self.pgs or []:
            try:
                remove_placement_group(pg)
            except Exception as err:  # already removed, or Ray shut down
                logger.debug("remove_placement_group failed: %s", err)
        self.pgs = None
        self._groups_placed = 0


def sort_placement_group_by_node_ip(pgs: list[PlacementGroup]) -> list[PlacementGroup]:
    """Placement groups ordered by the IP of the node holding their first bundle (stable ranks)."""
    ip_of = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}

    def key(pg):
        node = placement_group_table(pg)["bundles_to_node_id"][0]
        return ip_of.get(node, "")

    return sorted(pgs, key=key)


# ----------------------------------------------------------------------------- class + init args


class RayClassWithInitArgs(ClassWithInitArgs):
    """A worker class (plain or ``ray.remote``-decorated) with its constructor arguments; calling
    it creates one actor in a placement-group bundle."""

    def __init__(self, cls, *args, **kwargs) -> None:
        super().__init__(cls, *args, **kwargs)
        self._options: dict[str, Any] = {}
        self._additional_resource: dict[str, float] = {}
        self._remote_cls = None

    def set_additional_resource(self, additional_resource: dict[str, float]) -> None:
        self._additional_resource = dict(additional_resource)

    def update_options(self, options: dict[str, Any]) -> None:
        """Extra `actor.options(...)` for every actor (e.g. ``runtime_env``, ``max_concurrency``)."""
        self._options.update(options)

    def _remote(self):
        if self._remote_cls is None:
            self._remote_cls = self.cls if isinstance(self.cls, ray.actor.ActorClass) else ray.remote(self.cls)
        return self._remote_cls

    def __call__(
        self,
        placement_group: PlacementGroup,
        placement_group_bundle_idx: int,
        use_gpu: bool = True,
        num_gpus: float = 1,
        sharing_with=None,
        device_name: str = "cuda",
        *,
        num_cpus: float | None = None,
        env_vars: dict[str, str] | None = None,
        name: str | None = None,
        lifetime: str | None = None,
    ):
        if sharing_with is not None:
            raise NotImplementedError(
                "sharing_with is not supported; colocate roles with create_colocated_worker_cls instead"
            )
        options: dict[str, Any] = dict(self._options)
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=placement_group, placement_group_bundle_index=placement_group_bundle_idx
        )
        if num_cpus is not None:
            options["num_cpus"] = num_cpus
        if use_gpu:
            options["num_gpus"] = num_gpus
        if self._additional_resource:
            options["resources"] = {**options.get("resources", {}), **self._additional_resource}
        if env_vars:
            runtime_env = dict(options.get("runtime_env") or {})
            runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env_vars}
            options["runtime_env"] = runtime_env
        if name:
            options["name"] = name
        if lifetime:
            options["lifetime"] = lifetime
        return self._remote().options(**options).remote(*self.args, **self.kwargs)


# ----------------------------------------------------------------------------- worker group


@ray.remote(num_cpus=0)
def _free_port_on_this_node() -> int:
    return WorkerHelper._get_free_port()


def func_generator(self: RayWorkerGroup, method_name: str, dispatch_fn, collect_fn, execute_fn, blocking: bool):
    """Driver-side proxy of a registered worker method: dispatch -> execute -> (wait) -> collect."""

    def proxy(*args, **kwargs):
        args, kwargs = dispatch_fn(self, *args, **kwargs)
        pad = kwargs.pop(_padding_size_key, 0)
        refs = execute_fn(method_name, *args, **kwargs)
        ref_list = refs if isinstance(refs, list) else [refs]
        labels = {
            ref: self._label(rank if isinstance(refs, list) else 0, method_name) for rank, ref in enumerate(ref_list)
        }
        if blocking:
            values = _ray_get_labeled(ref_list, [labels[r] for r in ref_list], timeout=self.call_timeout_s)
            output = values if isinstance(refs, list) else values[0]
        else:
            output = refs
        output = collect_fn(self, output)
        if isinstance(output, DataProtoFuture) and output.labels is None:
            output.labels = [labels.get(ref, _RefLabel(f"{method_name} result")) for ref in output.futures]
        if pad:
            output = unpad_output(output, pad)
        return output

    proxy.__name__ = method_name
    proxy.__qualname__ = f"{type(self).__name__}.{method_name}"
    return proxy


class RayWorkerGroup(WorkerGroup):
    """A group of Ray actors running one worker class (see the module docstring).

    Args:
        resource_pool: where to place the workers (one per slot); None when attaching to
            existing actors with `worker_names` / `worker_handles`.
        ray_cls_with_init: the worker class and its constructor arguments.
        bin_pack: STRICT_PACK placement (all slots of a node entry on one node), else PACK.
        name_prefix: prefix of the actor names (random by default).
        detached: actors outlive the driver.
        num_threads_per_worker: torch CPU threads in each worker (Ray would leave 1). Default:
            env ``VERL_WORKER_NUM_THREADS``, else the slot's whole CPUs (at least 1).
        call_timeout_s: bound on every blocking call (None: no bound; env
            ``VERL_WORKER_CALL_TIMEOUT_S``). Failed or dead workers raise at once regardless.
        ready_timeout_s: how long to wait for the workers' constructors (default
            `ray_wait_register_center_timeout`).
        device_name: accelerator of GPU pools (``"cuda"``); ignored for CPU-only pools.

    Every driver environment variable starting with ``VERL_`` is passed on to the workers.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool | None = None,
        ray_cls_with_init: RayClassWithInitArgs | None = None,
        bin_pack: bool = True,
        name_prefix: str | None = None,
        detached: bool = False,
        worker_names: list[str] | None = None,
        worker_handles: list | None = None,
        ray_wait_register_center_timeout: int = 300,
        *,
        num_threads_per_worker: int | None = None,
        call_timeout_s: float | None = None,
        ready_timeout_s: float | None = None,
        device_name: str = "cuda",
        **kwargs,
    ) -> None:
        super().__init__(resource_pool=resource_pool)
        if kwargs:
            # upstream callers pass profiling options this implementation does not have
            logger.warning("RayWorkerGroup ignores unsupported arguments: %s", sorted(kwargs))
        self.device_name = device_name
        self.ray_cls_with_init = ray_cls_with_init
        self.name_prefix = get_random_string(6) if name_prefix is None else name_prefix
        self._ray_wait_register_center_timeout = ray_wait_register_center_timeout
        if call_timeout_s is None and os.environ.get(CALL_TIMEOUT_ENV):
            call_timeout_s = float(os.environ[CALL_TIMEOUT_ENV])
        self.call_timeout_s = call_timeout_s
        self.ready_timeout_s = float(
            ready_timeout_s if ready_timeout_s is not None else ray_wait_register_center_timeout
        )
        self.user_cls = unwrap_worker_class(ray_cls_with_init.cls) if ray_cls_with_init is not None else None
        self._resource_pool = resource_pool
        if worker_names is not None or worker_handles is not None:
            if resource_pool is not None:
                raise ValueError(
                    "pass either a resource_pool (new workers) or worker_names/worker_handles "
                    "(existing workers), not both"
                )
            self._worker_names = list(worker_names or [])
            self._workers = (
                list(worker_handles) if worker_handles is not None else [ray.get_actor(n) for n in self._worker_names]
            )
        elif resource_pool is not None:
            if ray_cls_with_init is None:
                raise ValueError("ray_cls_with_init is required to create workers on a resource pool")
            self._init_with_resource_pool(resource_pool, ray_cls_with_init, bin_pack, detached, num_threads_per_worker)
        if ray_cls_with_init is not None:
            self._bind_worker_method(self.user_cls, func_generator)

    # ------------------------------------------------------------------ creation

    def _init_with_resource_pool(
        self,
        resource_pool: RayResourcePool,
        ray_cls_with_init: RayClassWithInitArgs,
        bin_pack: bool,
        detached: bool,
        num_threads_per_worker: int | None,
    ) -> None:
        if resource_pool._groups_placed >= resource_pool.max_colocate_count:
            raise RuntimeError(
                f"the resource pool already hosts {resource_pool._groups_placed} worker groups = max_colocate_count; "
                "create the pool with a larger max_colocate_count"
            )
        pgs = resource_pool.get_placement_groups(
            strategy="STRICT_PACK" if bin_pack else "PACK", device_name=self.device_name
        )
        world_size = resource_pool.world_size
        share = 1.0 / resource_pool.max_colocate_count
        num_cpus = _floor4(resource_pool.num_cpus_per_worker * share)
        num_gpus = _floor4(share) if resource_pool.use_gpu else 0
        if num_threads_per_worker is None:
            from_env = os.environ.get(NUM_THREADS_ENV)
            num_threads_per_worker = int(from_env) if from_env else max(1, int(resource_pool.num_cpus_per_worker))
        if num_threads_per_worker < 1:
            raise ValueError(f"num_threads_per_worker must be >= 1, got {num_threads_per_worker}")
        master_addr, master_port = self._choose_master(pgs)
        forwarded = {k: v for k, v in os.environ.items() if k.startswith("VERL_")}
        cls_name = self.user_cls.__name__
        rank = 0
        for pg_idx, pg in enumerate(pgs):
            local_world_size = resource_pool.store[pg_idx]
            for local_rank in range(local_world_size):
                env_vars = {
                    **forwarded,
                    "RANK": str(rank),
                    "WORLD_SIZE": str(world_size),
                    "LOCAL_RANK": str(local_rank),
                    "LOCAL_WORLD_SIZE": str(local_world_size),
                    "RAY_LOCAL_RANK": str(local_rank),
                    "RAY_LOCAL_WORLD_SIZE": str(local_world_size),
                    "MASTER_ADDR": master_addr,
                    "MASTER_PORT": str(master_port),
                    "WG_PREFIX": self.name_prefix,
                    "WG_BACKEND": "ray",
                    NUM_THREADS_ENV: str(num_threads_per_worker),
                    "OMP_NUM_THREADS": str(num_threads_per_worker),
                }
                name = f"{self.name_prefix}{cls_name}_{pg_idx}:{local_rank}"
                worker = ray_cls_with_init(
                    placement_group=pg,
                    placement_group_bundle_idx=local_rank,
                    use_gpu=resource_pool.use_gpu,
                    num_gpus=num_gpus,
                    num_cpus=num_cpus,
                    env_vars=env_vars,
                    name=name,
                    lifetime="detached" if detached else None,
                )
                self._workers.append(worker)
                self._worker_names.append(name)
                rank += 1
        self._master_addr, self._master_port = master_addr, str(master_port)
        self._wait_until_ready()
        resource_pool._groups_placed += 1

    @staticmethod
    def _choose_master(pgs: list[PlacementGroup]) -> tuple[str, int]:
        """Address of the node of rank 0's slot (127.0.0.1 when every slot is on that node, so
        the rendezvous binds loopback only), and a free port there."""
        tables = [placement_group_table(pg)["bundles_to_node_id"] for pg in pgs]
        node_id = tables[0][0]
        address = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), None)
        if address is None:
            raise RuntimeError(f"node {node_id} of the placement group is not in ray.nodes()")
        if {n for table in tables for n in table.values()} == {node_id}:
            address = "127.0.0.1"
        if node_id == ray.get_runtime_context().get_node_id():
            return address, WorkerHelper._get_free_port()
        # another node: ask a zero-CPU task there for a free port
        port = ray.get(
            _free_port_on_this_node.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            ).remote()
        )
        return address, port

    def _wait_until_ready(self) -> None:
        """Wait for every constructor; a failing one raises WorkerCallError naming its rank."""
        refs = [w.__ray_ready__.remote() for w in self._workers]
        labels = [self._label(rank, "__init__") for rank in range(len(refs))]
        try:
            _ray_get_labeled(refs, labels, timeout=self.ready_timeout_s)
        except TimeoutError as err:
            self.kill_workers()  # the group is unusable: leave no half-started actors behind
            raise TimeoutError(
                f"{err}. The workers were still being scheduled or still in __init__; free Ray resources: "
                f"{ray.available_resources()}"
            ) from None
        except WorkerCallError:
            self.kill_workers()
            raise

    def _label(self, rank: int, method_name: str) -> _RefLabel:
        cls_name = self.user_cls.__name__ if self.user_cls is not None else "worker"
        actor = self._worker_names[rank] if rank < len(self._worker_names) else "?"
        return _RefLabel(f"{cls_name}.{method_name} on rank {rank} (actor {actor})", rank, method_name)

    @classmethod
    def from_detached(
        cls,
        name_prefix: str | None = None,
        worker_names: list[str] | None = None,
        worker_handles: list | None = None,
        ray_cls_with_init: RayClassWithInitArgs | None = None,
        **kwargs,
    ) -> RayWorkerGroup:
        """A group over existing actors (by name or handle)."""
        return cls(
            resource_pool=None,
            ray_cls_with_init=ray_cls_with_init,
            name_prefix=name_prefix,
            worker_names=worker_names,
            worker_handles=worker_handles,
            **kwargs,
        )

    def spawn(self, prefix_set) -> dict[str, RayWorkerGroup]:
        """For a colocated group (`create_colocated_worker_cls`): one group per role over the same
        actors, exposing that role's methods under their own names."""
        groups = {}
        for prefix in prefix_set:
            group = self.from_detached(
                name_prefix=self.name_prefix,
                worker_names=self._worker_names,
                worker_handles=self._workers,
                ray_cls_with_init=self.ray_cls_with_init,
                call_timeout_s=self.call_timeout_s,
            )
            group._master_addr, group._master_port = self._master_addr, self._master_port
            group._expose_role(prefix)
            groups[prefix] = group
        return groups

    # ------------------------------------------------------------------ execution

    def _execute_remote_single_worker(self, worker, method_name: str, *args, **kwargs):
        try:
            method = getattr(worker, method_name)
        except AttributeError:
            raise AttributeError(
                f"worker class {self.user_cls.__name__ if self.user_cls else '?'} has no method {method_name!r}"
            ) from None
        return method.remote(*args, **kwargs)

    def execute_rank_zero_async(self, method_name: str, *args, **kwargs):
        return self._execute_remote_single_worker(self._workers[0], method_name, *args, **kwargs)

    def execute_rank_zero_sync(self, method_name: str, *args, **kwargs):
        ref = self.execute_rank_zero_async(method_name, *args, **kwargs)
        return _ray_get_labeled([ref], [self._label(0, method_name)], timeout=self.call_timeout_s)[0]

    def execute_rank_zero(self, method_name: str, *args, **kwargs):
        return self.execute_rank_zero_async(method_name, *args, **kwargs)

    def execute_all(self, method_name: str, *args, **kwargs):
        return self.execute_all_async(method_name, *args, **kwargs)

    def execute_all_sync(self, method_name: str, *args, **kwargs):
        refs = self.execute_all_async(method_name, *args, **kwargs)
        return _ray_get_labeled(
            refs, [self._label(r, method_name) for r in range(len(refs))], timeout=self.call_timeout_s
        )

    def execute_all_async(self, method_name: str, *args, **kwargs) -> list:
        """Call `method_name` on every worker. When every argument is a list with one entry per
        worker, worker i gets entry i; otherwise every worker gets all arguments unchanged."""
        n = len(self._workers)
        scatter = all(isinstance(a, list) and len(a) == n for a in args) and all(
            isinstance(v, list) and len(v) == n for v in kwargs.values()
        )
        if not scatter:
            args = tuple([a] * n for a in args)
            kwargs = {k: [v] * n for k, v in kwargs.items()}
        # An object sent to every worker is put into the object store once, not serialised n times.
        args = tuple(self._share_if_repeated(a) for a in args)
        kwargs = {k: self._share_if_repeated(v) for k, v in kwargs.items()}
        return [
            self._execute_remote_single_worker(
                w, method_name, *(a[i] for a in args), **{k: v[i] for k, v in kwargs.items()}
            )
            for i, w in enumerate(self._workers)
        ]

    @staticmethod
    def _share_if_repeated(per_worker: list) -> list:
        first = per_worker[0] if per_worker else None
        if len(per_worker) > 1 and isinstance(first, DataProto) and all(x is first for x in per_worker):
            ref = ray.put(first)
            return [ref] * len(per_worker)
        return per_worker

    # ------------------------------------------------------------------ lifecycle and info

    def kill_workers(self) -> None:
        """Kill this group's actors (all roles, for a colocated group)."""
        for worker in self._workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception as err:  # already dead
                logger.debug("ray.kill failed: %s", err)


# ----------------------------------------------------------------------------- colocation


def create_colocated_worker_cls(class_dict: dict[str, ClassWithInitArgs]) -> RayClassWithInitArgs:
    """One actor class hosting several roles, each its own object in the same process.

    Role ``key``'s registered method ``m`` becomes ``key_m`` on the combined class; build a
    `RayWorkerGroup` from the result and call ``spawn(prefix_set=class_dict.keys())`` to get one
    group per role with the original method names. Roles share the process, so they can share
    memory (module state, tensors) with no copies. The actor options of every role
    (`RayClassWithInitArgs.update_options`) apply to the combined actor.
    """
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role")
    for role, cia in class_dict.items():
        if not isinstance(cia, ClassWithInitArgs):
            raise TypeError(f"class_dict[{role!r}] must be a RayClassWithInitArgs, got {type(cia).__name__}")
    worker_dict_cls = colocated_worker_class(
        {role: (cia.cls, cia.args, cia.kwargs) for role, cia in class_dict.items()}, module=__name__
    )
    options: dict[str, Any] = {}
    for cia in class_dict.values():
        options.update(getattr(cia, "_options", {}))
    combined = RayClassWithInitArgs(cls=ray.remote(worker_dict_cls))
    combined.update_options(options)
    return combined
