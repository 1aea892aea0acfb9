"""Roles of the worker groups, which roles a config needs, and the config check that runs before
any worker starts (upstream names: `Role`, `need_critic`, `need_reference_policy`,
`need_reward_model`).

`validate_config(config)` converts every section into its dataclass (unknown keys and bad values
raise there, naming the key) and then checks the rules that span sections: registered estimator
and loss names, batch-size divisibility (`verl/trainer/config/derived.py`, whose values it keeps
in `ValidatedConfig.derived`), group estimators with `rollout.n == 1`, the critic.
`validated_config(config)` returns the object already made for the same config (`run_ppo`
validates once; the task runner and the trainer reuse it).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from enum import Enum
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.trainer.config import (
    AlgoConfig,
    CustomRewardFunctionConfig,
    DataConfig,
    RayKwargsConfig,
    TrainerConfig,
)
from verl.trainer.config.derived import DerivedConfig, derive
from verl.trainer.config.reward import RewardConfig
from verl.trainer.config.sections import SECTION_DATACLASSES  # noqa: F401 - re-exported (key listings)
from verl.trainer.ppo.source_checks import _is_local_path, check_model_dirs, check_paths_exist
from verl.utils.config import ConfigTypeError, omega_conf_to_dataclass
from verl.utils.py_functional import config_get
from verl.workers.config import ActorConfig, CriticConfig, HFModelConfig, RefConfig, RewardModelConfig, RolloutConfig


class Role(Enum):
    """A worker role; roles sharing a resource pool live in one process per device."""

    Actor = 0
    Rollout = 1
    ActorRollout = 2
    Critic = 3
    RefPolicy = 4
    RewardModel = 5
    ActorRolloutRef = 6


# GROUP_ESTIMATORS / CRITIC_ESTIMATORS: the registered estimators by trait, computed when read
# (module __getattr__ below) so that importing this module (the CLI composing its config) loads no
# torch; the checks read `core_algos.get_adv_estimator_traits`, which also covers user estimators
_TRAIT_SETS = {"GROUP_ESTIMATORS": "needs_groups", "CRITIC_ESTIMATORS": "needs_critic"}


def __getattr__(name: str):
    if name in _TRAIT_SETS:
        from verl.trainer.ppo import core_algos

        return core_algos.adv_estimators_with(_TRAIT_SETS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


TOP_LEVEL_SECTIONS = (
    "data",
    "actor_rollout_ref",
    "critic",
    "reward_model",
    "custom_reward_function",
    "reward",
    "algorithm",
    "trainer",
    "ray_kwargs",
)
ACTOR_ROLLOUT_REF_KEYS = ("hybrid_engine", "model", "actor", "ref", "rollout")


def _get(cfg: Any, dotted: str, default: Any = None) -> Any:
    """`config_get` along a dotted path (`"algorithm.adv_estimator"`)."""
    node = cfg
    for part in dotted.split("."):
        node = config_get(node, part)
    return default if node is None else node


def need_critic(config: Any) -> bool:
    """`critic.enable` when set, else whether `algorithm.adv_estimator` needs a value model."""
    enable = _get(config, "critic.enable")
    if enable is not None:
        return bool(enable)
    from verl.trainer.ppo import core_algos

    return core_algos.get_adv_estimator_traits(_get(config, "algorithm.adv_estimator", "")).needs_critic


def need_reference_policy(config: Any) -> bool:
    """A frozen reference policy is needed for KL in the reward or KL in the loss."""
    return bool(_get(config, "algorithm.use_kl_in_reward", False)) or bool(
        _get(config, "actor_rollout_ref.actor.use_kl_loss", False)
    )


def reference_in_actor(config: Any) -> bool:
    """Whether the reference log-probs come from the actor with its LoRA adapter disabled (no
    reference worker): the actor trains an adapter (`actor_rollout_ref.model.lora_rank > 0` or a
    `lora_adapter_path`), so its frozen base is the reference. Upstream's `ref_in_actor`."""
    rank = _get(config, "actor_rollout_ref.model.lora_rank", 0) or 0
    return int(rank) > 0 or _get(config, "actor_rollout_ref.model.lora_adapter_path") is not None


