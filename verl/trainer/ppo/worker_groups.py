"""Spawning the PPO trainer's worker groups: one colocated worker group per resource pool."""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from verl.utils.py_functional import env_override

if TYPE_CHECKING:
    from verl.trainer.ppo.utils import Role


@dataclass
class ResourcePoolManager:
    """Which resource pool each role runs in.

    `resource_pool_spec`: pool name -> processes per node (e.g. `{"global_pool": [2]}`);
    `mapping`: role -> pool name. Roles in one pool are colocated: one process per slot holds
    all of them (weight sync between actor and rollout is then an in-process copy).
    `use_gpu` / `num_cpus_per_worker` describe what one slot reserves (None: the controller's
    default).
    """

    resource_pool_spec: dict[str, list[int]]
    mapping: dict[Role, str]
    use_gpu: bool = True
    num_cpus_per_worker: float | None = None
    resource_pool_dict: dict[str, Any] = field(default_factory=dict)
    placement_timeout_s: float = 120.0
    # the private single-node Ray started for this run: a job that cannot fit fails before any worker starts
    private_cluster: bool = False

    def create_resource_pool(self, in_process: bool = False) -> None:
        """One pool per `resource_pool_spec` entry: Ray placement groups, or (`in_process`, for
        `LocalWorkerGroup`) plain one-slot pools that reserve nothing."""
        if in_process:
            from verl.single_controller.base import ResourcePool

            for name, process_on_nodes in self.resource_pool_spec.items():
                self.resource_pool_dict[name] = ResourcePool(list(process_on_nodes), max_colocate_count=1)
            return
        from verl.single_controller.ray import RayResourcePool

        run_id = uuid.uuid4().hex[:6]  # placement-group names are cluster-wide: one Ray may host several runs
        for name, process_on_nodes in self.resource_pool_spec.items():
            # one worker group per slot: colocated roles share one process (create_colocated_worker_cls)
            self.resource_pool_dict[name] = RayResourcePool(
                process_on_nodes=list(process_on_nodes),
                use_gpu=self.use_gpu,
                max_colocate_count=1,
                name_prefix=f"{name}_{run_id}_",
                num_cpus_per_worker=self.num_cpus_per_worker,
                placement_timeout_s=self.placement_timeout_s,
            )
        from verl.trainer.ppo.cluster_fit import check_cluster_fits

        check_cluster_fits(self.resource_pool_dict, self.mapping, fail_now=self.private_cluster)

    def release(self) -> None:
        """Give every pool's reservation back to Ray (its actors are killed)."""
        for pool in self.resource_pool_dict.values():
            release = getattr(pool, "release", None)  # an in-process pool holds nothing
            if release is not None:
                release()
        self.resource_pool_dict.clear()

    def get_resource_pool(self, role: Role):
        return self.resource_pool_dict[self.mapping[role]]

    def get_n_gpus(self) -> int:
        return sum(sum(v) for v in self.resource_pool_spec.values())


def worker_env(config, device_name: str) -> dict[str, str]:
    """Environment of every worker process, for the two documented user switches the workers read:
    the device (`VERL_DEVICE`) and every user module (`VERL_USE_EXTERNAL_MODULES`, so custom
    losses/estimators registered there exist in the workers too). Everything else a worker needs
    from the trainer travels as typed init arguments (`WorkerSettings`: the seed, the batch plan);
    torch threads are set by the worker group (`trainer.torch_threads_per_worker`)."""
    from verl.trainer.ppo.utils import external_module_list

    env = {"VERL_DEVICE": device_name}
    mods = external_module_list(config)
    if mods:
        env["VERL_USE_EXTERNAL_MODULES"] = ",".join(os.path.abspath(m) if m.endswith(".py") else m for m in mods)
    return env


