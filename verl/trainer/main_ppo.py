"""Entry point: `python -m verl.trainer.main_ppo key=value ...` (Hydra) or `run_ppo(config)`.

The whole config is converted into its dataclasses and checked *before* Ray or any worker
starts (`verl.trainer.ppo.utils.validate_config`): a typo or an impossible batch size fails in a
second with a message naming the key. Then:

1. the embedded default fills `actor_rollout_ref.model.path`, `data.train_files` and
   `data.val_files` when they are null (a tiny model and a toy task shipped with verl);
2. the worker backend is chosen (`trainer.worker_backend`): a one-worker CPU job runs its worker
   inside this process (`LocalWorkerGroup`, no Ray); otherwise Ray starts on loopback (or joins
   the cluster of `RAY_ADDRESS` / `ray_kwargs.ray_init.address`);
3. the trainer builds data, reward managers and worker groups and runs `fit()` in this process
   (the driver is not a Ray actor: on a 2-core machine every process counts).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
import threading
import time
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from verl.trainer.ppo.utils import (
    Role,
    reference_in_actor,
    remember_validated,
    resolve_device,
    validate_config,
    validated_config,
)

if TYPE_CHECKING:  # resolved lazily by __getattr__ below
    from verl.utils.dataset.rl_dataset import create_rl_dataset, create_rl_sampler  # noqa: F401

logger = logging.getLogger(__name__)


def __getattr__(name: str):
    # upstream exposes these two here; they live with the dataset, which imports torch: resolved
    # on first use so that the config check and Ray's start do not wait for torch
    if name in ("create_rl_dataset", "create_rl_sampler"):
        from verl.utils.dataset import rl_dataset

        return getattr(rl_dataset, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["main", "run_ppo", "create_rl_dataset", "create_rl_sampler", "fill_embedded_defaults", "TaskRunner"]


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_ppo(_with_embedded_preset(config))


def _with_embedded_preset(config: DictConfig) -> DictConfig:
    """The embedded toy job's preset (no model given), yielding to the command line's keys."""
    from hydra.core.hydra_config import HydraConfig

    from verl.trainer.config.upstream_keys import apply_embedded_preset

    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    return apply_embedded_preset(config, overrides)


def _normalized_argv(argv: list[str]) -> list[str]:
    """`key=value` / `+key=value` work for this project's keys that the yaml does not list
    (see `upstream_keys.normalize_overrides`)."""
    from verl.trainer.config.upstream_keys import normalize_overrides

    takes_value = {"--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd", "--info", "-i"}
    spots = [i for i in range(1, len(argv)) if not argv[i].startswith("-") and argv[i - 1] not in takes_value]
    out = list(argv)
    for i, text in zip(spots, normalize_overrides([argv[i] for i in spots]), strict=False):
        out[i] = text
    return out


def load_default_config(
    overrides: list[str] | None = None, config_name: str = "ppo_trainer", preset: bool | str = True
) -> DictConfig:
    """The config of `python -m verl.trainer.main_ppo <overrides>`, without running anything
    (tests, notebooks): `load_default_config(["algorithm.adv_estimator=grpo"])`. With no model
    path, the embedded toy job's preset applies (`preset=False`: the yaml's upstream defaults;
    `preset="always"`: the toy job's settings with a model of your own too, e.g. a tiny test model).
    An override of a key that does not exist fails with the closest existing keys
    (`explain_override_error`)."""
    from hydra import compose, initialize_config_module
    from hydra.errors import ConfigCompositionException

    from verl.trainer.config.upstream_keys import apply_embedded_preset, normalize_overrides

    overrides = normalize_overrides(list(overrides or []))
    error = None
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        try:
            cfg = compose(config_name=config_name, overrides=overrides)
        except ConfigCompositionException as exc:
            error = exc
    if error is not None:  # explained outside the Hydra context: the explanation composes again
        raise explain_override_error(error, config_name) from error
    return apply_embedded_preset(cfg, overrides, always=preset == "always") if preset else cfg


# ----------------------------------------------------------------------------------------------
# Override errors: Hydra's "Could not override 'k'. To append to your config use +k=v" is the
# wrong advice for a typo (an appended key is read by nothing); name the closest existing keys.
def explain_override_error(exc: Exception, config_name: str = "ppo_trainer") -> Exception:
    """A `ConfigCompositionException` whose message keeps Hydra's first line and adds what the
    key should have been: the closest keys of the config (yaml keys and dataclass fields), or,
    for a real field that the yaml leaves out, how to append it."""
    from hydra.errors import ConfigCompositionException

    from verl.utils.config import closest_keys

    text = str(exc)
    match = re.match(r"Could not override '([^']+)'", text)
    if not match:
        return exc
    key = match.group(1)
    cause = exc.__cause__ or exc.__context__
    missing = getattr(cause, "full_key", None) or key
    paths, fields = _config_key_paths(config_name)
    head = text.splitlines()[0]
    if missing in fields and missing not in paths:
        # a dataclass field the yaml does not list: it exists, Hydra only needs the + prefix
        return ConfigCompositionException(
            f"{head} {missing} is a valid key that the default yaml does not list: append it with "
            f"+{key}=... (or ++{key}=...)"
        )
    parent, _, leaf = missing.rpartition(".")
    siblings = sorted(p.rpartition(".")[2] for p in paths | fields if p.rpartition(".")[0] == parent)
    close = [f"{parent}.{c}" if parent else c for c in closest_keys(leaf, siblings)]
    in_value = missing.startswith(key + ".")  # `data.custom_cls={a: 1}`: the bad key is inside the value
    rest = key[len(missing) :] if key.startswith(missing) else ""
    close = [c + rest for c in close]
    if not close:  # the key may be under another section: compare leaf names everywhere
        close = [p for p in _closest_anywhere(missing, paths | fields) if not missing.startswith(p + ".")]
    where = f"under {parent}" if parent else "at the top level"
    msg = f"{head} {missing} is not a key of this config"
    if in_value:
        msg = f"{head} The value given for {key} holds {missing}, which is not a key of this config"
    if close:
        msg += f"; did you mean {' or '.join(close)}?"
    msg += f" (accepted keys {where}: {siblings})."
    if not in_value:
        msg += f" Appending it with +{key}=... would add a key that nothing reads."
    return ConfigCompositionException(msg)


def _closest_anywhere(key: str, paths: set[str], n: int = 3) -> list[str]:
    import difflib

    leaf = key.rpartition(".")[2]
    same_leaf = [p for p in paths if difflib.SequenceMatcher(None, p.rpartition(".")[2], leaf).ratio() >= 0.8]
    return sorted(same_leaf, key=lambda p: -difflib.SequenceMatcher(None, p, key).ratio())[:n]


def _config_key_paths(config_name: str) -> tuple[set[str], set[str]]:
    """(every dotted key of the composed yaml, every dotted field of the config dataclasses)."""
    import dataclasses
    import typing

    from hydra import compose, initialize_config_module

    from verl.trainer.ppo.utils import SECTION_DATACLASSES

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = OmegaConf.to_container(compose(config_name=config_name), resolve=False)

    def walk(node, prefix, out):
        for k, v in node.items():
            path = f"{prefix}{k}"
            out.add(path)
            if isinstance(v, dict):
                walk(v, path + ".", out)

    paths: set[str] = set()
    walk({k: v for k, v in cfg.items() if k != "hydra"}, "", paths)

    def fields_of(cls, prefix, out):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            path = f"{prefix}{f.name}"
            out.add(path)
            sub = hints.get(f.name)
            sub = next((a for a in (sub, *typing.get_args(sub)) if dataclasses.is_dataclass(a)), None)
            if sub is not None:
                fields_of(sub, path + ".", out)

    fields: set[str] = set()
    for section, cls in SECTION_DATACLASSES.items():
        fields.add(section)
        fields_of(cls, section + ".", fields)
    return paths, fields


def check_cli_overrides(argv: list[str]) -> None:
    """Compose the command line's overrides once before Hydra does, so that an override error
    is reported with `explain_override_error`'s advice (Hydra would print only its own line)."""
    from hydra.errors import ConfigCompositionException

    config_name, overrides, it = "ppo_trainer", [], iter(argv)
    for arg in it:
        if arg in ("--config-name", "-cn"):
            config_name = next(it, config_name)
        elif arg.startswith("--config-name="):
            config_name = arg.split("=", 1)[1]
        elif arg in ("--config-path", "-cp", "--config-dir", "-cd") or arg.startswith(
            ("--config-path=", "--config-dir=")
        ):
            return  # a config of the user's own: Hydra reports its errors
        elif arg in ("-m", "--multirun"):
            return  # sweeps (`a=1,2`) are Hydra's to expand
        elif arg.startswith("-"):
            continue
        elif not arg.lstrip("+~").startswith("hydra."):
            overrides.append(arg)
    try:
        load_default_config(overrides, config_name=config_name)
    except ConfigCompositionException as exc:
        print(f"Error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except Exception:  # noqa: BLE001 - anything else (a missing config name, ...) is Hydra's to report
        return


def fill_embedded_defaults(config: DictConfig) -> DictConfig:
    """Replace null model/data paths by the embedded default (built on first use)."""
    need_model = config.actor_rollout_ref.model.path is None
    need_train = config.data.train_files is None
    need_val = config.data.val_files is None
    if not (need_model or need_train or need_val):
        return config
    from verl.utils import embedded_default

    with open_dict(config):
        if need_model:
            config.actor_rollout_ref.model.path = embedded_default.model_path()
        if need_train:
            config.data.train_files = embedded_default.train_files()
        if need_val:
            config.data.val_files = embedded_default.val_files()
    return config


def _init_ray(ray_init: dict) -> bool:
    """Start a private loopback Ray (returns True) or join an existing cluster (`address` in
    `ray_kwargs.ray_init` or RAY_ADDRESS; returns True); False when Ray is already initialised.

    The private Ray listens on 127.0.0.1 only: Ray turns `_node_ip_address=127.0.0.1` into the
    machine's reachable address unless its cluster mode is off (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`,
    set here unless already set), and its servers bind all interfaces unless the node address is
    127.0.0.1. A watchdog process (`verl.utils.driver_watchdog`) terminates the session's processes
    if this driver dies without `ray.shutdown()` (SIGKILL). See docs/gpu_and_multinode.md to open
    Ray to other machines.
    """
    import ray

    if ray.is_initialized():
        return False
    init_kwargs = {k: v for k, v in dict(ray_init or {}).items() if v is not None}
    runtime_env = {k: v for k, v in dict(init_kwargs.pop("runtime_env", None) or {}).items() if v is not None}
    if runtime_env:  # upstream passes ray_kwargs.ray_init.runtime_env (env_vars, ...) to ray.init
        init_kwargs["runtime_env"] = runtime_env
    address = init_kwargs.pop("address", None) or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **init_kwargs)
        return True
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    init_kwargs.setdefault("num_cpus", os.cpu_count() or 1)
    init_kwargs.setdefault("include_dashboard", False)
    init_kwargs.setdefault("logging_level", "WARNING")
    init_kwargs.setdefault("_node_ip_address", "127.0.0.1")
    if init_kwargs["_node_ip_address"] in ("127.0.0.1", "localhost"):
        # read by Ray at import time (already done) and at ray.init: set both
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"].lower() in ("1", "true")
        init_kwargs.setdefault("dashboard_host", "127.0.0.1")
    ray.init(**init_kwargs)
    try:
        from verl.utils import driver_watchdog

        session_dir = ray._private.worker._global_node.get_session_dir_path()
        _init_ray.watchdog = driver_watchdog.start(session_dir)  # kept: its pipe lives as long as this process
        if _init_ray.watchdog is None:
            logger.warning(
                "no Ray session watchdog (needs psutil on POSIX): if this driver is killed, Ray "
                "processes may stay behind"
            )
    except Exception as exc:  # noqa: BLE001 - the run works without it; leftovers are then possible
        logger.warning(
            "could not start the Ray session watchdog (%s): if this driver is killed, Ray processes may stay behind",
            exc,
        )
    return True