def need_reward_model(config: Any) -> bool:
    """`reward.reward_model.enable` (upstream main's key); the old `reward_model.enable` wins when
    it is set (not null), as the yaml documents."""
    old = _get(config, "reward_model.enable")
    if old is not None:
        return bool(old)
    return bool(_get(config, "reward.reward_model.enable", False))


@dataclass
class ValidatedConfig:
    """The typed view of a run's config (what the trainer reads; workers get the raw sections)."""

    data: DataConfig
    model: HFModelConfig
    actor: ActorConfig
    ref: RefConfig
    rollout: RolloutConfig
    critic: CriticConfig
    reward_model: RewardModelConfig
    custom_reward_function: CustomRewardFunctionConfig
    algorithm: AlgoConfig
    trainer: TrainerConfig
    ray_kwargs: RayKwargsConfig
    use_critic: bool
    use_reference_policy: bool
    use_rm: bool
    n_workers: int
    # the batch plans and loss-scale default (verl/trainer/config/derived.py); the number of
    # training steps is filled in by the trainer once the dataloader exists
    derived: DerivedConfig | None = None
    reward: RewardConfig | None = None  # `reward.*` (the reward loop's section)
    # hybrid_engine=False / trainer.v1: `verl.trainer.ppo.async_plan.AsyncPlan`
    async_plan: Any = None


def external_module_list(config: Any) -> list[str]:
    """Every user module a process must import: `trainer.external_modules`,
    `actor_rollout_ref.model.external_lib` and `VERL_USE_EXTERNAL_MODULES` (comma separated)."""
    mods: list[str] = []
    ext = _get(config, "trainer.external_modules") or []
    if isinstance(ext, str):
        ext = [ext]
    mods.extend(str(m) for m in ext)
    lib = _get(config, "actor_rollout_ref.model.external_lib")
    if lib:
        mods.append(str(lib))
    env = os.environ.get("VERL_USE_EXTERNAL_MODULES", "")
    mods.extend(p.strip() for p in env.split(",") if p.strip())
    out: list[str] = []
    for m in mods:
        if m not in out:
            out.append(m)
    return out


def _sections(config: Any) -> dict:
    if isinstance(config, DictConfig):
        return config
    return OmegaConf.create(config)


def resolve_device(requested: str) -> str:
    """`auto` -> cuda when torch sees a GPU, else cpu; `cuda` without a GPU raises
    (`verl.utils.device.resolve_device`, imported when called: the driver composes and checks its
    config before torch loads)."""
    from verl.utils.device import resolve_device as resolve

    return resolve(requested)


def _named_at_source(exc: Exception, cfg: Any) -> Exception:
    """A type error on a key whose yaml value interpolates another key (`actor.rollout_n:
    ${oc.select:actor_rollout_ref.rollout.n,1}`) also names that source key: the user set it there."""
    import re

    match = re.match(r"([\w.]+)=", str(exc))
    if not match or not isinstance(cfg, DictConfig):
        return exc
    key = match.group(1)
    node: Any = OmegaConf.to_container(cfg, resolve=False)
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    source = re.match(r"\$\{(?:oc\.select:)?([\w.]+)", node) if isinstance(node, str) else None
    if source is None:
        return exc
    return type(exc)(f"{exc} ({key} follows {source.group(1)}: fix the value of {source.group(1)})")


def validate_config(config: Any) -> ValidatedConfig:
    """Convert and check the whole config; raises ValueError naming the key, value and rule.

    User modules (custom losses/estimators/reward managers) are imported first, so names they
    register are accepted. The result remembers the config it came from: `validated_config`
    returns it again for the same config instead of validating twice.
    """
    from verl.trainer.ppo.async_plan import plan_async

    cfg = _checked_sections(config)
    check_roles_colocated(cfg)
    import_user_modules(cfg)
    v = _convert_sections(cfg)

    def derive_plans():
        v.derived = derive(v)  # the batch-size rules (one place, shared with the workers)
        v.async_plan = plan_async(cfg, v)  # a rollout of its own, trainer.v1 modes (docs/async.md)

    # the model and data sources first: a rule about the job means little when its model is missing
    sources = [lambda: check_paths_exist(v), lambda: check_model_dirs(v)]
    _run_checks(
        [*sources, lambda: check_algorithm(v), lambda: check_rollout(v), derive_plans, lambda: check_trainer(v)]
    )
    _remember(config, v)
    return v


