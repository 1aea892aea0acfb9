"""`RayPPOTrainer`: the single-controller PPO/GRPO loop (DESIGN.md §3).

The driver owns the control flow; every heavy operation is a method call on a worker group that
splits the `DataProto` over its workers and concatenates the results. Advantages, KL in reward
and metrics are computed here on CPU tensors.

One step of `fit()`:

1. prompts from the dataloader, each with a `uid`; repeated `rollout.n` times (interleaved);
2. `generate_sequences` -> `responses`, `response_mask`, `input_ids`, `attention_mask`, ...;
3. reward: the reward manager (or the reward-model worker) -> `token_level_scores`;
4. optional dynamic sampling (DAPO): drop groups without reward variance, generate more;
5. `old_log_probs` (skipped when the update can use its own first forward exactly), `ref_log_prob`,
   `values`;
6. KL in reward (`apply_kl_penalty`), then `compute_advantage` through the estimator registry;
7. `update_critic`, then `update_actor` (after `trainer.critic_warmup` steps); the hf rollout
   shares the actor's weights in-process, so the update is the weight sync;
8. validation every `test_freq`, checkpoint every `save_freq`, metrics to the loggers.

Extension points are hooks on this one loop: subclass and override a phase method
(`generate`, `compute_reward`, `filter_groups`, `compute_old_log_prob`, ...), or pass
`TrainerCallback`s (also from `trainer.callbacks` in the config).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import resource
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from codetiming import Timer
from omegaconf import OmegaConf, open_dict

from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.checkpoint import (
    TRAINER_STATE_FILE,
    checkpoint_to_resume,
    prune_checkpoints,
    remove_stale_tmp_dirs,
    save_checkpoint_atomically,
    step_of,
    verify_checkpoint,
)
from verl.trainer.ppo.core_algos import AdvantageEstimator  # noqa: F401 - upstream users import it from here
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_mfu_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    compute_variance_proxy_metrics,
    count_model_params,
    peak_flops_per_worker,
    process_validation_metrics,
    reduce_metrics,
)
from verl.trainer.ppo.reward import compute_reward
from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode
from verl.trainer.ppo.utils import Role, ValidatedConfig, reference_in_actor, validate_config
from verl.utils.checkpoint.integrity import load_plain, rng_state_from_plain, rng_state_to_plain, save_plain
from verl.utils.py_functional import config_get
from verl.utils.torch_functional import masked_mean, response_span
from verl.utils.tracking import to_jsonable
from verl.workers.reward_manager.registry import load_object

logger = logging.getLogger(__name__)

__all__ = [
    "RayPPOTrainer",
    "ResourcePoolManager",
    "Role",
    "TrainerCallback",
    "apply_kl_penalty",
    "compute_advantage",
    "compute_response_mask",
]


# ============================================================================ resource pools
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

    def create_resource_pool(self) -> None:
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
            )

    def release(self) -> None:
        """Give every pool's reservation back to Ray (its actors are killed)."""
        for pool in self.resource_pool_dict.values():
            pool.release()
        self.resource_pool_dict.clear()

    def get_resource_pool(self, role: Role):
        return self.resource_pool_dict[self.mapping[role]]

    def get_n_gpus(self) -> int:
        return sum(sum(v) for v in self.resource_pool_spec.values())


# ============================================================================ driver-side math
def compute_response_mask(data: DataProto) -> torch.Tensor:
    """[B, R] mask of the response tokens: the last R columns of `attention_mask`."""
    width = data.batch["responses"].shape[-1]
    return data.batch["attention_mask"][:, -width:]