def spawn_worker_groups(
    pools,
    role_worker_mapping: dict,
    ray_worker_group_cls,
    roles: list[tuple[Any, str, dict[str, Any]]],
    env: dict[str, str],
    num_threads_per_worker: int | None,
) -> tuple[list[Any], dict[str, Any]]:
    """Create `pools`' resource pools and, per pool, one worker group whose processes hold every
    role mapped to it (`create_colocated_worker_cls`). A worker-group class with `in_process =
    True` (`LocalWorkerGroup`) gets plain pools and plain classes: nothing imports Ray.

    `roles`: (role, name, worker init kwargs) for each role this run uses. `env` is set while the
    groups are created (the controller forwards the driver's `VERL_*` variables to the workers).
    Returns (the worker groups, name -> that role's worker group view); models are not built yet.
    """
    if getattr(ray_worker_group_cls, "in_process", False):
        from verl.single_controller.base.worker_group import ClassWithInitArgs as with_init
        from verl.single_controller.local import create_local_colocated_worker_cls as colocate

        pools.create_resource_pool(in_process=True)
        if num_threads_per_worker is None:  # what a Ray worker of the same CPU share would use
            num_threads_per_worker = max(1, int(pools.num_cpus_per_worker or 1))
    else:
        from verl.single_controller.ray import RayClassWithInitArgs as with_init
        from verl.single_controller.ray.base import create_colocated_worker_cls as colocate

        pools.create_resource_pool()
    pool_to_cls: dict[Any, dict[str, Any]] = {p: {} for p in pools.resource_pool_dict.values()}
    for which, name, init in roles:
        cls = with_init(cls=role_worker_mapping[which], **init)
        pool_to_cls[pools.get_resource_pool(which)][name] = cls
    groups: list[Any] = []
    by_name: dict[str, Any] = {}
    with env_override(env):
        for pool, class_dict in pool_to_cls.items():
            if not class_dict:
                continue
            group = ray_worker_group_cls(
                resource_pool=pool,
                ray_cls_with_init=colocate(class_dict=class_dict),
                num_threads_per_worker=num_threads_per_worker,
            )
            groups.append(group)
            by_name.update(group.spawn(prefix_set=class_dict.keys()))
    return groups, by_name


def resolve_worker_backend(v) -> str:
    """`trainer.worker_backend` of the validated config `v` as `ray` or `local` (`auto` decided as
    `TrainerConfig` documents). An explicit `local` that cannot hold the job raises ValueError
    naming what needs Ray."""
    from verl.trainer.ppo.utils import resolve_device

    tr, ray_init = v.trainer, dict(v.ray_kwargs.ray_init or {})
    needs_ray = []
    device = resolve_device(tr.device)
    if device != "cpu":
        needs_ray.append(f"trainer.device={tr.device} ({device})")
    if tr.nnodes != 1 or tr.n_gpus_per_node != 1:
        needs_ray.append(f"trainer.nnodes={tr.nnodes} x trainer.n_gpus_per_node={tr.n_gpus_per_node} workers")
    if tr.role_pools:
        needs_ray.append(f"trainer.role_pools={dict(tr.role_pools)}")
    plan = getattr(v, "async_plan", None)
    if plan is not None and plan.separate_rollout:
        needs_ray.append("actor_rollout_ref.hybrid_engine=False (rollout workers of their own)")
    address = ray_init.get("address") or os.environ.get("RAY_ADDRESS")
    if address:
        needs_ray.append(f"a Ray cluster address ({address})")
    runtime_env = {k: x for k, x in dict(ray_init.get("runtime_env") or {}).items() if x is not None}
    if runtime_env:
        needs_ray.append(f"ray_kwargs.ray_init.runtime_env={runtime_env}")
    if v.ray_kwargs.timeline_json_file:
        needs_ray.append("ray_kwargs.timeline_json_file")
    if tr.worker_backend == "local":
        if needs_ray:
            raise ValueError(
                "trainer.worker_backend=local runs one CPU worker inside the driver process, but the job needs Ray: "
                f"{'; '.join(needs_ray)}. Use trainer.worker_backend=ray (or auto)"
            )
        return "local"
    if tr.worker_backend == "ray":
        return "ray"
    ray = sys.modules.get("ray")  # a Ray this process started already is used, not bypassed
    if needs_ray or (ray is not None and ray.is_initialized()):
        return "ray"
    return "local"