def _run_checks(checks: list) -> None:
    """Run every check; the first error is raised as it is, the others are added to it as notes
    (shown under its traceback), so one run reports every config error it can find."""
    errors: list[Exception] = []
    for check in checks:
        try:
            check()
        except (ValueError, TypeError, KeyError, FileNotFoundError, NotImplementedError, ImportError) as exc:
            errors.append(exc)
    if not errors:
        return
    first = errors[0]
    for other in errors[1:]:
        first.add_note(f"also: {type(other).__name__}: {other}")
    raise first


_LAST_VALIDATED: list[tuple[str, ValidatedConfig]] = []


def _fingerprint(config: Any) -> str:
    return OmegaConf.to_yaml(_sections(config), resolve=False)


def _remember(config: Any, v: ValidatedConfig) -> None:
    _LAST_VALIDATED[:] = [(_fingerprint(config), v)]


def validated_config(config: Any) -> ValidatedConfig:
    """The `ValidatedConfig` of `config`: the one `validate_config` (or `remember_validated`) made
    for this config content most recently, else a fresh validation. `run_ppo` validates once and
    the task runner and the trainer reuse that object; a config changed since is validated again."""
    if _LAST_VALIDATED and _LAST_VALIDATED[0][0] == _fingerprint(config):
        return _LAST_VALIDATED[0][1]
    return validate_config(config)


def remember_validated(config: Any, v: ValidatedConfig) -> ValidatedConfig:
    """Record `v` as the validated view of `config` (after a change the caller made to both, e.g.
    the resolved `trainer.device`); returns `v`."""
    _remember(config, v)
    return v


def _checked_sections(config: Any) -> DictConfig:
    """The config with upstream's keys mapped onto ours; unknown top-level sections and
    `actor_rollout_ref` keys fail, naming what is accepted."""
    from verl.trainer.config.upstream_keys import check_upstream_surface

    cfg = check_upstream_surface(_sections(config))  # upstream keys: aliases, (b) log, (c) refusals
    unknown = sorted(set(cfg.keys()) - set(TOP_LEVEL_SECTIONS) - {"hydra"})
    if unknown:
        raise ValueError(f"unknown top-level config section(s) {unknown}; accepted: {list(TOP_LEVEL_SECTIONS)}")
    arr = cfg.get("actor_rollout_ref") or {}
    unknown = sorted(set(arr.keys()) - set(ACTOR_ROLLOUT_REF_KEYS))
    if unknown:
        raise ValueError(
            f"unknown config key(s) {['actor_rollout_ref.' + k for k in unknown]}; accepted: "
            f"{list(ACTOR_ROLLOUT_REF_KEYS)}"
        )
    return cfg


def _convert_sections(cfg: DictConfig) -> ValidatedConfig:
    """Every section as its dataclass (a bad value fails naming its key, and the key it follows)."""
    arr = cfg.get("actor_rollout_ref") or {}

    def conv(node, cls, _path):
        try:
            return omega_conf_to_dataclass(node, cls, _path=_path)
        except ConfigTypeError as exc:
            raise _named_at_source(exc, cfg) from None

    v = ValidatedConfig(
        data=conv(cfg.get("data"), DataConfig, _path="data"),
        model=conv(arr.get("model"), HFModelConfig, _path="actor_rollout_ref.model"),
        actor=conv(arr.get("actor"), ActorConfig, _path="actor_rollout_ref.actor"),
        ref=conv(arr.get("ref"), RefConfig, _path="actor_rollout_ref.ref"),
        rollout=conv(arr.get("rollout"), RolloutConfig, _path="actor_rollout_ref.rollout"),
        critic=conv(cfg.get("critic"), CriticConfig, _path="critic"),
        reward_model=conv(cfg.get("reward_model"), RewardModelConfig, _path="reward_model"),
        custom_reward_function=conv(
            cfg.get("custom_reward_function"), CustomRewardFunctionConfig, _path="custom_reward_function"
        ),
        algorithm=conv(cfg.get("algorithm"), AlgoConfig, _path="algorithm"),
        trainer=conv(cfg.get("trainer"), TrainerConfig, _path="trainer"),
        ray_kwargs=conv(cfg.get("ray_kwargs"), RayKwargsConfig, _path="ray_kwargs"),
        use_critic=need_critic(cfg),
        use_reference_policy=need_reference_policy(cfg),
        use_rm=need_reward_model(cfg),
        n_workers=0,
        reward=conv(cfg.get("reward"), RewardConfig, _path="reward"),
    )
    v.n_workers = v.trainer.nnodes * v.trainer.n_gpus_per_node
    return v


