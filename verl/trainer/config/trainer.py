"""Trainer-level config: `trainer.*`, `custom_reward_function.*` and `ray_kwargs.*`."""

from __future__ import annotations

import difflib
import inspect
import re
from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig, check_choice, check_range
from verl.trainer.config.health import HealthConfig
from verl.trainer.config.trainer_v1 import TrainerV1Config

LOGGERS = ("console", "file", "tensorboard", "wandb", "mlflow")
RESUME_MODES = ("auto", "disable", "resume_path")
DEVICES = ("auto", "cuda", "cpu")
WORKER_BACKENDS = ("auto", "ray", "local")


@dataclass
class TrainerConfig(BaseConfig):
    """The training run: devices, length, logging, validation, checkpoints.

    - `device`: `auto` picks cuda when a GPU is visible, else cpu (gloo).
    - `n_gpus_per_node`: worker processes per node. On CPU each one is a CPU worker with
      `cpus_per_worker` Ray CPUs (null: the node's CPUs shared out) and
      `torch_threads_per_worker` torch threads (null: its CPU share rounded, at least 1).
    - `total_training_steps`: null means `total_epochs` passes over the training data.
    - `time_budget_s`: stop after this many seconds of training (the step that starts after the
      budget is spent is the last one: validated and checkpointed as usual); null: no limit.
    - `test_freq` / `save_freq`: every that many steps (and at the last step); <= 0 disables.
    - `resume_mode`: `auto` continues from the newest complete checkpoint in
      `default_local_dir` if there is one; `disable` starts fresh; `resume_path` loads
      `resume_from_path` (a `global_step_N` directory).
    - `external_modules`: module paths or .py files imported in the driver and in every worker
      before anything is built (custom losses, estimators, reward managers register there).
    - `log_dir`: where the `file` logger (metrics.jsonl), tensorboard and the curves PNG go.
    - `callbacks`: `file.py:Class` / `module:Class` of `TrainerCallback`s (hooks on the loop).
    - `role_pools`: give a role its own resource pool instead of sharing the actor's processes,
      e.g. `{critic: [1]}` (processes per node); roles: critic, ref, rm.
    - `worker_backend`: where the workers run. `ray`: Ray actors (one process per worker, any
      number of machines and GPUs). `local`: the one worker of a one-process CPU job inside the
      driver process (same worker classes and dispatch, no Ray started: seconds less start-up
      and ~1 GB less memory). `auto`: `local` when the job is one CPU worker (`nnodes=1`,
      `n_gpus_per_node=1`, no `role_pools`) and nothing asks for Ray (no cluster address, no
      `ray_kwargs.ray_init.runtime_env` entries, no timeline, Ray not already started in this
      process), else `ray`.
    - `nnodes`: machines of the Ray cluster used by the run.
    - `placement_timeout_s`: how long to wait for Ray to reserve the worker slots before failing
      with what was asked (per node, per role pool) and what the cluster has. A private
      single-node Ray is checked before any worker starts and fails at once.
    - `total_epochs`: passes over the training data (unless `total_training_steps` stops earlier).
    - `project_name` / `experiment_name`: names for the loggers and the default directories.
    - `logger`: backends: console, file, tensorboard, wandb, mlflow.
    - `log_val_generations`: validation samples (input, output, score) shown per validation.
    - `rollout_data_dir`: when set, every step's rollouts (prompt, response, score) go to
      `<dir>/<step>.jsonl`.
    - `validation_data_dir`: when set, every validation's generations go to `<dir>/<step>.jsonl`.
    - `balance_batch`: reorder each batch so every data-parallel worker gets a similar number of
      tokens.
    - `val_before_train`: validate once before the first step.
    - `val_only`: validate the policy (the restored checkpoint when one is resumed, else the
      initial model) and stop, whatever `val_before_train` says; no training.
    - `critic_warmup`: steps that train only the critic before the actor starts to update.
    - `resume_from_path`: the `global_step_N` directory to load with `resume_mode=resume_path`.
    - `default_local_dir`: where `global_step_N` checkpoints are written.
    - `max_actor_ckpt_to_keep` / `max_critic_ckpt_to_keep`: how many actor / critic checkpoints
      to keep (null: all); older ones are deleted after each save.
    - `seed`: seed of the driver's random generators and of the workers' sampling (worker r uses seed + r).
    - `v1`: upstream's trainer modes (`trainer_mode`: sync | separate_async) and the staleness
      bound of asynchronous training (`verl/trainer/config/trainer_v1.py`, docs/async.md).
    - `deterministic` (ours): the workers run torch's deterministic algorithms, so a run repeats bit
      for bit at any thread count (docs/reproducibility.md); `false` is the nondeterministic
      path (the CPU backward of repeated-index gathers adds with racing threads), no faster on
      the measured jobs.
    - `peak_flops_per_worker`: peak FLOP/s of one worker for the MFU estimate (`perf/mfu/*`);
      null: a table of known GPUs, on CPU a short fp32 matmul measured at start.
    - `health`: the training-health monitor (`health/*` metrics, warnings, `health.md`; ours,
      docs/health.md).
    """

    device: str = "auto"
    nnodes: int = 1
    n_gpus_per_node: int = 1
    cpus_per_worker: float | None = None
    placement_timeout_s: float = 120.0
    torch_threads_per_worker: int | None = None
    deterministic: bool = True
    worker_backend: str = "auto"
    total_epochs: int = 2
    total_training_steps: int | None = None
    time_budget_s: float | None = None
    project_name: str = "verl"
    experiment_name: str = "default"
    logger: list[str] = field(default_factory=lambda: ["console", "file"])
    log_val_generations: int = 0
    rollout_data_dir: str | None = None
    validation_data_dir: str | None = None
    balance_batch: bool = False
    save_freq: int = -1
    test_freq: int = 10
    val_before_train: bool = True
    val_only: bool = False
    critic_warmup: int = 0
    resume_mode: str = "auto"
    resume_from_path: str | None = None
    default_local_dir: str = "checkpoints/verl/default"
    max_actor_ckpt_to_keep: int | None = None
    max_critic_ckpt_to_keep: int | None = None
    external_modules: list[str] = field(default_factory=list)
    log_dir: str = "runs/verl/default"
    callbacks: list[str] = field(default_factory=list)
    role_pools: dict[str, list[int]] | None = None
    peak_flops_per_worker: float | None = None
    plot: bool = True
    seed: int = 1
    v1: TrainerV1Config = field(default_factory=TrainerV1Config)
    health: HealthConfig = field(default_factory=HealthConfig)

    def __post_init__(self):
        owner = "trainer"
        check_choice(owner, "device", self.device, DEVICES)
        check_choice(owner, "resume_mode", self.resume_mode, RESUME_MODES)
        check_choice(owner, "worker_backend", self.worker_backend, WORKER_BACKENDS)
        check_range(owner, "nnodes", self.nnodes, low=1)
        check_range(owner, "n_gpus_per_node", self.n_gpus_per_node, low=1)
        check_range(owner, "cpus_per_worker", self.cpus_per_worker, low=0.0, low_open=True, allow_none=True)
        check_range(owner, "placement_timeout_s", self.placement_timeout_s, low=0.0, low_open=True)
        check_range(owner, "torch_threads_per_worker", self.torch_threads_per_worker, low=1, allow_none=True)
        check_range(owner, "total_epochs", self.total_epochs, low=1)
        check_range(owner, "total_training_steps", self.total_training_steps, low=1, allow_none=True)
        check_range(owner, "time_budget_s", self.time_budget_s, low=0.0, low_open=True, allow_none=True)
        check_range(owner, "critic_warmup", self.critic_warmup, low=0)
        check_range(owner, "peak_flops_per_worker", self.peak_flops_per_worker, low=0.0, low_open=True, allow_none=True)
        check_range(owner, "log_val_generations", self.log_val_generations, low=0)
        check_range(owner, "max_actor_ckpt_to_keep", self.max_actor_ckpt_to_keep, low=1, allow_none=True)
        check_range(owner, "max_critic_ckpt_to_keep", self.max_critic_ckpt_to_keep, low=1, allow_none=True)
        if isinstance(self.logger, str):  # `trainer.logger=console` on the command line
            self.logger = [self.logger]
        self.logger = list(self.logger)
        for name in self.logger:
            check_choice(owner, "logger[]", name, LOGGERS)
        if isinstance(self.external_modules, str):
            self.external_modules = [self.external_modules]
        self.external_modules = list(self.external_modules or [])
        if isinstance(self.callbacks, str):
            self.callbacks = [self.callbacks]
        self.callbacks = list(self.callbacks or [])
        self.role_pools = dict(self.role_pools or {})
        for role, procs in self.role_pools.items():
            check_choice(owner, "role_pools key", role, ("critic", "ref", "rm"))
            if (
                not isinstance(procs, (list, tuple))
                or not procs
                or not all(isinstance(p, int) and p > 0 for p in procs)
            ):
                raise ValueError(f"trainer.role_pools.{role}={procs!r} must be a list of processes per node, e.g. [1]")
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            raise ValueError(
                "trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_N directory)"
            )


