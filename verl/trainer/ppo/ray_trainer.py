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
(`generate(batch, ctx)`, `compute_reward(batch, ctx)`, `filter_groups(batch, ctx)`,
`compute_old_log_prob(batch, ctx)`, ...; `ctx` is the step's `StepContext`), or pass
`TrainerCallback`s (also from `trainer.callbacks` in the config). Beside the loop:
`driver_ops` (batch operations), `validation.Validator`, `checkpoint.TrainerCheckpointer`,
`dataloaders`, `worker_groups`; the derived config values come from `verl/trainer/config/derived.py`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import resource
import time
from collections.abc import Iterator
from functools import cached_property
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf, open_dict

from verl.protocol import DataProto
from verl.trainer.config.derived import DerivedConfig, WorkerSettings, derive, total_training_steps
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.callbacks import TrainerCallback
from verl.trainer.ppo.checkpoint import TrainerCheckpointer, restore_trainer_state, seed_driver, trainer_state
from verl.trainer.ppo.core_algos import AdvantageEstimator  # noqa: F401 - upstream users import it from here
from verl.trainer.ppo.dataloaders import build_dataloaders
from verl.trainer.ppo.driver_ops import (  # noqa: F401 - upstream users import these names from here
    apply_kl_penalty,
    compute_advantage,
    compute_response_mask,
    concat_generated,
    decode_rows,
    dp_compute,
    dump_rows,
    generation_input,
    left_pad_prompts,
    select_groups_with_variance,
    trim_left_padding,
    trim_to_whole_groups,
)
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_mfu_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    compute_variance_proxy_metrics,
    count_model_params,
    peak_flops_per_worker,
    reduce_metrics,
)
from verl.trainer.ppo.reward import compute_reward, reward_component_metrics
from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode
from verl.trainer.ppo.step_context import StepContext
from verl.trainer.ppo.utils import Role, ValidatedConfig, reference_in_actor, validated_config
from verl.trainer.ppo.validation import Validator
from verl.trainer.ppo.worker_groups import ResourcePoolManager, spawn_worker_groups, worker_env
from verl.utils.py_functional import config_get
from verl.utils.torch_functional import masked_mean
from verl.workers.reward_manager.registry import load_object

logger = logging.getLogger(__name__)

__all__ = [
    "RayPPOTrainer",
    "ResourcePoolManager",
    "Role",
    "StepContext",
    "TrainerCallback",
    "apply_kl_penalty",
    "compute_advantage",
    "compute_response_mask",
]


# ============================================================================ hooks
class _EndOfData(Exception):
    """The training data (all epochs) is exhausted."""