def check_registered_names(algo: AlgoConfig, actor: ActorConfig) -> None:
    """The estimator, the policy loss and the KL estimator name registered entries."""
    from verl.trainer.ppo import core_algos

    est = algo.adv_estimator
    if est not in core_algos.ADV_ESTIMATOR_REGISTRY:
        raise ValueError(
            f"algorithm.adv_estimator={est!r} is not a registered advantage estimator; registered: "
            f"{sorted(core_algos.ADV_ESTIMATOR_REGISTRY)} (register your own with @register_adv_est in a module "
            "listed in trainer.external_modules)"
        )
    loss = actor.policy_loss.loss_mode
    if loss not in core_algos.POLICY_LOSS_REGISTRY:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss!r} is not a registered policy loss; registered: "
            f"{sorted(core_algos.POLICY_LOSS_REGISTRY)} (register your own with @register_policy_loss in a module "
            "listed in trainer.external_modules)"
        )
    if algo.kl_penalty not in core_algos.KL_PENALTY_TYPES:
        raise ValueError(
            f"algorithm.kl_penalty={algo.kl_penalty!r} is not a KL estimator; expected one of "
            f"{list(core_algos.KL_PENALTY_TYPES)}"
        )


def _estimator_traits(name: str):
    from verl.trainer.ppo import core_algos

    return core_algos.get_adv_estimator_traits(name)


def check_algorithm(v: ValidatedConfig) -> None:
    """The rules between the algorithm, the rollout and the critic."""
    algo, actor, rollout = v.algorithm, v.actor, v.rollout
    check_registered_names(algo, actor)
    est = algo.adv_estimator
    if algo.use_kl_in_reward and algo.kl_penalty == "full":
        raise ValueError(
            "algorithm.kl_penalty='full' needs whole-vocabulary distributions, but the KL in the reward is computed "
            "from per-token log-probs; use kl, abs, mse or low_var_kl with algorithm.use_kl_in_reward=True"
        )
    group_norm = est == "norm" and any(
        getattr(nc, "mean_level", None) == "group" or getattr(nc, "std_level", None) == "group"
        for nc in (algo.reward_norm, algo.adv_norm)
    )
    traits = _estimator_traits(est)
    if (traits.needs_groups or group_norm) and rollout.n == 1:
        raise ValueError(
            f"algorithm.adv_estimator={est!r} compares the responses to one prompt, but actor_rollout_ref.rollout.n=1 "
            "gives one response per prompt (every advantage would be 0); set actor_rollout_ref.rollout.n >= 2"
        )
    if algo.filter_groups.enable and rollout.n == 1:
        raise ValueError(
            "algorithm.filter_groups.enable=True drops groups without reward variance; it needs "
            "actor_rollout_ref.rollout.n >= 2"
        )
    if est == "grpo_process" and algo.use_kl_in_reward:
        raise ValueError(
            "algorithm.adv_estimator='grpo_process' normalises step rewards, but "
            "algorithm.use_kl_in_reward=True puts a "
            "KL penalty on every token (each would count as a step); use "
            "actor_rollout_ref.actor.use_kl_loss=True instead"
        )
    if traits.needs_critic and not v.use_critic:
        raise ValueError(
            f"algorithm.adv_estimator={est!r} needs a value model, but critic.enable=False; set "
            "critic.enable=True or null"
        )
    if traits.needs_greedy_baseline and not rollout.do_sample:
        raise ValueError(
            f"algorithm.adv_estimator={est} compares sampled responses with a greedy one; "
            "actor_rollout_ref.rollout.do_sample must be True"
        )
    if algo.use_kl_in_reward and actor.use_kl_loss:
        warnings.warn(
            "both algorithm.use_kl_in_reward and actor_rollout_ref.actor.use_kl_loss are on: the KL to the reference "
            "policy is penalised twice (in the reward and in the loss)",
            stacklevel=2,
        )