class TaskRunner:
    """Builds everything the trainer needs from a validated config and runs it (upstream name;
    here a plain object in the driver process).

    `trainer_hook(trainer)`, when given, is called with the built trainer before its workers start
    (`verl.trainer.replay` uses it to stop after one step and read that step's batch)."""

    def __init__(self, trainer_hook=None):
        self.trainer_hook = trainer_hook

    def run(self, config: DictConfig) -> dict[str, float]:
        from verl.trainer.ppo.ray_trainer import ResourcePoolManager
        from verl.trainer.ppo.reward import build_reward_fns
        from verl.trainer.ppo.worker_groups import resolve_worker_backend
        from verl.utils.fs import copy_to_local
        from verl.utils.tokenizer import hf_processor, hf_tokenizer

        v = validated_config(config)  # run_ppo's object when called from it: validated once
        tr = v.trainer
        device = resolve_device(tr.device)
        backend = resolve_worker_backend(v)
        with open_dict(config):
            config.trainer.device = device
            config.trainer.worker_backend = backend
        tr = dataclasses.replace(tr, device=device, worker_backend=backend)
        v = remember_validated(config, dataclasses.replace(v, trainer=tr))

        local_path = copy_to_local(config.actor_rollout_ref.model.path)
        tok_path = v.data.tokenizer or v.model.tokenizer_path or local_path
        trust = bool(v.model.trust_remote_code)
        tokenizer = hf_tokenizer(tok_path, trust_remote_code=trust, chat_template=v.model.custom_chat_template)
        processor = hf_processor(tok_path, trust_remote_code=trust)

        if backend == "local":
            from verl.single_controller.local import LocalWorkerGroup as worker_group_cls

            as_worker = _plain_class
        else:
            import ray

            from verl.single_controller.ray import RayWorkerGroup as worker_group_cls

            as_worker = ray.remote
        mapping, pool_spec, role_pool, trainer_cls = worker_layout(v, config, as_worker)
        resource_pool_manager = ResourcePoolManager(
            resource_pool_spec=pool_spec,
            mapping=role_pool,
            use_gpu=device == "cuda",
            num_cpus_per_worker=_cpus_per_worker(config, pool_spec, device, backend),
            placement_timeout_s=tr.placement_timeout_s,
            private_cluster=not (config.ray_kwargs.ray_init.get("address") or os.environ.get("RAY_ADDRESS")),
        )

        reward_fn, val_reward_fn = build_reward_fns(config, tokenizer, backend)

        trainer = trainer_cls(
            config=config,
            tokenizer=tokenizer,
            processor=processor,
            role_worker_mapping=mapping,
            resource_pool_manager=resource_pool_manager,
            ray_worker_group_cls=worker_group_cls,
            reward_fn=reward_fn,
            val_reward_fn=val_reward_fn,
            device_name=device,
        )
        if getattr(self, "trainer_hook", None) is not None:
            self.trainer_hook(trainer)
        try:
            trainer.init_workers()
            return trainer.fit()
        finally:
            trainer.shutdown()
            for fn in (reward_fn, val_reward_fn):
                close = getattr(fn, "close", None)
                if close:
                    close()
            timeline = config.ray_kwargs.get("timeline_json_file")
            if timeline:
                import ray

                ray.timeline(filename=timeline)