# ============================================================================ the trainer
class RayPPOTrainer:
    """Driver of PPO-family training over Ray worker groups (see the module docstring).

    `separate_rollout_capable`: subclasses that drive a rollout with workers of its own
    (`actor_rollout_ref.hybrid_engine=False`, `async_trainer.AsyncRayPPOTrainer`) set it.

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

    separate_rollout_capable = False

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
        self.cfg: ValidatedConfig = validated_config(config)  # run_ppo's object when it built this trainer
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
        if not self.hybrid_engine and not self.separate_rollout_capable:
            raise ValueError(
                f"actor_rollout_ref.hybrid_engine=False: {type(self).__name__} runs the rollout in the actor's "
                "processes; a rollout with workers of its own is driven by "
                "verl.trainer.ppo.async_trainer.AsyncRayPPOTrainer (main_ppo picks it)"
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

        # the run ends after this step as if it were the last (validated, saved) although the
        # schedules still follow total_training_steps: `verl.trainer.replay` re-runs one step
        self.stop_after_step: int | None = None
        self.callbacks: list[TrainerCallback] = list(callbacks or [])
        for spec in self.cfg.trainer.callbacks:
            self.callbacks.append(load_object(str(spec), what="trainer.callbacks entry")())
        if self.cfg.trainer.health.enable:  # last: the other callbacks keep their checkpoint positions
            from verl.trainer.ppo.health_callback import HealthCallback

            self.callbacks.append(HealthCallback(self.cfg.trainer.health, tokenizer))

        self.global_steps = 0
        self.epoch = 0
        # the driver's generators (restored from a checkpoint on resume)
        seed_driver(self.cfg.trainer.seed)
        self._create_dataloader(train_dataset, val_dataset, collate_fn, train_sampler)

    # ------------------------------------------------------------------ data
    def _create_dataloader(self, train_dataset, val_dataset, collate_fn, train_sampler) -> None:
        """Build the stateful train dataloader and the validation dataloader; fix the number of
        training steps and write it into the optimizers' schedule configs."""
        loaders = build_dataloaders(
            self.cfg.data,
            self.config.data,
            self.tokenizer,
            self.processor,
            train_dataset,
            val_dataset,
            collate_fn,
            train_sampler,
        )
        self.train_dataset, self.val_dataset = loaders.train_dataset, loaders.val_dataset
        self.train_dataloader, self.val_dataloader = loaders.train_dataloader, loaders.val_dataloader
        derived = self.cfg.derived if self.cfg.derived is not None else derive(self.cfg)
        total = total_training_steps(self.cfg.trainer, len(self.train_dataloader))
        self.derived: DerivedConfig = dataclasses.replace(derived, total_training_steps=total)
        self.total_training_steps = total
        # upstream's workers (and user code) read the schedule length from the config
        with open_dict(self.config):
            self.config.actor_rollout_ref.actor.optim.total_training_steps = total
            if self.use_critic:
                self.config.critic.optim.total_training_steps = total

    # ------------------------------------------------------------------ workers
    def init_workers(self) -> None:
        """Create the resource pools and worker groups (colocated per pool) and build the models."""
        seed, arr, det = self.cfg.trainer.seed, self.config.actor_rollout_ref, self.cfg.trainer.deterministic
        roles = self._policy_roles()
        if self.use_critic:
            critic = dict(config=self.config.critic, settings=WorkerSettings(seed, self.derived.critic, det))
            roles.append((Role.Critic, "critic", critic))
        if self.use_reference_policy and not self.ref_in_actor:
            ref = dict(config=arr, role="ref", settings=WorkerSettings(seed, deterministic=det))
            roles.append((Role.RefPolicy, "ref", ref))
        if self.use_rm:
            roles.append((Role.RewardModel, "rm", dict(config=self.config.reward_model)))
        self._worker_groups, all_wg = spawn_worker_groups(
            self.resource_pool_manager,
            self.role_worker_mapping,
            self.ray_worker_group_cls,
            roles,
            self._worker_env(),
            self.cfg.trainer.torch_threads_per_worker,
        )
        if self.use_critic:
            self.critic_wg = all_wg["critic"]
            self.critic_wg.init_model()
        if self.use_reference_policy and not self.ref_in_actor:
            self.ref_policy_wg = all_wg["ref"]
            self.ref_policy_wg.init_model()
        if self.use_rm:
            self.rm_wg = all_wg["rm"]
            self.rm_wg.init_model()
        self._wg_by_name = all_wg
        # the actor last: a GPU rollout engine sizes its cache from the memory left
        self.actor_rollout_wg = all_wg["actor_rollout"]
        self.actor_rollout_wg.init_model()
        if self.ref_in_actor:
            self.ref_policy_wg = self.actor_rollout_wg

    def _policy_roles(self) -> list[tuple[Role, str, dict]]:
        """(role, name, worker init kwargs) of the policy workers: one colocated actor + rollout
        (+ reference) role here; the worker group named `actor_rollout` trains."""
        seed, arr, det = self.cfg.trainer.seed, self.config.actor_rollout_ref, self.cfg.trainer.deterministic
        actor = dict(config=arr, role="actor_rollout", settings=WorkerSettings(seed, self.derived.actor, det))
        return [(Role.ActorRollout, "actor_rollout", actor)]

    @property
    def generation_wg(self):
        """The worker group that generates (training rollouts, validation, greedy baselines)."""
        return self.actor_rollout_wg

    def shutdown(self) -> None:
        """Stop the worker processes and free their Ray resources (a Ray session can then host
        another run, e.g. in tests or a notebook)."""
        for wg in getattr(self, "_worker_groups", []):
            wg.kill_workers()
        self._worker_groups = []
        self.resource_pool_manager.release()

    def _worker_env(self) -> dict[str, str]:
        return worker_env(self.config, self.device_name)

    @property
    def dp_size(self) -> int:
        return self.actor_rollout_wg.world_size

    # ------------------------------------------------------------------ components
    @cached_property
    def validator(self) -> Validator:
        """When to validate and the validation pass (created on first use)."""
        return Validator(self)

    @cached_property
    def checkpointer(self) -> TrainerCheckpointer:
        """When to save, save and resume (created on first use)."""
        return TrainerCheckpointer(self)

    # ------------------------------------------------------------------ phases (hooks for subclasses)
    def prepare_batch(self, batch_dict: dict, round_idx: int) -> DataProto:
        """A dataloader batch as DataProto with a deterministic `uid` per prompt."""
        batch = DataProto.from_single_dict(batch_dict)
        batch.non_tensor_batch["uid"] = np.array(
            [f"{self.global_steps}-{round_idx}-{i}" for i in range(len(batch))], dtype=object
        )
        return batch

    def generate(self, batch: DataProto, ctx: StepContext) -> DataProto:
        """Repeat every prompt `rollout.n` times (interleaved) and append the generated responses."""
        n = self.cfg.rollout.n
        batch = batch.repeat(repeat_times=n, interleave=True)
        gen_in = self._generation_input(batch, validate=False)
        with ctx.timer("gen"):
            out = dp_compute(self.generation_wg, "generate_sequences", gen_in)
        out.meta_info.pop("timing", None)
        ctx.metrics.update(reduce_metrics(out.meta_info.pop("metrics", {}) or {}))
        batch = batch.union(out)
        if "response_mask" not in batch.batch.keys():
            batch.batch["response_mask"] = compute_response_mask(batch)
        if core_algos.get_adv_estimator_traits(self.cfg.algorithm.adv_estimator).needs_greedy_baseline:
            with ctx.timer("gen_max"):
                batch = self.greedy_baseline(batch, gen_in)
        return batch

    def _generation_input(self, batch: DataProto, validate: bool) -> DataProto:
        """The rollout input popped from `batch`, for training or (`validate`) validation."""
        return generation_input(batch, self._gen_meta(validate))

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

    def greedy_baseline(self, batch: DataProto, gen_in: DataProto) -> DataProto:
        """For estimators registered with `needs_greedy_baseline` (ReMax): the reward of one greedy
        response per prompt, as `reward_baselines` [B] (each prompt's value on its n rows)."""
        n = self.cfg.rollout.n
        first = gen_in.select_idxs(np.arange(0, len(gen_in), n))
        first.meta_info["do_sample"] = False
        greedy = dp_compute(self.generation_wg, "generate_sequences", first)
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

    def compute_reward(self, batch: DataProto, ctx: StepContext) -> DataProto:
        """`token_level_scores` [B, R] (reward model and/or reward manager) + extra info columns."""
        with ctx.timer("reward"):
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
        metrics = ctx.metrics
        for column, name in (
            ("score_error", "reward/score_errors"),
            ("score_timeout", "reward/score_timeouts"),
            ("math_verify_fallback", "reward/math_verify_fallbacks"),
        ):
            flags = extra.get(column)
            metrics[name] = metrics.get(name, 0) + (int(sum(bool(e) for e in flags)) if flags else 0)
        metrics.update(reward_component_metrics(self.reward_fn, extra))
        return batch

    def filter_groups(self, batch: DataProto, ctx: StepContext) -> DataProto:
        """DAPO dynamic sampling: keep only groups (same uid) whose `filter_groups.metric` varies."""
        kept, n_kept, n_dropped = select_groups_with_variance(batch, self.cfg.algorithm.filter_groups.metric)
        kept.meta_info.pop("reward_extra_keys", None)  # rounds are concatenated: their meta_info must agree
        metrics = ctx.metrics
        metrics["filter_groups/kept_groups"] = metrics.get("filter_groups/kept_groups", 0) + n_kept
        metrics["filter_groups/dropped_groups"] = metrics.get("filter_groups/dropped_groups", 0) + n_dropped
        return kept

    def collect_batch(self, prompts: Iterator[dict], ctx: StepContext) -> DataProto | None:
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
            batch = self.generate(batch, ctx)
            batch = self.compute_reward(batch, ctx)
            for cb in self.callbacks:
                cb.on_batch_scored(self, batch, ctx.metrics)
            if not fg.enable:
                return batch
            if rounds == 1:
                # score metrics of the unfiltered first round: what the policy actually does
                ctx.metrics["filter_groups/raw_score_mean"] = batch.batch["token_level_scores"].sum(-1).mean().item()
            batch = self.filter_groups(batch, ctx)
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
        ctx.metrics["filter_groups/num_gen_batches"] = rounds
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
        return bool(self.cfg.algorithm.rollout_correction.bypass_mode)

    def compute_old_log_prob(self, batch: DataProto, ctx: StepContext) -> DataProto:
        if self.bypass_mode():
            # upstream's bypass mode: no learner recomputation (two policies instead of three); the
            # actor's bypass_mode loss corrects against the current policy
            apply_bypass_mode(batch, self.cfg.algorithm.rollout_correction)
            return batch
        if self.can_skip_old_log_prob():
            batch.meta_info["use_current_as_old_log_prob"] = True
            return batch
        with ctx.timer("old_log_prob"):
            out = dp_compute(self.actor_rollout_wg, "compute_log_prob", batch)
            if "entropys" in out.batch.keys():
                ent = out.batch.pop("entropys")
                ctx.metrics["actor/entropy"] = masked_mean(ent, batch.batch["response_mask"]).item()
            ctx.metrics.update(reduce_metrics(out.meta_info.pop("metrics", {}) or {}))
            return batch.union(out)

    def compute_ref_log_prob(self, batch: DataProto, ctx: StepContext) -> DataProto:
        with ctx.timer("ref"):
            return batch.union(dp_compute(self.ref_policy_wg, "compute_ref_log_prob", batch))

    def compute_values(self, batch: DataProto, ctx: StepContext) -> DataProto:
        with ctx.timer("values"):
            return batch.union(dp_compute(self.critic_wg, "compute_values", batch))

    def compute_advantages(self, batch: DataProto, ctx: StepContext) -> DataProto:
        algo = self.cfg.algorithm
        with ctx.timer("adv"):
            if algo.use_kl_in_reward:
                batch, kl_metrics = apply_kl_penalty(batch, self.kl_ctrl_in_reward, kl_penalty=algo.kl_penalty)
                ctx.metrics.update(kl_metrics)
            else:
                batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            # through this module's global: patching `ray_trainer.compute_advantage` takes effect
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

    def update_critic(self, batch: DataProto, ctx: StepContext) -> None:
        with ctx.timer("update_critic"):
            out = self.critic_wg.update_critic(batch)
        ctx.metrics.update(reduce_metrics(out.meta_info.get("metrics", {})))

    def update_actor(self, batch: DataProto, ctx: StepContext) -> None:
        rc = self.cfg.algorithm.rollout_correction
        if rc.rollout_is is not None or rc.rollout_rs is not None or self.bypass_mode():
            batch.meta_info["rollout_correction"] = rc.to_dict()
        with ctx.timer("update_actor"):
            out = self.actor_rollout_wg.update_actor(batch)
        ctx.metrics.update(reduce_metrics(out.meta_info.get("metrics", {})))
        if out.batch is not None and "entropys" in out.batch.keys() and "actor/entropy" not in ctx.metrics:
            # the on-policy shortcut: the update's own forward gives the policy entropy
            ctx.metrics["actor/entropy"] = masked_mean(out.batch["entropys"], batch.batch["response_mask"]).item()

    def train_step(self, batch: DataProto, ctx: StepContext) -> DataProto:
        """Steps 5-7 of the loop on a scored batch (modifies and returns `batch`)."""
        if self.cfg.trainer.balance_batch:
            self._balance_batch(batch, ctx.metrics)
        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
        batch.meta_info["global_steps"] = self.global_steps
        batch = self.compute_old_log_prob(batch, ctx)
        if self.use_reference_policy:
            batch = self.compute_ref_log_prob(batch, ctx)
        if self.use_critic:
            batch = self.compute_values(batch, ctx)
        batch = self.compute_advantages(batch, ctx)
        for cb in self.callbacks:
            cb.on_advantages(self, batch, ctx.metrics)
        if self.use_critic:
            self.update_critic(batch, ctx)
        if self.global_steps > self.cfg.trainer.critic_warmup:
            self.update_actor(batch, ctx)
        return batch

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """Train for `total_training_steps` steps; returns the last validation metrics."""
        from tqdm import tqdm

        self._begin_fit()
        tr = self.cfg.trainer
        last_val: dict[str, float] = {}
        if self.validator.should_validate_before_training(self.global_steps):
            last_val = self._validate()
            self.tracking.log(last_val, step=self.global_steps)
        if tr.val_only:  # validates the restored (or initial) policy and never trains
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
        resumed = self.global_steps if self.global_steps > 0 else None
        self.validator.validated_step = self.checkpointer.saved_step = resumed
        while self.global_steps < self.total_training_steps:
            ctx = self._next_step()
            try:
                with ctx.timer("step"):
                    batch = self.collect_batch(prompts, ctx)
                    if batch is not None:
                        self.train_step(batch, ctx)
            except _EndOfData:
                self.global_steps -= 1
                logger.warning("training data exhausted after %d steps", self.global_steps)
                break
            if batch is None:
                logger.warning("step %d: no group with reward variance; the update was skipped", self.global_steps)
                ctx.metrics["train/skipped_step"] = 1
            last_val = self._end_of_step(batch, ctx) or last_val
            bar.update(1)
            if ctx.is_last:
                break
        bar.close()
        # a run that ended early (data exhausted, skipped last step) still ends validated and saved
        if self.validator.should_validate(self.global_steps, is_last=True):
            last_val = self._validate()
            self.validator.validated_step = self.global_steps
            self.tracking.log(last_val, step=self.global_steps)
        if self.checkpointer.should_save(self.global_steps, is_last=True):
            self._save_checkpoint()
            self.checkpointer.saved_step = self.global_steps
        self._finish()
        return last_val

    def _begin_fit(self) -> None:
        """Loggers, the MFU inputs, the resume and the callbacks' start, before the first step."""
        from verl.utils.tracking import Tracking

        tr = self.cfg.trainer
        self.tracking = Tracking(
            project_name=tr.project_name,
            experiment_name=tr.experiment_name,
            default_backend=tr.logger,
            config=OmegaConf.to_container(self.config, resolve=True),
            log_dir=tr.log_dir,
        )
        # for the MFU estimate (perf/mfu/*): the policy's size and one worker's peak FLOP/s
        self._n_params = count_model_params(self.config.actor_rollout_ref.model.path, self.cfg.model.trust_remote_code)
        self._peak_flops = tr.peak_flops_per_worker or peak_flops_per_worker(self.device_name)
        # restore last: nothing may draw from the restored random generators before the next step
        self._load_checkpoint()
        self.checkpointer.relog_saved_step()
        for cb in self.callbacks:
            cb.on_fit_start(self)

    def _next_step(self) -> StepContext:
        """Advance the step counter; the step that starts after `trainer.time_budget_s` is spent
        is the last one (validated, saved)."""
        self.global_steps += 1
        budget = self.cfg.trainer.time_budget_s
        is_last = (
            self.global_steps >= self.total_training_steps
            or (budget is not None and time.monotonic() - self._t_start >= budget)
            or (self.stop_after_step is not None and self.global_steps >= self.stop_after_step)
        )
        return StepContext(step=self.global_steps, is_last=is_last)

    def _end_of_step(self, batch: DataProto | None, ctx: StepContext) -> dict | None:
        """Validation, metrics, rollout dump, checkpoint and logging of the step just trained
        (`batch` is None for a skipped step). Returns the validation metrics when it validated."""
        metrics = ctx.metrics
        val = None
        if batch is not None and self.validator.should_validate(ctx.step, ctx.is_last):
            with ctx.timer("testing"):
                val = self._validate()
            self.validator.validated_step = ctx.step
            metrics.update(val)
        if batch is not None:
            metrics.update(self._batch_metrics(batch, ctx))
            self._dump_rollouts(batch)
        else:
            metrics.update({f"timing_s/{k}": v for k, v in ctx.timing.items()})
        metrics["training/global_step"] = self.global_steps
        metrics["training/epoch"] = self.epoch
        metrics["perf/driver_max_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
        metrics["perf/elapsed_s"] = time.monotonic() - self._t_start
        for cb in self.callbacks:
            cb.on_step_end(self, metrics)
        ctx.is_last = ctx.is_last or any(cb.stop_requested() for cb in self.callbacks)
        if self.checkpointer.should_save(ctx.step, ctx.is_last):
            with ctx.timer("save_checkpoint"):
                self._save_checkpoint(metrics)
            self.checkpointer.saved_step = ctx.step
            metrics["timing_s/save_checkpoint"] = ctx.timing["save_checkpoint"]
        self.tracking.log(metrics, step=self.global_steps)
        return val

    def _batch_metrics(self, batch: DataProto, ctx: StepContext) -> dict[str, Any]:
        """Data, timing, throughput and MFU metrics of a trained batch."""
        timing = ctx.timing
        metrics = compute_data_metrics(
            batch,
            use_critic=self.use_critic,
            max_response_length=self.cfg.data.max_response_length,
            max_prompt_length=self.cfg.data.max_prompt_length,
        )
        metrics.update(compute_timing_metrics(batch, timing))
        # only when the batch carries sum_pi_squared (otherwise {})
        metrics.update(compute_variance_proxy_metrics(batch, ctx.metrics.get("actor/grad_norm")))
        n_workers = self.resource_pool_manager.get_n_gpus()
        metrics.update(compute_throughout_metrics(batch, timing, n_gpus=n_workers))
        metrics.update(
            compute_mfu_metrics(
                batch,
                timing,
                self._n_params,
                self._peak_flops,
                n_workers,
                actor_epochs=self.cfg.actor.ppo_epochs,
                critic_epochs=self.cfg.critic.ppo_epochs,
            )
        )
        return metrics

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
        if self.cfg.trainer.rollout_data_dir:
            dump_rows(
                decode_rows(batch, self.tokenizer, self.global_steps),
                self.cfg.trainer.rollout_data_dir,
                self.global_steps,
            )

    # ------------------------------------------------------------------ validation and checkpoints
    def _validate(self) -> dict[str, float]:
        """The validation pass (`Validator.validate`); overridable as upstream's `_validate`."""
        return self.validator.validate()

    def _save_checkpoint(self, metrics: dict | None = None) -> str:
        """Write `global_step_N` (`TrainerCheckpointer.save`); overridable as upstream's."""
        return self.checkpointer.save(metrics)

    def _load_checkpoint(self) -> int:
        """Resume per `trainer.resume_mode` (`TrainerCheckpointer.load`); returns the restored step."""
        return self.checkpointer.load()

    def state_dict(self) -> dict:
        """Driver state saved with every checkpoint (exact resume; `trainer_state.pt`)."""
        return trainer_state(self)

    def load_state_dict(self, state: dict) -> None:
        restore_trainer_state(self, state)

    # ------------------------------------------------------------------ end of run
    def _finish(self) -> None:
        self.checkpointer.finish_pending()  # an asynchronous save is published before the run ends
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