def check_rollout(v: ValidatedConfig) -> None:
    """Rollout correction needs the rollout's log-probs; the response length follows `data`."""
    from verl.trainer.ppo.rollout_corr_helper import validate_rollout_correction_config

    rollout = v.rollout
    rc = v.algorithm.rollout_correction
    validate_rollout_correction_config(rc)
    if (rc.rollout_is or rc.rollout_rs) and not rollout.calculate_log_probs:
        raise ValueError(
            "algorithm.rollout_correction needs the rollout's log-probs: set "
            "actor_rollout_ref.rollout.calculate_log_probs=True"
        )
    if rollout.response_length != v.data.max_response_length:
        raise ValueError(
            f"actor_rollout_ref.rollout.response_length={rollout.response_length} differs from "
            f"data.max_response_length={v.data.max_response_length}; leave the rollout key at its "
            "default (it follows data)"
        )


def check_trainer(v: ValidatedConfig) -> None:
    """Trainer values, callbacks, the rollout engine, checkpoint contents, reward functions and the
    run's inputs (the model and data paths are `check_paths_exist` / `check_model_dirs`, run first
    by `validate_config`)."""
    from verl.utils.tracking import check_backends_available

    algo, actor, tr = v.algorithm, v.actor, v.trainer
    resolve_device(tr.device)
    check_backends_available(tr.logger)
    if tr.critic_warmup and not v.use_critic:
        raise ValueError(
            f"trainer.critic_warmup={tr.critic_warmup} needs a critic (algorithm.adv_estimator=gae "
            "or critic.enable=True)"
        )
    check_callbacks(tr.callbacks)
    check_rollout_engine(v.rollout)
    check_checkpoint_contents("actor_rollout_ref.actor", actor.checkpoint)
    if v.use_critic:
        check_checkpoint_contents("critic", v.critic.checkpoint)
    check_gae_lambda(algo)
    check_reward_functions(v)
    check_run_inputs(v)


def check_callbacks(specs: list[str]) -> None:
    """Every `trainer.callbacks` entry names a `TrainerCallback` subclass (loaded here, before Ray
    starts, so a typo fails at once)."""
    from verl.trainer.ppo.callbacks import TrainerCallback
    from verl.workers.reward_manager.registry import load_object

    for spec in specs:
        cls = load_object(str(spec), what="trainer.callbacks entry")
        if not (isinstance(cls, type) and issubclass(cls, TrainerCallback)):
            raise TypeError(
                f"trainer.callbacks entry {spec!r} is {cls!r}, not a subclass of "
                "verl.trainer.ppo.ray_trainer.TrainerCallback"
            )


# ==============================================================================================
# Checks of what the run will read, before Ray starts: engines, user functions, appended keys,
# model directories, the checkpoint to resume. Each names the key, the value and what is accepted.

# dtypes `actor_rollout_ref.rollout.dtype` may name (vllm reads it; the hf engine uses the actor's)
ROLLOUT_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
# `actor_rollout_ref.rollout.engine_kwargs.hf.*`: what fsdp_workers.ActorRolloutRefWorker reads
HF_ENGINE_KWARGS = {
    "separate_copy": "a boolean: generate with an unsharded copy of the weights instead of the actor's",
    "dtype": "fp32, float32, bf16, bfloat16, fp16 or float16: dtype of that copy",
    "sync_check_tol": "a number: tolerance of the rollout/actor log-prob agreement check",
}
# `*.checkpoint.*`: what verl.utils.checkpoint.BaseCheckpointManager reads
# save_lora_only (ours, not in upstream's yaml: append it with +) and async_save: FSDPCheckpointManager
# reads them (async_save also TrainerCheckpointer, which publishes the step once the shards are written)
CHECKPOINT_KEYS = ("save_contents", "load_contents", "save_lora_only", "async_save")
# arguments the trainer passes to every reward function itself
REWARD_FN_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
# arguments of a reward manager's constructor that the trainer fills itself
REWARD_MANAGER_ARGS = ("self", "tokenizer", "num_examine", "compute_score", "reward_fn_key")