def worker_layout(v, config: DictConfig, as_worker) -> tuple[dict, dict, dict, type]:
    """Role -> worker class (`as_worker` makes a Ray actor class or keeps the plain one), the
    resource pools, role -> pool, and the trainer class: `AsyncRayPPOTrainer` for a rollout with
    workers of its own (`actor_rollout_ref.hybrid_engine=False`), else `RayPPOTrainer`."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker

    tr = v.trainer
    mapping = {Role.ActorRollout: as_worker(ActorRolloutRefWorker)}
    if v.use_critic:
        mapping[Role.Critic] = as_worker(CriticWorker)
    if v.use_reference_policy and not reference_in_actor(config):  # LoRA: the actor computes the reference
        mapping[Role.RefPolicy] = as_worker(ActorRolloutRefWorker)
    if v.use_rm:
        mapping[Role.RewardModel] = as_worker(RewardModelWorker)
    pool_spec, role_pool = resource_pool_layout(tr.nnodes, tr.n_gpus_per_node, tr.role_pools, mapping)
    trainer_cls = RayPPOTrainer
    if v.async_plan is not None and v.async_plan.separate_rollout:  # a rollout of its own (docs/async.md)
        from verl.trainer.ppo.async_trainer import AsyncRayPPOTrainer, separate_rollout_layout

        separate_rollout_layout(v.async_plan, mapping, pool_spec, role_pool, as_worker(ActorRolloutRefWorker))
        trainer_cls = AsyncRayPPOTrainer
    return mapping, pool_spec, role_pool, trainer_cls


def _plain_class(cls: type) -> type:
    # the in-process backend instantiates the worker class itself: no Ray actor class
    return cls


def resource_pool_layout(
    nnodes: int, n_gpus_per_node: int, role_pools: dict | None, mapping: dict
) -> tuple[dict[str, list[int]], dict]:
    """Pool name -> processes per node, and role -> pool name.

    Every role shares `global_pool` (`trainer.nnodes` x `trainer.n_gpus_per_node` processes)
    unless `trainer.role_pools.<role>` (critic, ref, rm; validated by `TrainerConfig`) gives it its
    own pool, e.g. `trainer.role_pools={critic: [1]}`.
    """
    spec = {"global_pool": [int(n_gpus_per_node)] * int(nnodes)}
    role_of = {"critic": Role.Critic, "ref": Role.RefPolicy, "rm": Role.RewardModel}
    pools = {role: "global_pool" for role in mapping}
    for name, procs in (role_pools or {}).items():
        if role_of[name] in mapping:
            spec[f"{name}_pool"] = list(procs)
            pools[role_of[name]] = f"{name}_pool"
    return spec, pools


def _cpus_per_worker(
    config: DictConfig, pool_spec: dict[str, list[int]], device: str, backend: str = "ray"
) -> float | None:
    """`trainer.cpus_per_worker`, else on CPU: this node's CPUs shared out over the worker
    processes placed on it (fractional shares are fine: the driver computes between worker calls).
    In-process (`backend="local"`) the node's CPUs are `ray_kwargs.ray_init.num_cpus` or all of
    them, as the private Ray would count them."""
    value = config.trainer.get("cpus_per_worker")
    if value is not None:
        return float(value)
    if device == "cuda":
        return None
    if backend == "local":
        node_cpus = float(config.ray_kwargs.ray_init.get("num_cpus") or os.cpu_count() or 1)
    else:
        import ray

        node_cpus = ray.cluster_resources().get("CPU", os.cpu_count() or 1) / max(int(config.trainer.nnodes), 1)
    procs_per_node = sum(max(p) for p in pool_spec.values())
    return max(int(node_cpus * 100 / procs_per_node) / 100, 0.01)


def run_ppo(config: DictConfig | dict, task_runner_class=None) -> dict[str, float]:
    """Validate `config`, start Ray if needed, train; returns the last validation metrics."""
    if not isinstance(config, DictConfig):
        config = OmegaConf.create(config)
    config = OmegaConf.create(OmegaConf.to_container(config, resolve=False))  # a private copy
    with open_dict(config):
        config.pop("hydra", None)
    config = _upstream_surface(config)
    v = validate_config(config)  # fail fast, before the embedded default is built or Ray starts
    paths = (config.actor_rollout_ref.model.path, config.data.train_files, config.data.val_files)
    config = fill_embedded_defaults(config)
    OmegaConf.resolve(config)
    if None in paths:
        v = validate_config(config)  # the embedded paths were filled in: the typed view follows them
    else:
        remember_validated(config, v)  # the same values, interpolations resolved: validated once
    from verl.trainer.ppo.worker_groups import resolve_worker_backend

    backend = resolve_worker_backend(v)
    with open_dict(config):
        config.trainer.worker_backend = backend
    v = remember_validated(
        config, dataclasses.replace(v, trainer=dataclasses.replace(v.trainer, worker_backend=backend))
    )
    prefetch = _prefetch_imports() if backend == "ray" else None
    started = _init_ray(v.ray_kwargs.ray_init) if backend == "ray" else False
    if prefetch is not None:
        # the overlap is with ray.init only: a module half-imported by the thread must not be used
        # here (joining an existing cluster returns at once; `from transformers import X` then raced
        # the thread's import of transformers' lazy module and failed)
        prefetch.join()
    t0 = time.time()
    try:
        runner = (task_runner_class or TaskRunner)()
        return runner.run(config)
    finally:
        logger.info("run_ppo finished in %.1f s", time.time() - t0)
        if started:
            _shutdown_ray()


def _shutdown_ray() -> None:
    """`ray.shutdown()`, without its fixed 1 s wait on the autoscaler monitor.

    Ray stops its processes one by one, raylet and GCS first, each with SIGTERM and up to 1 s to
    exit before SIGKILL. The monitor's SIGTERM handler reports "the autoscaler failed" to the GCS,
    which is gone by then, so it always takes the full second and is then SIGKILLed (measured with
    Ray 2.60: 1.05 s of a 1.96 s shutdown). A private single-node session has no autoscaling, so
    the monitor is SIGKILLed first: the end state Ray reaches anyway, a second sooner."""
    import ray

    try:
        from ray._private import ray_constants

        node = ray._private.worker._global_node
        for info in node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, []) if node else []:
            if info.process.poll() is None:
                info.process.kill()
                info.process.wait(timeout=5)
    except Exception as exc:  # noqa: BLE001 - Ray internals moved: ray.shutdown alone still stops it
        logger.debug("could not stop Ray's monitor first: %s", exc)
    ray.shutdown()


# Third-party modules the driver imports after Ray is up (tokenizer, processor, parquet reader).
# They never import verl, so importing them in a second thread cannot deadlock on a module lock
# with the main thread; the main thread's own imports of them then find them done (or wait).
PREFETCH_MODULES = ("transformers", "pyarrow.parquet")
PREFETCH_ENV = "VERL_PREFETCH_IMPORTS"


def _prefetch_imports() -> threading.Thread | None:
    """Import `PREFETCH_MODULES` in a daemon thread while `ray.init` runs in the main thread;
    the caller joins the thread before anything else uses those modules.

    `ray.init` spends most of its ~2-3 s waiting for the processes it spawns (GCS, raylet,
    dashboard), so the ~2 s of CPU-bound imports that follow it run in that time instead. Imports
    change no computed value. Off with env VERL_PREFETCH_IMPORTS=0. A failed import is left for
    the main thread to raise where the module is really needed."""
    if os.environ.get(PREFETCH_ENV, "1").lower() in ("0", "false", "no", "off"):
        return None

    def work() -> None:
        import importlib

        for name in PREFETCH_MODULES:
            try:
                importlib.import_module(name)
                if name == "transformers":
                    from transformers import AutoProcessor, AutoTokenizer  # noqa: F401 - resolves the lazy module
            except Exception as exc:  # noqa: BLE001 - reported by the main thread's own import
                logger.debug("prefetch of %s failed: %s", name, exc)

    thread = threading.Thread(target=work, name="verl-prefetch-imports", daemon=True)
    thread.start()
    return thread


def exit_now(code: int = 0) -> None:
    """End the process after a finished run without the interpreter's finalisation.

    Runs the `atexit` handlers (logging, trackers, Ray's own hook), flushes stdout/stderr and
    calls `os._exit(code)`: tearing down torch's, Ray's and transformers' modules object by object
    takes ~1 s and does nothing a finished run needs. Only for a run that returned normally
    (`python -m verl.trainer.main_ppo`); an error keeps the normal exit and its traceback."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream has nothing left to write
            pass
    os._exit(code)


def _upstream_surface(config: DictConfig) -> DictConfig:
    """Upstream's keys mapped onto ours (aliases, the `reward` section...), (c) keys refused and
    (b) keys logged: the config every later step and every worker reads."""
    from verl.trainer.config.upstream_keys import check_upstream_surface

    return check_upstream_surface(config)


if __name__ == "__main__":
    sys.argv = _normalized_argv(sys.argv)
    check_cli_overrides(sys.argv[1:])
    main()
    exit_now(0)