@dataclass
class CustomRewardFunctionConfig(BaseConfig):
    """A user scoring function `fn(data_source, solution_str, ground_truth, extra_info=None, **kw)`
    returning a float or a dict with a `score` entry (other entries are logged).

    - `path`: a .py file or an importable module path; null uses the shipped
      `default_compute_score`.
    - `name`: the function's name in that file.
    - `reward_kwargs`: keyword arguments added to every call.
    """

    path: str | None = None
    name: str = "compute_score"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class RayKwargsConfig(BaseConfig):
    """`ray_kwargs.ray_init`: keyword arguments of `ray.init` (e.g. `num_cpus`, `address`).

    With no `address` (and no RAY_ADDRESS in the environment) a private single-machine Ray is
    started on loopback; with one, the driver joins that cluster.

    - `ray_init`: keyword arguments of `ray.init`; `num_cpus` (null: all CPUs of this machine),
      `address` (null: a private local Ray; `auto` or `host:port`: join a cluster) and
      `runtime_env` (passed to `ray.init`; null entries are dropped, e.g. `env_vars`).
    - `timeline_json_file`: when set, a Ray timeline (chrome://tracing) is written there at the end.
    """

    ray_init: dict[str, Any] = field(default_factory=dict)
    timeline_json_file: str | None = None

    def __post_init__(self):
        check_ray_init_kwargs(self.ray_init)