_ROLE_POOL_ROLLOUT = (
    "the actor runs in the trainer's pool (trainer.nnodes x trainer.n_gpus_per_node); for a rollout with workers "
    "of its own use actor_rollout_ref.hybrid_engine=False with actor_rollout_ref.rollout.nnodes x n_gpus_per_node "
    "(trainer.role_pools accepts critic, ref and rm)"
)


def check_roles_colocated(cfg: Any) -> None:
    """On the raw config: `actor_rollout_ref.hybrid_engine` is a boolean, and `trainer.role_pools`
    names no actor/rollout pool (the rollout's own pool has keys of its own, see `async_plan`)."""
    from verl.utils.config import check_value_type

    check_value_type(_get(cfg, "actor_rollout_ref.hybrid_engine", True), bool, "actor_rollout_ref.hybrid_engine")
    pools = _get(cfg, "trainer.role_pools") or {}
    if hasattr(pools, "keys"):
        for role in pools:
            if str(role) in ("rollout", "actor", "actor_rollout"):
                raise ValueError(f"trainer.role_pools.{role}: {_ROLE_POOL_ROLLOUT}")


def import_user_modules(cfg: Any) -> None:
    """`import_external_libs` on every user module, with the config key in the error."""
    from verl.utils.import_utils import import_external_libs

    for key, mods in (
        ("trainer.external_modules", _get(cfg, "trainer.external_modules") or []),
        ("actor_rollout_ref.model.external_lib", _get(cfg, "actor_rollout_ref.model.external_lib")),
        ("VERL_USE_EXTERNAL_MODULES", os.environ.get("VERL_USE_EXTERNAL_MODULES", "")),
    ):
        if isinstance(mods, str):
            mods = [mods]
        entries = [str(m) for m in (mods or []) if m is not None and str(m).strip()]
        try:
            import_external_libs(entries)
        except (ImportError, FileNotFoundError) as exc:
            raise type(exc)(f"{key}={entries!r}: {exc}") from exc


def check_rollout_engine(rollout: RolloutConfig) -> None:
    """`rollout.name` is a registered engine, `rollout.dtype` a known dtype, and every
    `rollout.engine_kwargs.hf.*` key one that the hf engine reads."""
    from verl.utils.model import torch_dtype_from_name
    from verl.workers.rollout.base import ROLLOUT_REGISTRY

    owner = "actor_rollout_ref.rollout"
    if rollout.name not in ROLLOUT_REGISTRY:
        raise ValueError(
            f"{owner}.name={rollout.name!r} is not a registered rollout engine; expected one of "
            f"{sorted(ROLLOUT_REGISTRY)} "
            "(register your own with @register_rollout in a module listed in trainer.external_modules)"
        )
    if rollout.dtype not in ROLLOUT_DTYPES:
        raise ValueError(f"{owner}.dtype={rollout.dtype!r} is not a dtype; expected one of {list(ROLLOUT_DTYPES)}")
    engine_kwargs = dict(rollout.engine_kwargs or {})
    for engine, kwargs in engine_kwargs.items():
        set_values = {k: x for k, x in (kwargs or {}).items() if x is not None} if isinstance(kwargs, dict) else kwargs
        if engine not in ROLLOUT_REGISTRY and set_values:  # null entries (upstream's yaml defaults) are unset
            raise ValueError(
                f"{owner}.engine_kwargs.{engine}: {engine!r} is not a rollout engine, so nothing reads these keyword "
                f"arguments; expected one of {sorted(ROLLOUT_REGISTRY)}"
            )
    hf = engine_kwargs.get("hf") or {}
    if not isinstance(hf, dict):
        raise TypeError(f"{owner}.engine_kwargs.hf={hf!r}: expected a mapping of {sorted(HF_ENGINE_KWARGS)}")
    for key, value in hf.items():
        where = f"{owner}.engine_kwargs.hf.{key}"
        if key not in HF_ENGINE_KWARGS:
            from verl.utils.config import closest_keys

            close = closest_keys(str(key), HF_ENGINE_KWARGS)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise ValueError(
                f"{where}: the hf engine reads no such key{hint}; accepted keys: {sorted(HF_ENGINE_KWARGS)}"
            )
        if key == "separate_copy" and not isinstance(value, bool):
            raise ValueError(f"{where}={value!r}: expected {HF_ENGINE_KWARGS[key]}")
        if key == "sync_check_tol" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{where}={value!r}: expected {HF_ENGINE_KWARGS[key]}")
        if key == "dtype":
            try:
                torch_dtype_from_name(value)
            except ValueError:
                raise ValueError(f"{where}={value!r}: expected {HF_ENGINE_KWARGS[key]}") from None