def apply_kl_penalty(data: DataProto, kl_ctrl, kl_penalty: str = "kl") -> tuple[DataProto, dict[str, float]]:
    """KL in the reward: `token_level_rewards = token_level_scores - beta * kl(old_log_probs, ref_log_prob)`.

    `beta` is the controller's current value; the controller is then updated with the batch's
    mean per-sequence KL (masked mean over valid tokens, then mean over sequences).
    Reads `token_level_scores`, `old_log_probs`, `ref_log_prob`, `response_mask` [B, R]; writes
    `token_level_rewards` [B, R].
    """
    mask = data.batch["response_mask"]
    kld = core_algos.kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty=kl_penalty)
    kld = kld * mask
    beta = kl_ctrl.value
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - beta * kld
    current_kl = masked_mean(kld, mask, axis=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def _accepted_kwargs(fn, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` restricted to the parameters `fn` declares, unless it takes `**kwargs`: an
    estimator written for upstream (fixed parameter list) must not fail on our extra inputs."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return kwargs
    names = {
        p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return {k: v for k, v in kwargs.items() if k in names}


AGENT_FIELDS = ("agent_name", "extra_info", "tools_kwargs", "index")


def _add_agent_fields(gen_in: DataProto, batch: DataProto) -> None:
    """Per-sample fields the agent loops read (`agent_name`, `extra_info.tools_kwargs`, ...),
    copied into the generation input; the batch keeps them for the reward."""
    for key in AGENT_FIELDS:
        if key in batch.non_tensor_batch:
            gen_in.non_tensor_batch[key] = batch.non_tensor_batch[key]


def compute_advantage(
    data: DataProto,
    adv_estimator: str,
    gamma: float = 1.0,
    lam: Any = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> DataProto:
    """`advantages`, `returns` [B, R] from the estimator registered as `adv_estimator`.

    Precedence of the explicit arguments, as upstream: `gamma`/`lam` are used by `gae` and
    `norm_adv_by_std_in_grpo` by `grpo`; every other estimator reads these values from `config`
    (`algorithm`), so the defaults of this function never override the config (with
    `config=None` the explicit values are passed on instead).

    The estimator gets by keyword what it may need (`token_level_rewards`, `response_mask`,
    `index` = uid array, `config`, and when in the batch `values`, `reward_baselines`,
    `token_level_scores`, `turn_ids`, `step_end_mask`, `old_log_probs`, `sum_pi_squared`,
    `rollout_is_weights`; `non_tensor_batch` and `batch` for `gdpo`); an estimator without
    `**kwargs` gets only the parameters it declares. With `algorithm.use_pf_ppo` (gae only, as
    upstream) the batch is then resampled by `core_algos.compute_pf_ppo_reweight_data`.
    (`num_repeat` is accepted for upstream compatibility: groups come from `uid`.)
    """
    if "response_mask" not in data.batch.keys():
        data.batch["response_mask"] = compute_response_mask(data)
    name = adv_estimator.value if isinstance(adv_estimator, core_algos.AdvantageEstimator) else adv_estimator
    fn = core_algos.get_adv_estimator_fn(name)
    kwargs: dict[str, Any] = dict(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch.get("uid"),
        config=config,
    )
    if name == "gae" or config is None:
        kwargs.update(gamma=gamma, lam=lam)
    if name == "grpo" or config is None:
        kwargs["norm_adv_by_std_in_grpo"] = norm_adv_by_std_in_grpo
    for key in (
        "values",
        "reward_baselines",
        "token_level_scores",
        "turn_ids",
        "step_end_mask",
        "old_log_probs",
        "sum_pi_squared",
        "rollout_is_weights",
    ):
        if key in data.batch.keys():
            kwargs[key] = data.batch[key]
    if name == "gdpo":
        kwargs["non_tensor_batch"] = data.non_tensor_batch
        kwargs["batch"] = data.batch
    advantages, returns = fn(**_accepted_kwargs(fn, kwargs))
    data.batch["advantages"] = advantages.detach()
    data.batch["returns"] = returns.detach()
    if name == "gae" and config is not None and config_get(config, "use_pf_ppo", False):
        pf = config_get(config, "pf_ppo", None)
        data = core_algos.compute_pf_ppo_reweight_data(
            data, config_get(pf, "reweight_method", "pow"), config_get(pf, "weight_pow", 2.0)
        )
    return data


FILTER_SCORE_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")


def select_groups_with_variance(batch: DataProto, metric: str) -> tuple[DataProto, int, int]:
    """Rows of the groups (same `uid`) whose per-response `metric` is not constant.

    `metric` is a reward extra-info column (e.g. `acc`), or `score` / `seq_reward` /
    `seq_final_reward` for the summed `token_level_scores` (`acc` falls back to the score when
    the scorer reports no `acc`). The reward extra-info columns are those listed in
    `batch.meta_info["reward_extra_keys"]` (set by `compute_reward`; without it, any non-tensor
    column). An unknown metric fails, naming the metrics that exist. Returns (kept rows, kept
    groups, dropped groups).
    """
    reward_keys = batch.meta_info.get("reward_extra_keys")
    columns = (
        list(batch.non_tensor_batch) if reward_keys is None else [k for k in reward_keys if k in batch.non_tensor_batch]
    )
    if metric in columns:
        values = []
        for i, v in enumerate(batch.non_tensor_batch[metric]):
            try:
                values.append(float(v))
            except (TypeError, ValueError):
                raise ValueError(
                    f"algorithm.filter_groups.metric={metric!r}: row {i} holds {v!r}, not a number "
                    "(does the scoring function report it for every response?)"
                ) from None
    elif metric in FILTER_SCORE_METRICS:
        values = batch.batch["token_level_scores"].sum(-1).tolist()
    else:
        what = "columns of the batch" if reward_keys is None else "metrics the reward function reports"
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r} is not produced by this run's reward; {what}: "
            f"{sorted(columns)}, and from the summed score: {list(FILTER_SCORE_METRICS)}"
        )
    by_uid: dict[Any, list[float]] = defaultdict(list)
    for uid, v in zip(batch.non_tensor_batch["uid"], values, strict=False):
        by_uid[uid].append(v)
    keep_uids = {u for u, vs in by_uid.items() if len(vs) > 1 and np.std(vs) > 0}
    keep = [i for i, u in enumerate(batch.non_tensor_batch["uid"]) if u in keep_uids]
    return batch.select_idxs(np.array(keep, dtype=np.int64)), len(keep_uids), len(by_uid) - len(keep_uids)


def trim_to_whole_groups(
    batch: DataProto, max_groups: int, n: int, divisor: int, group_multiple: int = 1
) -> DataProto | None:
    """The first (in order of appearance) at most `max_groups` whole groups, fewer if needed so
    that groups * n rows split evenly over `divisor` data-parallel workers and the number of
    groups is a multiple of `group_multiple` (the mini-batch size in prompts, so the update's
    mini-batches are all full); None if no group fits."""
    uids = list(dict.fromkeys(batch.non_tensor_batch["uid"]))
    n_groups = min(len(uids), max_groups)
    while n_groups > 0 and ((n_groups * n) % divisor or n_groups % group_multiple):
        n_groups -= 1
    if n_groups == 0:
        return None
    keep_uids = set(uids[:n_groups])
    idx = [i for i, u in enumerate(batch.non_tensor_batch["uid"]) if u in keep_uids]
    return batch.select_idxs(np.array(idx, dtype=np.int64))


def trim_left_padding(data: DataProto, keys=("input_ids", "attention_mask", "position_ids")) -> DataProto:
    """Drop the leading columns that are padding in every row (left-padded prompts).

    Prompts are padded to `data.max_prompt_length`, usually far more than the longest prompt of a
    batch; the padding is masked, so removing the columns no row uses changes no result and
    saves the generation engine all the work on them (prefill and every decoding step attend to
    them). Position ids keep their values. In place; returns `data`.
    """
    mask = data.batch["attention_mask"]
    used = mask.bool().any(dim=0)
    if not bool(used.any()):
        return data
    first = int(used.int().argmax())
    if first > 0:
        for k in keys:
            if k in data.batch.keys():
                data.batch[k] = data.batch[k][..., first:]
    return data


def left_pad_prompts(data: DataProto, width: int, pad_token_id: int) -> DataProto:
    """Left-pad the prompt side of a generated batch to `width` prompt columns.

    Generation batches are trimmed to their own longest prompt (`trim_left_padding`), so two
    rounds of dynamic sampling can differ in prompt width; before they are concatenated both get
    the wider one. Pads `prompts` [B, P] and `input_ids` / `attention_mask` / `position_ids`
    [..., P+R] on the left (pad id, mask 0, position 0): masked columns change no result. In
    place; returns `data`.
    """
    extra = width - data.batch["prompts"].shape[-1]
    if extra <= 0:
        return data
    for key, value in (
        ("prompts", pad_token_id),
        ("input_ids", pad_token_id),
        ("attention_mask", 0),
        ("position_ids", 0),
    ):
        if key in data.batch.keys():
            data.batch[key] = torch.nn.functional.pad(data.batch[key], (extra, 0), value=value)
    return data


def concat_generated(parts: list[DataProto], pad_token_id: int) -> DataProto:
    """Concatenate generated batches whose prompt widths may differ (see `left_pad_prompts`)."""
    if all("prompts" in p.batch.keys() for p in parts):
        width = max(p.batch["prompts"].shape[-1] for p in parts)
        parts = [left_pad_prompts(p, width, pad_token_id) for p in parts]
    return DataProto.concat(parts)


def dp_compute(worker_group, method: str, data: DataProto) -> DataProto:
    """`worker_group.<method>(data)` for a row-wise inference call (generation, log-probs,
    values, reward-model scores), with `data` padded to a multiple of the group's workers and
    the padding rows dropped from the result.

    Training batches split evenly over the actor's workers, but not necessarily over a group of
    another size (`trainer.role_pools`), nor do validation batches; the updates are never padded
    (their batches are cut to whole groups that split evenly, see `trim_to_whole_groups`).
    """
    padded, pad = pad_dataproto_to_divisor(data, worker_group.world_size)
    return unpad_dataproto(getattr(worker_group, method)(padded), pad)


# ============================================================================ hooks
class TrainerCallback:
    """Observe or adjust the loop at fixed points without copying `fit()`.

    Every method receives the trainer; batch hooks may modify `batch` in place and add entries
    to `metrics`. `state_dict`/`load_state_dict` are saved in and restored from checkpoints.
    """

    def on_fit_start(self, trainer: RayPPOTrainer) -> None: ...

    def on_batch_scored(self, trainer: RayPPOTrainer, batch: DataProto, metrics: dict) -> None:
        """After generation and reward, before dynamic sampling and log-probs."""

    def on_advantages(self, trainer: RayPPOTrainer, batch: DataProto, metrics: dict) -> None:
        """After advantages, before the critic and actor updates."""

    def on_step_end(self, trainer: RayPPOTrainer, metrics: dict) -> None:
        """After the step's metrics are complete, before they are logged."""

    def on_validation(self, trainer: RayPPOTrainer, metrics: dict) -> None: ...

    def on_fit_end(self, trainer: RayPPOTrainer) -> None: ...

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None: ...


class _EndOfData(Exception):
    """The training data (all epochs) is exhausted."""


@contextmanager
def _env_override(env: dict[str, str]):
    """Set environment variables for the duration of the block, then restore them."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _timer(name: str, timing_raw: dict[str, float]):
    """Time a phase; repeated phases within a step (several generation rounds) add up."""

    @contextmanager
    def ctx():
        with Timer(name=name, logger=None) as t:
            yield
        timing_raw[name] = timing_raw.get(name, 0.0) + t.last

    return ctx()


# ============================================================================ the trainer
class RayPPOTrainer:
    """Driver of PPO-family training over Ray worker groups (see the module docstring).

    Args (upstream signature):
        config: the whole run config (OmegaConf); validated with `validate_config`.
        tokenizer: the policy's tokenizer (decoding for rewards and validation samples).
        role_worker_mapping: role -> worker class (`ActorRolloutRefWorker`, `CriticWorker`, ...).
        resource_pool_manager: where each role runs.
        ray_worker_group_cls: the worker-group class (`RayWorkerGroup`).
        reward_fn / val_reward_fn: reward managers for training / validation.
        train_dataset / val_dataset / collate_fn / train_sampler: data (built from `data.*` when None).
        callbacks: `TrainerCallback`s, in addition to those of `trainer.callbacks`.
    """

    def __init__(
        self,
        config,
        tokenizer,
        role_worker_mapping: dict,
        resource_pool_manager: ResourcePoolManager,
        ray_worker_group_cls=None,
        processor=None,
        reward_fn=None,
        val_reward_fn=None,
        train_dataset=None,
        val_dataset=None,
        collate_fn=None,
        train_sampler=None,
        device_name: str | None = None,
        callbacks: list[TrainerCallback] | None = None,
    ):
        self.config = config
        self.cfg: ValidatedConfig = validate_config(config)
        self.tokenizer = tokenizer
        self.processor = processor
        self.role_worker_mapping = role_worker_mapping
        self.resource_pool_manager = resource_pool_manager
        if ray_worker_group_cls is None:
            from verl.single_controller.ray import RayWorkerGroup

            ray_worker_group_cls = RayWorkerGroup
        self.ray_worker_group_cls = ray_worker_group_cls
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn
        self.device_name = device_name or self.cfg.trainer.device
        self.hybrid_engine = bool(config.actor_rollout_ref.get("hybrid_engine", True))
        if not self.hybrid_engine:
            raise NotImplementedError(
                "actor_rollout_ref.hybrid_engine=False is not supported; the rollout shares the actor's weights"
            )
        self.use_critic = self.cfg.use_critic
        self.use_reference_policy = self.cfg.use_reference_policy
        self.use_rm = self.cfg.use_rm
        # LoRA: the reference is the actor with its adapter disabled, unless the caller maps a
        # reference worker of its own (Role.RefPolicy), which is then used
        self.ref_in_actor = (
            self.use_reference_policy and Role.RefPolicy not in role_worker_mapping and reference_in_actor(config)
        )
        if self.use_reference_policy and not self.ref_in_actor and Role.RefPolicy not in role_worker_mapping:
            raise ValueError("the config needs a reference policy (KL) but role_worker_mapping has no Role.RefPolicy")
        if self.use_critic and Role.Critic not in role_worker_mapping:
            raise ValueError("the config needs a critic but role_worker_mapping has no Role.Critic")
        algo = self.cfg.algorithm
        self.kl_ctrl_in_reward = core_algos.get_kl_controller(algo.kl_ctrl) if algo.use_kl_in_reward else None

        self.callbacks: list[TrainerCallback] = list(callbacks or [])
        for spec in self.cfg.trainer.callbacks:
            self.callbacks.append(load_object(str(spec), what="trainer.callbacks entry")())

        self.global_steps = 0
        self.epoch = 0
        # the driver's generators (restored from a checkpoint on resume)
        seed = self.cfg.trainer.seed
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        self._create_dataloader(train_dataset, val_dataset, collate_fn, train_sampler)

    # ------------------------------------------------------------------ data
    def _create_dataloader(self, train_dataset, val_dataset, collate_fn, train_sampler) -> None:
        """Build the stateful train dataloader and the validation dataloader; fix the number of
        training steps and write it into the optimizers' schedule configs."""
        from verl.utils.dataset import StatefulDataLoader
        from verl.utils.dataset.rl_dataset import collate_fn as default_collate_fn
        from verl.utils.dataset.rl_dataset import create_rl_dataset, create_rl_sampler

        data = self.cfg.data
        if train_dataset is None:
            train_dataset = create_rl_dataset(
                data.train_files, self.config.data, self.tokenizer, self.processor, is_train=True
            )
        if val_dataset is None:
            val_dataset = create_rl_dataset(
                data.val_files, self.config.data, self.tokenizer, self.processor, is_train=False
            )
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        if train_sampler is None:
            train_sampler = create_rl_sampler(self.config.data, train_dataset)
        collate_fn = collate_fn or default_collate_fn
        if len(train_dataset) < data.train_batch_size:
            raise ValueError(
                f"the training set has {len(train_dataset)} prompts, fewer than "
                f"data.train_batch_size={data.train_batch_size}"
            )
        self.train_dataloader = StatefulDataLoader(
            dataset=train_dataset,
            batch_size=data.train_batch_size,
            num_workers=data.dataloader_num_workers,
            drop_last=True,
            collate_fn=collate_fn,
            sampler=train_sampler,
        )
        if len(val_dataset) == 0:
            raise ValueError(
                f"the validation set data.val_files={data.val_files!r} has no prompts "
                "(after data.filter_overlong_prompts, if it is on)"
            )
        val_bs = data.val_batch_size or len(val_dataset)
        self.val_dataloader = StatefulDataLoader(
            dataset=val_dataset,
            batch_size=val_bs,
            num_workers=data.dataloader_num_workers,
            shuffle=data.validation_shuffle,
            drop_last=False,
            collate_fn=collate_fn,
        )
        if len(self.train_dataloader) < 1:
            raise ValueError("the training dataloader is empty")
        total = len(self.train_dataloader) * self.cfg.trainer.total_epochs
        if self.cfg.trainer.total_training_steps is not None:
            total = self.cfg.trainer.total_training_steps
        self.total_training_steps = total
        with open_dict(self.config):
            self.config.actor_rollout_ref.actor.optim.total_training_steps = total
            if self.use_critic:
                self.config.critic.optim.total_training_steps = total

    # ------------------------------------------------------------------ workers
    def init_workers(self) -> None:
        """Create the resource pools and worker groups (colocated per pool) and build the models."""
        from verl.single_controller.ray import RayClassWithInitArgs
        from verl.single_controller.ray.base import create_colocated_worker_cls

        self.resource_pool_manager.create_resource_pool()
        pool_to_cls: dict[Any, dict[str, Any]] = {p: {} for p in self.resource_pool_manager.resource_pool_dict.values()}

        def add(which: Role, name: str, **init):
            cls = RayClassWithInitArgs(cls=self.role_worker_mapping[which], **init)
            pool_to_cls[self.resource_pool_manager.get_resource_pool(which)][name] = cls

        add(Role.ActorRollout, "actor_rollout", config=self.config.actor_rollout_ref, role="actor_rollout")
        if self.use_critic:
            add(Role.Critic, "critic", config=self.config.critic)
        if self.use_reference_policy and not self.ref_in_actor:
            add(Role.RefPolicy, "ref", config=self.config.actor_rollout_ref, role="ref")
        if self.use_rm:
            add(Role.RewardModel, "rm", config=self.config.reward_model)

        all_wg: dict[str, Any] = {}
        self._worker_groups = []
        # the controller forwards the driver's VERL_* variables to the workers it creates
        with _env_override(self._worker_env()):
            for pool, class_dict in pool_to_cls.items():
                if not class_dict:
                    continue
                worker_dict_cls = create_colocated_worker_cls(class_dict=class_dict)
                wg_dict = self.ray_worker_group_cls(
                    resource_pool=pool,
                    ray_cls_with_init=worker_dict_cls,
                    num_threads_per_worker=self.cfg.trainer.torch_threads_per_worker,
                )
                self._worker_groups.append(wg_dict)
                all_wg.update(wg_dict.spawn(prefix_set=class_dict.keys()))

        if self.use_critic:
            self.critic_wg = all_wg["critic"]
            self.critic_wg.init_model()
        if self.use_reference_policy and not self.ref_in_actor:
            self.ref_policy_wg = all_wg["ref"]
            self.ref_policy_wg.init_model()
        if self.use_rm:
            self.rm_wg = all_wg["rm"]
            self.rm_wg.init_model()
        # the actor last: a GPU rollout engine sizes its cache from the memory left
        self.actor_rollout_wg = all_wg["actor_rollout"]
        self.actor_rollout_wg.init_model()
        if self.ref_in_actor:
            self.ref_policy_wg = self.actor_rollout_wg

    def shutdown(self) -> None:
        """Stop the worker processes and free their Ray resources (a Ray session can then host
        another run, e.g. in tests or a notebook)."""
        for wg in getattr(self, "_worker_groups", []):
            wg.kill_workers()
        self._worker_groups = []
        self.resource_pool_manager.release()

    def _worker_env(self) -> dict[str, str]:
        """Environment of every worker process: the device, the seed, and every user module (so custom
        losses/estimators registered there exist in the workers too). Torch threads are set by
        the worker group (`trainer.torch_threads_per_worker`, default: the slot's CPUs)."""
        from verl.trainer.ppo.utils import external_module_list

        # VERL_SEED: the workers' sampling streams follow trainer.seed (rank r uses seed + r)
        env = {"VERL_DEVICE": self.device_name, "VERL_SEED": str(self.cfg.trainer.seed)}
        mods = external_module_list(self.config)
        if mods:
            env["VERL_USE_EXTERNAL_MODULES"] = ",".join(os.path.abspath(m) if m.endswith(".py") else m for m in mods)
        return env

    @property
    def dp_size(self) -> int:
        return self.actor_rollout_wg.world_size

    # ------------------------------------------------------------------ phases (hooks for subclasses)
    def prepare_batch(self, batch_dict: dict, round_idx: int) -> DataProto:
        """A dataloader batch as DataProto with a deterministic `uid` per prompt."""
        batch = DataProto.from_single_dict(batch_dict)
        batch.non_tensor_batch["uid"] = np.array(
            [f"{self.global_steps}-{round_idx}-{i}" for i in range(len(batch))], dtype=object
        )
        return batch

    def generate(self, batch: DataProto, timing_raw: dict, metrics: dict) -> DataProto:
        """Repeat every prompt `rollout.n` times (interleaved) and append the generated responses."""
        n = self.cfg.rollout.n
        batch = batch.repeat(repeat_times=n, interleave=True)
        gen_keys = [k for k in ("input_ids", "attention_mask", "position_ids") if k in batch.batch.keys()]
        nt_keys = [k for k in ("raw_prompt_ids", "raw_prompt", "multi_modal_data") if k in batch.non_tensor_batch]
        gen_in = trim_left_padding(batch.pop(batch_keys=gen_keys, non_tensor_batch_keys=nt_keys))
        _add_agent_fields(gen_in, batch)
        gen_in.meta_info.update(self._gen_meta(validate=False))
        with _timer("gen", timing_raw):
            out = dp_compute(self.actor_rollout_wg, "generate_sequences", gen_in)
        out.meta_info.pop("timing", None)
        metrics.update(reduce_metrics(out.meta_info.pop("metrics", {}) or {}))
        batch = batch.union(out)
        if "response_mask" not in batch.batch.keys():
            batch.batch["response_mask"] = compute_response_mask(batch)
        if core_algos.get_adv_estimator_traits(self.cfg.algorithm.adv_estimator).needs_greedy_baseline:
            with _timer("gen_max", timing_raw):
                batch = self._remax_baseline(batch, gen_in)
        return batch

    def _gen_meta(self, validate: bool) -> dict:
        meta = {
            "eos_token_id": self.tokenizer.eos_token_id,
            "pad_token_id": self.tokenizer.pad_token_id,
            "global_steps": self.global_steps,
            "validate": validate,
        }
        if validate:
            vk = self.cfg.rollout.val_kwargs
            meta.update(do_sample=vk.do_sample, temperature=vk.temperature, top_p=vk.top_p, top_k=vk.top_k)
        return meta

    def _remax_baseline(self, batch: DataProto, gen_in: DataProto) -> DataProto:
        """ReMax: the reward of one greedy response per prompt, as `reward_baselines` [B]."""
        n = self.cfg.rollout.n
        first = gen_in.select_idxs(np.arange(0, len(gen_in), n))
        first.meta_info["do_sample"] = False
        greedy = dp_compute(self.actor_rollout_wg, "generate_sequences", first)
        greedy.meta_info.pop("timing", None)
        greedy.meta_info.pop("metrics", None)
        first_rows = np.arange(0, len(batch), n)
        scored = DataProto.from_dict(
            tensors={k: greedy.batch[k] for k in greedy.batch.keys()},
            non_tensors={k: v[first_rows] for k, v in batch.non_tensor_batch.items()},
        )
        if "response_mask" not in scored.batch.keys():
            scored.batch["response_mask"] = compute_response_mask(scored)
        if self.use_rm:  # the baseline is scored like the sampled responses
            scored = scored.union(dp_compute(self.rm_wg, "compute_rm_score", scored))
        base, _ = compute_reward(scored, self.reward_fn)
        batch.batch["reward_baselines"] = base.sum(-1).repeat_interleave(n)
        return batch

    def compute_reward(self, batch: DataProto, timing_raw: dict, metrics: dict) -> DataProto:
        """`token_level_scores` [B, R] (reward model and/or reward manager) + extra info columns."""
        with _timer("reward", timing_raw):
            if self.use_rm:
                batch = batch.union(dp_compute(self.rm_wg, "compute_rm_score", batch))
            scores, extra = compute_reward(batch, self.reward_fn)
        batch.batch["token_level_scores"] = scores
        batch.meta_info["reward_extra_keys"] = sorted(extra)  # the metrics filter_groups may select
        for k, v in extra.items():
            # one object per row (np.array would turn equal-length per-row lists into a 2-D array)
            column = np.empty(len(v), dtype=object)
            for i, x in enumerate(v):
                column[i] = x
            batch.non_tensor_batch[k] = column
        # counts over every round of a step (dynamic sampling scores several batches)
        for column, name in (
            ("score_error", "reward/score_errors"),
            ("score_timeout", "reward/score_timeouts"),
            ("math_verify_fallback", "reward/math_verify_fallbacks"),
        ):
            flags = extra.get(column)
            metrics[name] = metrics.get(name, 0) + (int(sum(bool(e) for e in flags)) if flags else 0)
        return batch

    def filter_groups(self, batch: DataProto, metrics: dict) -> DataProto:
        """DAPO dynamic sampling: keep only groups (same uid) whose `filter_groups.metric` varies."""
        kept, n_kept, n_dropped = select_groups_with_variance(batch, self.cfg.algorithm.filter_groups.metric)
        kept.meta_info.pop("reward_extra_keys", None)  # rounds are concatenated: their meta_info must agree
        metrics["filter_groups/kept_groups"] = metrics.get("filter_groups/kept_groups", 0) + n_kept
        metrics["filter_groups/dropped_groups"] = metrics.get("filter_groups/dropped_groups", 0) + n_dropped
        return kept

    def collect_batch(self, prompts: Iterator[dict], timing_raw: dict, metrics: dict) -> DataProto | None:
        """Generate and score until this step's training batch is ready.

        Without dynamic sampling: one round. With `algorithm.filter_groups.enable`: rounds of
        `train_batch_size` prompts until `train_batch_size` groups with reward variance are kept
        (`keep_generating`, capped by `max_num_gen_batches`), or one round whose surviving groups
        are trained on (`keep_generating=False`). Returns None when no group survived.
        """
        fg = self.cfg.algorithm.filter_groups
        target = self.cfg.data.train_batch_size
        kept: DataProto | None = None
        rounds = 0
        while True:
            try:
                batch_dict = next(prompts)
            except StopIteration:
                if kept is None:
                    raise _EndOfData from None
                break  # data ran out mid-collection: train on what was collected
            batch = self.prepare_batch(batch_dict, rounds)
            rounds += 1
            batch = self.generate(batch, timing_raw, metrics)
            batch = self.compute_reward(batch, timing_raw, metrics)
            for cb in self.callbacks:
                cb.on_batch_scored(self, batch, metrics)
            if not fg.enable:
                return batch
            if rounds == 1:
                # score metrics of the unfiltered first round: what the policy actually does
                metrics["filter_groups/raw_score_mean"] = batch.batch["token_level_scores"].sum(-1).mean().item()
            batch = self.filter_groups(batch, metrics)
            # each round's prompts were trimmed to its own longest one: align the widths first
            # (the pad id is masked out; any id works)
            kept = batch if kept is None else concat_generated([kept, batch], self.tokenizer.pad_token_id or 0)
            n_groups = len(set(kept.non_tensor_batch["uid"]))
            if not fg.keep_generating or n_groups >= target:
                break
            if fg.max_num_gen_batches and rounds >= fg.max_num_gen_batches:
                logger.warning(
                    "filter_groups: %d of %d groups after %d generation rounds (max_num_gen_batches); "
                    "training on what was collected",
                    n_groups,
                    target,
                    rounds,
                )
                break
        metrics["filter_groups/num_gen_batches"] = rounds
        return self._trim_groups(kept, target)

    def _trim_groups(self, batch: DataProto, max_groups: int) -> DataProto | None:
        minis = [self.cfg.actor.ppo_mini_batch_size] + (
            [self.cfg.critic.ppo_mini_batch_size] if self.use_critic else []
        )
        multiple = math.lcm(*minis)
        out = trim_to_whole_groups(batch, max_groups, self.cfg.rollout.n, self.dp_size, group_multiple=multiple)
        kept = 0 if out is None else len(set(out.non_tensor_batch["uid"]))
        n_groups = len(set(batch.non_tensor_batch["uid"]))
        if kept < min(n_groups, max_groups):
            logger.warning(
                "filter_groups: %d groups collected, %d trained (a multiple of the mini-batch size %d prompts)",
                n_groups,
                kept,
                multiple,
            )
        return out

    def can_skip_old_log_prob(self) -> bool:
        """True when the actor's first forward in `update_actor` computes exactly `old_log_probs`:
        one epoch over one mini-batch (the policy has not moved yet when each token is seen) and
        nothing on the driver needs `old_log_probs` before the update (KL in reward, rollout
        rejection sampling and estimators declaring `needs_old_log_probs` do)."""
        cfg = self.cfg
        one_mini = cfg.actor.ppo_mini_batch_size >= cfg.data.train_batch_size and cfg.actor.ppo_epochs == 1
        # rejection sampling and batch-normalised IS weights need the learner's log-probs of the
        # whole batch before the loss; plain IS weights do not (the worker computes them from the
        # detached current log-probs)
        rc = cfg.algorithm.rollout_correction
        needs_old = (
            cfg.algorithm.use_kl_in_reward
            or core_algos.get_adv_estimator_traits(cfg.algorithm.adv_estimator).needs_old_log_probs
            or rc.rollout_rs is not None
            or bool(config_get(rc, "rollout_is_batch_normalize", False))
        )
        return one_mini and not needs_old and not self.bypass_mode()

    def bypass_mode(self) -> bool:
        """`algorithm.rollout_correction.bypass_mode`: the rollout's log-probs are the old ones."""
        return bool(config_get(self.cfg.algorithm.rollout_correction, "bypass_mode", False))

    def compute_old_log_prob(self, batch: DataProto, timing_raw: dict, metrics: dict) -> DataProto:
        if self.bypass_mode():
            # upstream's bypass mode: no learner recomputation (two policies instead of three); the
            # actor's bypass_mode loss corrects against the current policy
            apply_bypass_mode(batch, self.cfg.algorithm.rollout_correction)
            return batch
        if self.can_skip_old_log_prob():
            batch.meta_info["use_current_as_old_log_prob"] = True
            return batch
        with _timer("old_log_prob", timing_raw):
            out = dp_compute(self.actor_rollout_wg, "compute_log_prob", batch)
            if "entropys" in out.batch.keys():
                ent = out.batch.pop("entropys")
                metrics["actor/entropy"] = masked_mean(ent, batch.batch["response_mask"]).item()
            metrics.update(reduce_metrics(out.meta_info.pop("metrics", {}) or {}))
            return batch.union(out)

    def compute_ref_log_prob(self, batch: DataProto, timing_raw: dict) -> DataProto:
        with _timer("ref", timing_raw):
            return batch.union(dp_compute(self.ref_policy_wg, "compute_ref_log_prob", batch))

    def compute_values(self, batch: DataProto, timing_raw: dict) -> DataProto:
        with _timer("values", timing_raw):
            return batch.union(dp_compute(self.critic_wg, "compute_values", batch))

    def compute_advantages(self, batch: DataProto, timing_raw: dict, metrics: dict) -> DataProto:
        algo = self.cfg.algorithm
        with _timer("adv", timing_raw):
            if algo.use_kl_in_reward:
                batch, kl_metrics = apply_kl_penalty(batch, self.kl_ctrl_in_reward, kl_penalty=algo.kl_penalty)
                metrics.update(kl_metrics)
            else:
                batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            batch = compute_advantage(
                batch,
                algo.adv_estimator,
                gamma=algo.gamma,
                lam=algo.lam,
                num_repeat=self.cfg.rollout.n,
                norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
                config=algo,
            )
        return batch

    def update_critic(self, batch: DataProto, timing_raw: dict, metrics: dict) -> None:
        with _timer("update_critic", timing_raw):
            out = self.critic_wg.update_critic(batch)
        metrics.update(reduce_metrics(out.meta_info.get("metrics", {})))

    def update_actor(self, batch: DataProto, timing_raw: dict, metrics: dict) -> None:
        rc = self.cfg.algorithm.rollout_correction
        if rc.rollout_is is not None or rc.rollout_rs is not None or self.bypass_mode():
            batch.meta_info["rollout_correction"] = rc.to_dict()
        with _timer("update_actor", timing_raw):
            out = self.actor_rollout_wg.update_actor(batch)
        metrics.update(reduce_metrics(out.meta_info.get("metrics", {})))
        if out.batch is not None and "entropys" in out.batch.keys() and "actor/entropy" not in metrics:
            # the on-policy shortcut: the update's own forward gives the policy entropy
            metrics["actor/entropy"] = masked_mean(out.batch["entropys"], batch.batch["response_mask"]).item()

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """Train for `total_training_steps` steps; returns the last validation metrics."""
        from tqdm import tqdm

        from verl.utils.tracking import Tracking

        tr = self.cfg.trainer
        self.tracking = Tracking(
            project_name=tr.project_name,
            experiment_name=tr.experiment_name,
            default_backend=tr.logger,
            config=OmegaConf.to_container(self.config, resolve=True),
            log_dir=self.config.trainer.get("log_dir"),
        )
        # for the MFU estimate (perf/mfu/*): the policy's size and one worker's peak FLOP/s
        self._n_params = count_model_params(self.config.actor_rollout_ref.model.path, self.cfg.model.trust_remote_code)
        self._peak_flops = self.config.trainer.get("peak_flops_per_worker") or peak_flops_per_worker(self.device_name)
        # restore last: nothing may draw from the restored random generators before the next step
        self._load_checkpoint()
        self._relog_saved_step()
        for cb in self.callbacks:
            cb.on_fit_start(self)

        last_val: dict[str, float] = {}
        # val_only validates the restored (or initial) policy and never trains
        if self.val_reward_fn is not None and (tr.val_only or (tr.val_before_train and self.global_steps == 0)):
            last_val = self._validate()
            self.tracking.log(last_val, step=self.global_steps)
        if tr.val_only:
            self._finish()
            return last_val

        bar = tqdm(
            total=self.total_training_steps,
            initial=self.global_steps,
            desc="Training",
            disable="console" not in tr.logger,
            dynamic_ncols=True,
        )
        prompts = self._prompt_stream()
        self._t_start = time.monotonic()
        # a resumed run's current step was saved (and validated) by the run that wrote the checkpoint
        self._validated_step = self._saved_step = self.global_steps if self.global_steps > 0 else None
        budget = tr.time_budget_s
        while self.global_steps < self.total_training_steps:
            self.global_steps += 1
            # the step that starts after the time budget is spent is the last one (validated, saved)
            is_last = self.global_steps >= self.total_training_steps or (
                budget is not None and time.monotonic() - self._t_start >= budget
            )
            metrics: dict[str, Any] = {}
            timing_raw: dict[str, float] = {}
            try:
                with _timer("step", timing_raw):
                    batch = self.collect_batch(prompts, timing_raw, metrics)
                    if batch is not None:
                        self.train_step(batch, timing_raw, metrics)
            except _EndOfData:
                self.global_steps -= 1
                logger.warning("training data exhausted after %d steps", self.global_steps)
                break
            if batch is None:
                logger.warning("step %d: no group with reward variance; the update was skipped", self.global_steps)
                metrics["train/skipped_step"] = 1
            last_val = self._end_of_step(batch, metrics, timing_raw, is_last) or last_val
            bar.update(1)
            if is_last:
                break
        bar.close()
        # a run that ended early (data exhausted, skipped last step) still ends validated and saved
        if (
            tr.test_freq > 0
            and self.val_reward_fn is not None
            and self._validated_step != self.global_steps
            and self.global_steps > 0
        ):
            last_val = self._validate()
            self.tracking.log(last_val, step=self.global_steps)
        if tr.save_freq > 0 and self._saved_step != self.global_steps and self.global_steps > 0:
            self._save_checkpoint()
        self._finish()
        return last_val

    def _end_of_step(self, batch: DataProto | None, metrics: dict, timing_raw: dict, is_last: bool) -> dict | None:
        """Validation, metrics, rollout dump, checkpoint and logging of the step just trained
        (`batch` is None for a skipped step). Returns the validation metrics when it validated."""
        tr = self.cfg.trainer
        val = None
        if batch is not None and self._due(tr.test_freq, is_last) and self.val_reward_fn is not None:
            with _timer("testing", timing_raw):
                val = self._validate()
            self._validated_step = self.global_steps
            metrics.update(val)
        if batch is not None:
            metrics.update(
                compute_data_metrics(
                    batch,
                    use_critic=self.use_critic,
                    max_response_length=self.cfg.data.max_response_length,
                    max_prompt_length=self.cfg.data.max_prompt_length,
                )
            )
            metrics.update(compute_timing_metrics(batch, timing_raw))
            # only when the batch carries sum_pi_squared (otherwise {})
            metrics.update(compute_variance_proxy_metrics(batch, metrics.get("actor/grad_norm")))
            n_workers = self.resource_pool_manager.get_n_gpus()
            metrics.update(compute_throughout_metrics(batch, timing_raw, n_gpus=n_workers))
            metrics.update(
                compute_mfu_metrics(
                    batch,
                    timing_raw,
                    self._n_params,
                    self._peak_flops,
                    n_workers,
                    actor_epochs=self.cfg.actor.ppo_epochs,
                    critic_epochs=self.cfg.critic.ppo_epochs,
                )
            )
            self._dump_rollouts(batch)
        else:
            metrics.update({f"timing_s/{k}": v for k, v in timing_raw.items()})
        metrics["training/global_step"] = self.global_steps
        metrics["training/epoch"] = self.epoch
        metrics["perf/driver_max_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
        metrics["perf/elapsed_s"] = time.monotonic() - self._t_start
        for cb in self.callbacks:
            cb.on_step_end(self, metrics)
        if self._due(tr.save_freq, is_last):
            with _timer("save_checkpoint", timing_raw):
                self._save_checkpoint(metrics)
            metrics["timing_s/save_checkpoint"] = timing_raw["save_checkpoint"]
        self.tracking.log(metrics, step=self.global_steps)
        return val

    def train_step(self, batch: DataProto, timing_raw: dict, metrics: dict) -> DataProto:
        """Steps 5-7 of the loop on a scored batch (modifies and returns `batch`)."""
        if self.cfg.trainer.balance_batch:
            self._balance_batch(batch, metrics)
        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
        batch.meta_info["global_steps"] = self.global_steps
        batch = self.compute_old_log_prob(batch, timing_raw, metrics)
        if self.use_reference_policy:
            batch = self.compute_ref_log_prob(batch, timing_raw)
        if self.use_critic:
            batch = self.compute_values(batch, timing_raw)
        batch = self.compute_advantages(batch, timing_raw, metrics)
        for cb in self.callbacks:
            cb.on_advantages(self, batch, metrics)
        if self.use_critic:
            self.update_critic(batch, timing_raw, metrics)
        if self.global_steps > self.cfg.trainer.critic_warmup:
            self.update_actor(batch, timing_raw, metrics)
        return batch

    def _due(self, freq: int | None, is_last: bool) -> bool:
        """Every `freq` steps and at the last step; never when freq <= 0."""
        return freq is not None and freq > 0 and (is_last or self.global_steps % freq == 0)

    def _prompt_stream(self) -> Iterator[dict]:
        """Dataloader batches across epochs; `self.epoch` follows (and is checkpointed)."""
        while self.epoch < self.cfg.trainer.total_epochs:
            if hasattr(self.train_dataloader.sampler, "set_epoch"):
                self.train_dataloader.sampler.set_epoch(self.epoch)
            yield from self.train_dataloader
            self.epoch += 1

    def _balance_batch(self, batch: DataProto, metrics: dict) -> None:
        """Reorder rows so every data-parallel worker gets a similar number of tokens."""
        from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions, log_seqlen_unbalance

        lens = batch.batch["attention_mask"].sum(-1).tolist()
        k = self.dp_size
        if k <= 1 or len(batch) % k:
            return
        parts = get_seqlen_balanced_partitions(lens, k_partitions=k, equal_size=True)
        idx = [i for p in parts for i in p]
        batch.reorder(torch.tensor(idx))
        metrics.update(log_seqlen_unbalance(seqlen_list=lens, partitions=parts, prefix="global_seqlen"))

    def _dump_rollouts(self, batch: DataProto) -> None:
        """With `trainer.rollout_data_dir`: one jsonl per step with prompt, response, score."""
        out_dir = self.cfg.trainer.rollout_data_dir
        if not out_dir:
            return
        rows = self._decode_rows(batch)
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"{self.global_steps}.jsonl"), "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")

    def _decode_rows(self, batch: DataProto) -> list[dict]:
        width = batch.batch["responses"].shape[-1]
        prompt_mask = batch.batch["attention_mask"][:, :-width].bool()
        resp_lens = response_span(batch.batch["response_mask"]).tolist()
        prompts = self.tokenizer.batch_decode(
            [batch.batch["prompts"][i][prompt_mask[i]].tolist() for i in range(len(batch))], skip_special_tokens=True
        )
        resps = self.tokenizer.batch_decode(
            [batch.batch["responses"][i, : int(n)].tolist() for i, n in enumerate(resp_lens)], skip_special_tokens=True
        )
        scores = batch.batch["token_level_scores"].sum(-1).tolist()
        gts = [
            rm.get("ground_truth") if isinstance(rm, dict) else None
            for rm in batch.non_tensor_batch.get("reward_model", [None] * len(batch))
        ]
        rows = [
            {"step": self.global_steps, "input": p, "output": r, "score": s, "ground_truth": to_jsonable(g)}
            for p, r, s, g in zip(prompts, resps, scores, gts, strict=False)
        ]
        if "agent_trace" in batch.non_tensor_batch:  # multi-turn: turns, tool calls and results per sample
            for row, trace in zip(rows, batch.non_tensor_batch["agent_trace"], strict=False):
                row["trace"] = to_jsonable(trace)
        return rows

    # ------------------------------------------------------------------ validation
    def _validate(self) -> dict[str, float]:
        """Generate on the validation set with `rollout.val_kwargs` and score it.

        Returns `val-core/{data_source}/{reward|acc}/{mean@n, best@n, maj@n}` (+ `val-aux/...` for
        the other statistics and extra-info columns)."""
        vk = self.cfg.rollout.val_kwargs
        data_sources: list[str] = []
        uids: list[str] = []
        infos: dict[str, list] = defaultdict(list)
        samples: list[tuple[str, str, float]] = []
        all_rows: list[dict] = []
        agent_val: dict[str, list[float]] = defaultdict(list)
        for b_idx, batch_dict in enumerate(self.val_dataloader):
            batch = DataProto.from_single_dict(batch_dict)
            batch.non_tensor_batch["uid"] = np.array([f"val-{b_idx}-{i}" for i in range(len(batch))], dtype=object)
            batch = batch.repeat(repeat_times=vk.n, interleave=True)
            gen_keys = [k for k in ("input_ids", "attention_mask", "position_ids") if k in batch.batch.keys()]
            nt_keys = [k for k in ("raw_prompt_ids", "raw_prompt", "multi_modal_data") if k in batch.non_tensor_batch]
            gen_in = trim_left_padding(batch.pop(batch_keys=gen_keys, non_tensor_batch_keys=nt_keys))
            _add_agent_fields(gen_in, batch)
            gen_in.meta_info.update(self._gen_meta(validate=True))
            out = dp_compute(self.actor_rollout_wg, "generate_sequences", gen_in)
            out.meta_info.pop("timing", None)
            for k, v in reduce_metrics(out.meta_info.pop("metrics", None) or {}).items():
                if k.startswith(("agent/", "num_turns/")):  # multi-turn rollout figures of the validation set
                    agent_val[k].append(v)
            batch = batch.union(out)
            if "response_mask" not in batch.batch.keys():
                batch.batch["response_mask"] = compute_response_mask(batch)
            if self.use_rm:
                batch = batch.union(dp_compute(self.rm_wg, "compute_rm_score", batch))
            scores, extra = compute_reward(batch, self.val_reward_fn)
            seq_scores = scores.sum(-1).tolist()
            infos["reward"].extend(seq_scores)
            for k, v in extra.items():
                infos[k].extend(v)
            data_sources.extend(batch.non_tensor_batch.get(self.cfg.data.reward_fn_key, ["unknown"] * len(batch)))
            uids.extend(batch.non_tensor_batch["uid"])
            batch.batch["token_level_scores"] = scores
            rows = self._decode_rows(batch)
            all_rows.extend(rows)
            samples.extend((r["input"], r["output"], r["score"]) for r in rows)
            if "pred" not in extra:
                # majority vote (maj@n) needs each response's answer; without a `pred` from the scorer,
                # the whitespace-stripped response text is the answer
                infos["pred"].extend(r["output"].strip() for r in rows)

        tr = self.cfg.trainer
        if tr.log_val_generations and samples:
            from verl.utils.tracking import ValidationGenerationsLogger

            rng = np.random.RandomState(42)  # the same samples every validation: comparable over time
            pick = sorted(rng.permutation(len(samples))[: tr.log_val_generations].tolist())
            ValidationGenerationsLogger(self.tracking.log_dir).log(
                tr.logger, [samples[i] for i in pick], self.global_steps, self.tracking
            )
        if tr.validation_data_dir:
            os.makedirs(tr.validation_data_dir, exist_ok=True)
            with open(os.path.join(tr.validation_data_dir, f"{self.global_steps}.jsonl"), "w", encoding="utf-8") as fh:
                for r in all_rows:
                    fh.write(json.dumps(r) + "\n")

        infos = {k: v for k, v in infos.items() if len(v) == len(data_sources)}
        nested = process_validation_metrics(data_sources, uids, infos)
        metrics: dict[str, float] = {}
        for ds, var2 in nested.items():
            for var, stats in var2.items():
                n_max = max(int(name.split("@")[1].split("/")[0]) for name in stats)
                for name, val in stats.items():
                    core = (
                        var in ("reward", "acc")
                        and f"@{n_max}" in name
                        and any(name.startswith(p) for p in ("mean", "maj", "best"))
                    )
                    metrics[f"{'val-core' if core else 'val-aux'}/{ds}/{var}/{name}"] = val
        for k, v in agent_val.items():
            metrics[f"val-aux/{k}"] = float(np.mean(v))
        for cb in self.callbacks:
            cb.on_validation(self, metrics)
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """Driver state saved with every checkpoint (exact resume)."""
        return {
            "global_steps": self.global_steps,
            "epoch": self.epoch,
            # plain containers only (numpy's state as lists): the file loads with weights_only=True
            "rng": rng_state_to_plain(
                {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
            ),
            "kl_ctrl_value": None if self.kl_ctrl_in_reward is None else self.kl_ctrl_in_reward.value,
            "callbacks": [cb.state_dict() for cb in self.callbacks],
        }

    def load_state_dict(self, state: dict) -> None:
        self.global_steps = int(state["global_steps"])
        self.epoch = int(state["epoch"])
        rng = rng_state_from_plain(state["rng"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        self._resumed_step_metrics = state.get("step_metrics")
        if self.kl_ctrl_in_reward is not None and state.get("kl_ctrl_value") is not None:
            self.kl_ctrl_in_reward.value = float(state["kl_ctrl_value"])
        saved = state.get("callbacks", [])
        if len(saved) != len(self.callbacks):
            logger.warning(
                "the checkpoint holds the state of %d callbacks but this run has %d; states are restored "
                "in order and the rest is left as constructed",
                len(saved),
                len(self.callbacks),
            )
        for cb, s in zip(self.callbacks, saved, strict=False):
            cb.load_state_dict(s)

    def _save_checkpoint(self, metrics: dict | None = None) -> str:
        """Write `global_step_N` atomically (see verl/trainer/ppo/checkpoint.py), then prune.

        `metrics` (the step's metrics so far) are saved with the trainer state: a run killed
        after the save but before the step's log line is re-logged on resume."""
        tr = self.cfg.trainer
        root = tr.default_local_dir
        if getattr(self, "tracking", None) is not None:
            self.tracking.sync()  # every earlier step's line is durable before this checkpoint exists

        def write(tmp: str) -> None:
            self.actor_rollout_wg.save_checkpoint(
                os.path.join(tmp, "actor"), None, self.global_steps, max_ckpt_to_keep=None
            )
            if self.use_critic:
                self.critic_wg.save_checkpoint(
                    os.path.join(tmp, "critic"), None, self.global_steps, max_ckpt_to_keep=None
                )
            save_plain(self.train_dataloader.state_dict(), os.path.join(tmp, "data.pt"), "dataloader state")
            state = self.state_dict()
            state["step_metrics"] = {k: to_jsonable(v) for k, v in (metrics or {}).items()}
            save_plain(state, os.path.join(tmp, TRAINER_STATE_FILE), "trainer state")

        path = save_checkpoint_atomically(root, self.global_steps, write)
        prune_checkpoints(root, tr.max_actor_ckpt_to_keep, tr.max_critic_ckpt_to_keep, newest_step=self.global_steps)
        self._saved_step = self.global_steps
        return path

    def _load_checkpoint(self) -> int:
        """Resume per `trainer.resume_mode`; returns the restored step (0 = fresh start).

        The checkpoint is verified against its manifest first. `auto` falls back to the previous
        complete checkpoint (with a warning) when the newest is damaged; `resume_path` fails naming
        the damaged file."""
        tr = self.cfg.trainer
        root = tr.default_local_dir
        remove_stale_tmp_dirs(root)
        self._resumed_step_metrics = None
        if tr.resume_mode == "disable":
            return 0
        if tr.resume_mode == "resume_path":
            path = tr.resume_from_path
            if not os.path.isfile(os.path.join(path, TRAINER_STATE_FILE)):
                raise FileNotFoundError(
                    f"trainer.resume_from_path={path!r} is not a complete checkpoint (no {TRAINER_STATE_FILE})"
                )
            step_of(path)
            verify_checkpoint(path)
        else:
            path = checkpoint_to_resume(root)
            if path is None:
                return 0
        logger.info("resuming from %s", path)
        self.actor_rollout_wg.load_checkpoint(os.path.join(path, "actor"), None, del_local_after_load=False)
        if self.use_critic:
            critic_path = os.path.join(path, "critic")
            if not os.path.isdir(critic_path):
                raise FileNotFoundError(f"checkpoint {path} has no critic/ part but this run trains a critic")
            self.critic_wg.load_checkpoint(critic_path, None, del_local_after_load=False)
        self.train_dataloader.load_state_dict(load_plain(os.path.join(path, "data.pt")))
        self.load_state_dict(load_plain(os.path.join(path, TRAINER_STATE_FILE)))
        return self.global_steps

    def _relog_saved_step(self) -> None:
        """After a resume: log the checkpointed step's metrics if the metrics file lacks them (the
        previous run was killed between its save and its log line)."""
        saved = getattr(self, "_resumed_step_metrics", None)
        if saved and self.global_steps > 0 and self.tracking.has_logged_step(self.global_steps) is False:
            logger.warning(
                "resume: the metrics of step %d were not in the log; logged now from the checkpoint", self.global_steps
            )
            self.tracking.log(saved, step=self.global_steps)

    # ------------------------------------------------------------------ end of run
    def _finish(self) -> None:
        for cb in self.callbacks:
            cb.on_fit_end(self)
        tr = self.cfg.trainer
        path = getattr(self.tracking, "file_path", None)
        self.tracking.finish()
        if tr.plot and path and os.path.isfile(path):
            from verl.utils.plot import plot_training_curves

            png = plot_training_curves(
                path, os.path.join(os.path.dirname(path), "curves.png"), title=f"{tr.project_name}/{tr.experiment_name}"
            )
            if png:
                logger.info("training curves: %s", png)
                print(f"training curves written to {png}")
