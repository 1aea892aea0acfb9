"""Roles of the worker groups, which roles a config needs, and the config check that runs before
any worker starts (upstream names: `Role`, `need_critic`, `need_reference_policy`,
`need_reward_model`).

`validate_config(config)` converts every section into its dataclass (unknown keys and bad values
raise there, naming the key) and then checks the rules that span sections: registered estimator
and loss names, batch-size divisibility, group estimators with `rollout.n == 1`, the critic.
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
from verl.utils.config import omega_conf_to_dataclass
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


# estimators whose baseline comes from the other responses of the same prompt: rollout.n must be > 1
GROUP_ESTIMATORS = frozenset(
    {"grpo", "grpo_vectorized", "grpo_passk", "grpo_process", "rloo", "rloo_vectorized",
     "reinforce_plus_plus_baseline", "opo", "gpg"}
)
# estimators that need a value model
CRITIC_ESTIMATORS = frozenset({"gae"})

TOP_LEVEL_SECTIONS = ("data", "actor_rollout_ref", "critic", "reward_model", "custom_reward_function",
                      "algorithm", "trainer", "ray_kwargs")
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
    return _get(config, "algorithm.adv_estimator") in CRITIC_ESTIMATORS


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
    return bool(_get(config, "reward_model.enable", False))


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


def check_batch_sizes(data: DataConfig, actor: ActorConfig, critic: CriticConfig, rollout: RolloutConfig,
                      n_workers: int, use_critic: bool, critic_workers: int | None = None) -> None:
    """The batch-size rules of docs/batch_sizes.md, with the numbers in every message.

    - `data.train_batch_size * rollout.n` sequences are split over the `n_workers` data-parallel
      workers: it must be a multiple of n_workers.
    - `ppo_mini_batch_size` (prompts) must divide `data.train_batch_size` (equal-sized optimizer
      steps), and `ppo_mini_batch_size * rollout.n` must be a multiple of n_workers.
    - Without dynamic batch sizes, the per-worker mini-batch `ppo_mini_batch_size * n / n_workers`
      must be a multiple of `ppo_micro_batch_size_per_gpu`.
    """
    n = rollout.n
    seqs = data.train_batch_size * n
    if seqs % n_workers:
        raise ValueError(
            f"data.train_batch_size * actor_rollout_ref.rollout.n = {data.train_batch_size} * {n} = {seqs} sequences "
            f"cannot be split evenly over {n_workers} data-parallel workers (trainer.nnodes * trainer.n_gpus_per_node); "
            f"choose a train_batch_size with train_batch_size * n divisible by {n_workers}"
        )
    groups = [("actor_rollout_ref.actor", actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz, n_workers)]
    if use_critic:
        cw = critic_workers or n_workers
        groups.append(("critic", critic.ppo_mini_batch_size, critic.ppo_micro_batch_size_per_gpu, critic.use_dynamic_bsz, cw))
    for owner, mini, micro, dynamic, n_workers in groups:
        if mini > data.train_batch_size:
            raise ValueError(
                f"{owner}.ppo_mini_batch_size={mini} is larger than data.train_batch_size={data.train_batch_size} "
                "(both count prompts); use at most the train batch size"
            )
        if data.train_batch_size % mini:
            raise ValueError(
                f"data.train_batch_size={data.train_batch_size} is not a multiple of {owner}.ppo_mini_batch_size={mini} "
                f"(both count prompts): the last mini-batch would hold {data.train_batch_size % mini} prompts; "
                f"use a divisor of {data.train_batch_size}"
            )
        mini_seqs = mini * n
        if mini_seqs % n_workers:
            raise ValueError(
                f"{owner}.ppo_mini_batch_size * rollout.n = {mini} * {n} = {mini_seqs} sequences cannot be split over "
                f"{n_workers} data-parallel workers; make it a multiple of {n_workers}"
            )
        per_worker = mini_seqs // n_workers
        if not dynamic and micro is None:
            raise ValueError(f"{owner}.ppo_micro_batch_size_per_gpu is null and {owner}.use_dynamic_bsz=False: set one of them")
        if not dynamic and per_worker % micro:
            raise ValueError(
                f"{owner}.ppo_micro_batch_size_per_gpu={micro} does not divide the per-worker mini-batch "
                f"ppo_mini_batch_size * rollout.n / workers = {mini} * {n} / {n_workers} = {per_worker} sequences; "
                f"use a divisor of {per_worker} (or use_dynamic_bsz=True)"
            )


def resolve_device(requested: str) -> str:
    """`auto` -> cuda when torch sees a GPU, else cpu; `cuda` without a GPU raises."""
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device=cuda but torch sees no CUDA device; use trainer.device=cpu or auto")
    return requested


def validate_config(config: Any) -> ValidatedConfig:
    """Convert and check the whole config; raises ValueError naming the key, value and rule.

    User modules (custom losses/estimators/reward managers) are imported first, so names they
    register are accepted.
    """
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.rollout_corr_helper import validate_rollout_correction_config
    from verl.utils.import_utils import import_external_libs
    from verl.utils.tracking import check_backends_available

    cfg = _sections(config)
    unknown = sorted(set(cfg.keys()) - set(TOP_LEVEL_SECTIONS) - {"hydra"})
    if unknown:
        raise ValueError(f"unknown top-level config section(s) {unknown}; accepted: {list(TOP_LEVEL_SECTIONS)}")
    arr = cfg.get("actor_rollout_ref") or {}
    unknown = sorted(set(arr.keys()) - set(ACTOR_ROLLOUT_REF_KEYS))
    if unknown:
        raise ValueError(
            f"unknown config key(s) {['actor_rollout_ref.' + k for k in unknown]}; accepted: {list(ACTOR_ROLLOUT_REF_KEYS)}"
        )

    import_external_libs(external_module_list(cfg))

    conv = omega_conf_to_dataclass
    v = ValidatedConfig(
        data=conv(cfg.get("data"), DataConfig, _path="data"),
        model=conv(arr.get("model"), HFModelConfig, _path="actor_rollout_ref.model"),
        actor=conv(arr.get("actor"), ActorConfig, _path="actor_rollout_ref.actor"),
        ref=conv(arr.get("ref"), RefConfig, _path="actor_rollout_ref.ref"),
        rollout=conv(arr.get("rollout"), RolloutConfig, _path="actor_rollout_ref.rollout"),
        critic=conv(cfg.get("critic"), CriticConfig, _path="critic"),
        reward_model=conv(cfg.get("reward_model"), RewardModelConfig, _path="reward_model"),
        custom_reward_function=conv(cfg.get("custom_reward_function"), CustomRewardFunctionConfig, _path="custom_reward_function"),
        algorithm=conv(cfg.get("algorithm"), AlgoConfig, _path="algorithm"),
        trainer=conv(cfg.get("trainer"), TrainerConfig, _path="trainer"),
        ray_kwargs=conv(cfg.get("ray_kwargs"), RayKwargsConfig, _path="ray_kwargs"),
        use_critic=need_critic(cfg),
        use_reference_policy=need_reference_policy(cfg),
        use_rm=need_reward_model(cfg),
        n_workers=0,
    )
    v.n_workers = v.trainer.nnodes * v.trainer.n_gpus_per_node
    algo, actor, rollout = v.algorithm, v.actor, v.rollout

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
        raise ValueError(f"algorithm.kl_penalty={algo.kl_penalty!r} is not a KL estimator; expected one of {list(core_algos.KL_PENALTY_TYPES)}")
    if algo.use_kl_in_reward and algo.kl_penalty == "full":
        raise ValueError(
            "algorithm.kl_penalty='full' needs whole-vocabulary distributions, but the KL in the reward is computed "
            "from per-token log-probs; use kl, abs, mse or low_var_kl with algorithm.use_kl_in_reward=True"
        )
    group_norm = est == "norm" and any(
        getattr(nc, "mean_level", None) == "group" or getattr(nc, "std_level", None) == "group"
        for nc in (algo.reward_norm, algo.adv_norm)
    )
    if (est in GROUP_ESTIMATORS or group_norm) and rollout.n == 1:
        raise ValueError(
            f"algorithm.adv_estimator={est!r} compares the responses to one prompt, but actor_rollout_ref.rollout.n=1 "
            "gives one response per prompt (every advantage would be 0); set actor_rollout_ref.rollout.n >= 2"
        )
    if algo.filter_groups.enable and rollout.n == 1:
        raise ValueError("algorithm.filter_groups.enable=True drops groups without reward variance; it needs actor_rollout_ref.rollout.n >= 2")
    if est == "grpo_process" and algo.use_kl_in_reward:
        raise ValueError(
            "algorithm.adv_estimator='grpo_process' normalises step rewards, but algorithm.use_kl_in_reward=True puts a "
            "KL penalty on every token (each would count as a step); use actor_rollout_ref.actor.use_kl_loss=True instead"
        )
    if est in CRITIC_ESTIMATORS and not v.use_critic:
        raise ValueError(f"algorithm.adv_estimator={est!r} needs a value model, but critic.enable=False; set critic.enable=True or null")
    if est == "remax" and not rollout.do_sample:
        raise ValueError("algorithm.adv_estimator=remax compares sampled responses with a greedy one; actor_rollout_ref.rollout.do_sample must be True")
    if algo.use_kl_in_reward and actor.use_kl_loss:
        warnings.warn(
            "both algorithm.use_kl_in_reward and actor_rollout_ref.actor.use_kl_loss are on: the KL to the reference "
            "policy is penalised twice (in the reward and in the loss)",
            stacklevel=2,
        )
    rc = algo.rollout_correction
    validate_rollout_correction_config(rc)
    if (rc.rollout_is or rc.rollout_rs) and not rollout.calculate_log_probs:
        raise ValueError(
            "algorithm.rollout_correction needs the rollout's log-probs: set actor_rollout_ref.rollout.calculate_log_probs=True"
        )
    if rollout.response_length != v.data.max_response_length:
        raise ValueError(
            f"actor_rollout_ref.rollout.response_length={rollout.response_length} differs from "
            f"data.max_response_length={v.data.max_response_length}; leave the rollout key at its default (it follows data)"
        )
    critic_pool = v.trainer.role_pools.get("critic")
    check_batch_sizes(v.data, actor, v.critic, rollout, v.n_workers, v.use_critic,
                      critic_workers=sum(critic_pool) if critic_pool else None)
    tr = v.trainer
    resolve_device(tr.device)
    check_backends_available(tr.logger)
    if tr.critic_warmup and not v.use_critic:
        raise ValueError(f"trainer.critic_warmup={tr.critic_warmup} needs a critic (algorithm.adv_estimator=gae or critic.enable=True)")
    check_paths_exist(v)
    check_callbacks(tr.callbacks)
    return v


def check_callbacks(specs: list[str]) -> None:
    """Every `trainer.callbacks` entry names a `TrainerCallback` subclass (loaded here, before Ray
    starts, so a typo fails at once)."""
    from verl.trainer.ppo.ray_trainer import TrainerCallback
    from verl.workers.reward_manager.registry import load_object

    for spec in specs:
        cls = load_object(str(spec), what="trainer.callbacks entry")
        if not (isinstance(cls, type) and issubclass(cls, TrainerCallback)):
            raise TypeError(f"trainer.callbacks entry {spec!r} is {cls!r}, not a subclass of "
                            "verl.trainer.ppo.ray_trainer.TrainerCallback")


def _is_local_path(path: str) -> bool:
    """A path the user means as local (absolute, ~ or relative with ./ ../), not a hub id `org/name`."""
    return path.startswith(("/", "~", "./", "../")) or os.path.splitext(path)[1] in (".parquet", ".jsonl", ".json", ".py")


def check_paths_exist(v: ValidatedConfig) -> None:
    """Fail before Ray starts when a local model directory, data file or reward file is missing."""
    checks: list[tuple[str, Any]] = [
        ("data.train_files", v.data.train_files),
        ("data.val_files", v.data.val_files),
        ("actor_rollout_ref.model.path", v.model.path),
        ("actor_rollout_ref.model.tokenizer_path", v.model.tokenizer_path),
        ("custom_reward_function.path", v.custom_reward_function.path),
    ]
    if v.use_critic:
        checks.append(("critic.model.path", v.critic.model.path))
    if v.use_rm:
        checks.append(("reward_model.model.path", v.reward_model.model.path))
    from verl.utils.fs import is_non_local

    for key, value in checks:
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if item is None:  # null = the embedded default
                continue
            item = str(item)
            if is_non_local(item):
                raise NotImplementedError(f"{key}={item!r}: remote storage is not supported; copy it to a local path first")
            if item.startswith("file://"):
                item = item[len("file://"):]
            elif "://" in item:
                continue  # another scheme: left to the loader that reads it
            if _is_local_path(item) and not os.path.exists(os.path.expanduser(item)):
                raise FileNotFoundError(f"{key}={item!r}: no such file or directory (resolved from {os.getcwd()!r})")