def check_checkpoint_contents(owner: str, checkpoint: Any) -> None:
    """`<owner>.checkpoint` holds only keys the checkpoint manager reads, with known contents."""
    import dataclasses

    from verl.trainer.config.upstream_keys import _has_path, _yaml_raw, rule_for
    from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager
    from verl.utils.config import closest_keys

    # a dataclass section has refused unknown keys already; its other fields are its own business
    typed = dataclasses.is_dataclass(checkpoint)
    section = (
        {k: getattr(checkpoint, k) for k in CHECKPOINT_KEYS if hasattr(checkpoint, k)}
        if typed
        else dict(checkpoint or {})
    )
    allowed = BaseCheckpointManager.ALLOWED_CONTENTS
    for key, value in section.items():
        where = f"{owner}.checkpoint.{key}"
        if key not in CHECKPOINT_KEYS and (rule_for(where) is not None or _has_path(_yaml_raw(), where)):
            continue  # an upstream key (strict, ...): upstream_keys decides its behaviour
        if key not in CHECKPOINT_KEYS:
            close = closest_keys(str(key), CHECKPOINT_KEYS)
            hint = f" (did you mean {' or '.join(owner + '.checkpoint.' + c for c in close)}?)" if close else ""
            raise ValueError(
                f"{where}: the checkpoint manager reads no such key{hint}; accepted keys: {list(CHECKPOINT_KEYS)}"
            )
        if value is None:
            continue
        if key in ("save_lora_only", "async_save"):
            if not isinstance(value, bool):
                raise TypeError(f"{where}={value!r}: expected a boolean (true or false)")
            continue
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            raise TypeError(f"{where}={value!r}: expected a list of {list(allowed)}")
        bad = [c for c in items if c not in allowed]
        if bad:
            raise ValueError(f"{where}={list(items)!r}: unknown entries {bad}; expected one of {list(allowed)}")


def _accepted_kwargs(fn: Any, skip: tuple[str, ...]) -> tuple[bool, list[str]]:
    """(takes **kwargs, names it takes by keyword other than `skip`) of a function or class."""
    import inspect

    target = fn.__init__ if isinstance(fn, type) else fn
    params = inspect.signature(target).parameters.values()
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in skip]
    return var_kw, names


