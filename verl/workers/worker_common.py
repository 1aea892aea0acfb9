"""Helpers shared by the worker classes of `verl.workers.fsdp_workers`: process set-up, the
worker's own config objects, the per-rank batch plan, offload between phases, seeds and memory
metrics. (A module of their own so that `fsdp_workers.py` holds the worker classes.)"""

from __future__ import annotations

import contextlib
import copy
import os

import torch

from verl.protocol import DataProto
from verl.single_controller.base.worker import Worker
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.device import get_device_name
from verl.utils.fsdp_utils import (
    load_fsdp_model_to_gpu,
    load_fsdp_optimizer,
    offload_fsdp_model_to_cpu,
    offload_fsdp_optimizer,
)
from verl.utils.import_utils import import_external_libs_from_env
from verl.utils.reproducibility import set_deterministic
from verl.workers.config.batch_plan import WorkerSettings, role_batch_plan
from verl.workers.config.megatron import refuse_megatron


def _setup_process(worker: Worker, deterministic: bool | None = None) -> str:
    """User modules, torch's deterministic algorithms (`trainer.deterministic`; None: left as
    they are) and the process group of a worker; returns the device name. (Torch threads are set
    by `Worker.__init__` from the worker group's `VERL_WORKER_NUM_THREADS`.)"""
    if deterministic is not None:
        set_deterministic(deterministic)
    import_external_libs_from_env()
    if worker.world_size > 1:
        worker.init_process_group_if_needed()
    return get_device_name()


def _deterministic(settings: WorkerSettings | None) -> bool:
    """Deterministic kernels unless the trainer says otherwise (a worker built by hand: on)."""
    return True if settings is None else settings.deterministic


def _to_dataclass(section, cls):
    """The worker's own config object: workers rewrite fields (per-rank mini-batch sizes), so a
    dataclass passed in is copied, never modified. A Megatron config is refused here."""
    refuse_megatron(section)
    if isinstance(section, cls):
        return copy.deepcopy(section)
    return omega_conf_to_dataclass(section, cls)


def _section(config, key):
    value = config.get(key) if hasattr(config, "get") else getattr(config, key, None)
    return {} if value is None else value


def _apply_batch_plan(owner: str, cfg, rollout_n: int, world_size: int, settings: WorkerSettings | None) -> None:
    """Rewrite `cfg.ppo_mini_batch_size` (prompts) to sequences per rank, upstream's meaning inside
    a worker. The plan is the trainer's (`settings.batch_plan`, checked against this worker's
    config and world size), or for a worker built by hand derived here by the same function."""
    plan = None if settings is None else settings.batch_plan
    if plan is None:
        plan = role_batch_plan(owner, cfg, rollout_n, world_size)
    elif (plan.world_size, plan.mini_batch_prompts, plan.rollout_n) != (world_size, cfg.ppo_mini_batch_size, rollout_n):
        raise ValueError(
            f"{owner}: the trainer's batch plan is for {plan.world_size} workers, ppo_mini_batch_size="
            f"{plan.mini_batch_prompts}, rollout.n={plan.rollout_n}; this worker has {world_size} workers, "
            f"ppo_mini_batch_size={cfg.ppo_mini_batch_size}, rollout.n={rollout_n}"
        )
    cfg.ppo_mini_batch_size = plan.per_rank_mini_batch


class _OffloadMixin:
    """Parameter / optimizer offload between phases (GPU only; nothing to do on CPU)."""

    def _offload_enabled(self, fsdp_config) -> tuple[bool, bool]:
        on_gpu = self.device_name == "cuda"
        return on_gpu and fsdp_config.param_offload, on_gpu and fsdp_config.optimizer_offload

    def _load_to_device(self, module, optimizer, fsdp_config):
        param_off, optim_off = self._offload_enabled(fsdp_config)
        if param_off:
            load_fsdp_model_to_gpu(module)
        if optim_off and optimizer is not None:
            load_fsdp_optimizer(optimizer, torch.device("cuda", torch.cuda.current_device()))

    def _offload(self, module, optimizer, fsdp_config):
        param_off, optim_off = self._offload_enabled(fsdp_config)
        if param_off:
            offload_fsdp_model_to_cpu(module)
        if optim_off and optimizer is not None:
            offload_fsdp_optimizer(optimizer)

    @contextlib.contextmanager
    def _resident(self, module, optimizer, fsdp_config):
        """`module` (and `optimizer`) on the device for the body of the `with`, offloaded again when
        it ends, also when it raises (a failed call must not leave the accelerator full)."""
        self._load_to_device(module, optimizer, fsdp_config)
        try:
            yield
        finally:
            self._offload(module, optimizer, fsdp_config)


def worker_seed(rank: int, seed: int | None = None) -> int:
    """Seed of a worker's torch RNG: `seed + rank`; the trainer passes `seed` = trainer.seed
    (`WorkerSettings`). A worker built by hand without one uses `$VERL_SEED`, 1234 when unset."""
    if seed is not None:
        return int(seed) + int(rank)
    raw = os.environ.get("VERL_SEED", "1234")
    try:
        return int(raw) + int(rank)
    except ValueError:
        raise ValueError(
            f"VERL_SEED={raw!r} must be an integer (a worker built without the trainer's seed reads it)"
        ) from None


def memory_metrics(device_name: str, prefix: str) -> dict[str, list[float]]:
    """Peak memory of this worker process: accelerator memory on CUDA, resident set size (RSS) always.

    Returned as one-element lists like the other worker metrics (the trainer averages over ranks).
    """
    import resource

    # ru_maxrss is in KiB on Linux, in bytes on macOS
    scale = 1 if os.uname().sysname == "Darwin" else 1024
    out = {f"{prefix}/max_rss_gb": [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1024**3]}
    if device_name == "cuda" and torch.cuda.is_available():
        out[f"{prefix}/max_memory_allocated_gb"] = [torch.cuda.max_memory_allocated() / 1024**3]
        out[f"{prefix}/max_memory_reserved_gb"] = [torch.cuda.max_memory_reserved() / 1024**3]
    return out


def _reject_agent_names(prompts: DataProto) -> None:
    """A batch that asks for an agent loop while multi_turn is off would silently run single-turn."""
    names = prompts.non_tensor_batch.get("agent_name")
    if names is not None:
        wanted = sorted({str(n) for n in names if n is not None and str(n) != "single_turn_agent"})
        if wanted:
            raise ValueError(
                f"the batch selects agent loop(s) {wanted} (column agent_name) but "
                "actor_rollout_ref.rollout.multi_turn.enable=False; set it to True"
            )