# ray.init arguments that need no look-up (ray itself is imported only for another name: ~1-3 s)
_COMMON_RAY_INIT_ARGS = frozenset(
    {
        "address",
        "num_cpus",
        "num_gpus",
        "resources",
        "object_store_memory",
        "runtime_env",
        "namespace",
        "include_dashboard",
        "dashboard_host",
        "dashboard_port",
        "logging_level",
        "log_to_driver",
        "ignore_reinit_error",
        "_node_ip_address",
        "_temp_dir",
    }
)


def ray_init_arguments() -> set[str]:
    """The keyword arguments `ray.init` accepts: its named parameters and the private ones it
    takes from `**kwargs` (unknown ones make it raise)."""
    import ray

    init = inspect.unwrap(ray.init)
    names = {n for n, p in inspect.signature(init).parameters.items() if p.kind is not p.VAR_KEYWORD}
    try:
        names |= set(re.findall(r"kwargs\.pop\(\s*[\"'](\w+)[\"']", inspect.getsource(init)))
    except (OSError, TypeError):  # no source: only the named parameters are known
        pass
    return names


def check_ray_init_kwargs(ray_init: Any) -> None:
    """Every key of `ray_kwargs.ray_init` is an argument of `ray.init` (checked when the config is
    built, before anything starts, whether or not the job uses Ray)."""
    unusual = sorted(str(k) for k in dict(ray_init or {}) if k not in _COMMON_RAY_INIT_ARGS)
    if not unusual:
        return
    accepted = ray_init_arguments()
    for key in unusual:
        if key not in accepted:
            close = difflib.get_close_matches(key, sorted(accepted), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(
                f"ray_kwargs.ray_init.{key}: ray.init has no argument {key!r}{hint} (accepted: {sorted(accepted)})"
            )