def check_reward_functions(v: ValidatedConfig) -> None:
    """The reward function and manager exist and accept the keyword arguments configured for them
    (`custom_reward_function.reward_kwargs`, `reward_model.reward_kwargs`); `reward_model.enable`
    has a model."""
    from verl.utils.import_utils import load_extern_type

    crf = v.custom_reward_function
    kwargs = dict(crf.reward_kwargs or {})
    if crf.path:
        try:
            fn = load_extern_type(crf.path, crf.name)
        except (ImportError, FileNotFoundError, AttributeError) as exc:
            raise type(exc)(
                f"custom_reward_function.path={crf.path!r}, custom_reward_function.name={crf.name!r}: {exc}"
            ) from exc
        if not callable(fn):
            raise TypeError(
                f"custom_reward_function.name={crf.name!r} in {crf.path!r} is a "
                f"{type(fn).__name__}; expected a function"
            )
        for key in kwargs:
            var_kw, names = _accepted_kwargs(fn, REWARD_FN_ARGS)
            if key in REWARD_FN_ARGS or not (var_kw or key in names):
                raise ValueError(
                    f"custom_reward_function.reward_kwargs.{key}: {crf.name}() in {crf.path} does not accept a keyword "
                    f"argument {key!r} (the trainer passes {list(REWARD_FN_ARGS)} itself); accepted keys: {names}; "
                    "add the parameter (or **kwargs) to the function"
                )
    elif kwargs:
        raise ValueError(
            f"custom_reward_function.reward_kwargs.{min(kwargs)}: the shipped default_compute_score reads no keyword "
            "arguments (its rule-based scorers ignore them); set custom_reward_function.path to a "
            "function that accepts "
            f"{sorted(kwargs)}, or remove them"
        )

    import verl.workers.reward_manager  # noqa: F401 - registers the shipped managers
    from verl.trainer.ppo.reward import checked_by_reward_loop
    from verl.workers.reward_manager.registry import get_reward_manager_cls

    loop = checked_by_reward_loop(v)  # a reward-loop manager: its name and reward_kwargs are checked there
    cls = None if loop else get_reward_manager_cls(v.reward_model.reward_manager)
    var_kw, names = (True, []) if loop else _accepted_kwargs(cls, REWARD_MANAGER_ARGS)
    for key in dict(v.reward_model.reward_kwargs or {}):
        if not (var_kw or key in names):
            raise ValueError(
                f"reward_model.reward_kwargs.{key}: reward_model.reward_manager={v.reward_model.reward_manager!r} "
                f"({cls.__name__}) does not accept {key!r}; accepted keys: {names}"
            )
    if v.use_rm and not v.reward_model.model.path:
        raise ValueError(
            "reward_model.enable=True needs reward_model.model.path (a sequence-classification reward model "
            "directory); set it, or use reward_model.enable=False to score with the reward function only"
        )


def check_gae_lambda(algo: AlgoConfig) -> None:
    """A string `algorithm.lam` names a registered lambda function or an importable one."""
    if isinstance(algo.lam, str):
        from verl.trainer.ppo import core_algos

        fn = core_algos._resolve_callable(algo.lam)  # raises naming algorithm.lam and the registered names
        if not callable(fn):
            raise TypeError(
                f"algorithm.lam={algo.lam!r} is not callable; expected a number in [0, 1] or a lambda function"
            )


def check_run_inputs(v: ValidatedConfig) -> None:
    """The checkpoint to resume from and the custom dataset file exist."""
    tr = v.trainer
    if tr.resume_mode == "resume_path" and tr.resume_from_path:
        from verl.trainer.ppo.checkpoint import TRAINER_STATE_FILE, upstream_step_dir

        path = os.path.expanduser(str(tr.resume_from_path))
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"trainer.resume_from_path={tr.resume_from_path!r} does not exist (resolved from {os.getcwd()!r}); "
                "expected a global_step_N checkpoint directory, or use trainer.resume_mode=auto"
            )
        if not os.path.isfile(os.path.join(path, TRAINER_STATE_FILE)) and upstream_step_dir(path) is None:
            raise FileNotFoundError(
                f"trainer.resume_from_path={tr.resume_from_path!r} is not a complete checkpoint (no "
                f"{TRAINER_STATE_FILE}); "
                "expected a global_step_N directory written by a finished save (or an upstream verl FSDP "
                "checkpoint: global_step_N with actor/fsdp_config.json)"
            )
    custom = v.data.custom_cls
    if (
        custom.path
        and "://" not in custom.path
        and not os.path.exists(os.path.expanduser(custom.path))
        and (custom.path.endswith(".py") or _is_local_path(custom.path))
    ):
        raise FileNotFoundError(
            f"data.custom_cls.path={custom.path!r}: no such file or directory (resolved from {os.getcwd()!r})"
        )
