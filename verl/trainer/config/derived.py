"""Values derived from a validated config, computed in one place.

- the per-role batch plan: `ppo_mini_batch_size` counts prompts in the yaml; a worker trains on
  `ppo_mini_batch_size * rollout.n / world_size` sequences per rank per mini-batch, split into
  micro-batches of `ppo_micro_batch_size_per_gpu` sequences or, with `use_dynamic_bsz`, by a
  token budget of `ppo_max_token_len_per_gpu` per forward (docs/batch_sizes.md). `role_batch_plan`
  owns the divisibility rules and their messages; config validation and the workers both call it;
- `loss_scale_factor`'s default (Dr.GRPO's constant divisor: the response length limit);
- the number of training steps.

`RoleBatchPlan`, `role_batch_plan`, `default_loss_scale_factor` and `WorkerSettings` (what the
trainer hands each worker besides its config section) live in `verl/workers/config/batch_plan.py`,
below the workers, and are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# the worker-facing part lives below the workers; re-exported here (the same objects)
from verl.workers.config.batch_plan import (  # noqa: F401
    RoleBatchPlan,
    WorkerSettings,
    default_loss_scale_factor,
    role_batch_plan,
)


def check_train_batch_split(train_batch_size: int, rollout_n: int, n_workers: int) -> None:
    """`data.train_batch_size * rollout.n` sequences split evenly over the data-parallel workers."""
    seqs = train_batch_size * rollout_n
    if seqs % n_workers:
        raise ValueError(
            f"data.train_batch_size * actor_rollout_ref.rollout.n = {train_batch_size} * {rollout_n} = {seqs} "
            f"sequences cannot be split evenly over {n_workers} data-parallel workers (trainer.nnodes * "
            "trainer.n_gpus_per_node); "
            f"choose a train_batch_size with train_batch_size * n divisible by {n_workers}"
        )


def total_training_steps(trainer_cfg: Any, batches_per_epoch: int) -> int:
    """`trainer.total_training_steps` when set, else `batches_per_epoch * trainer.total_epochs`."""
    if trainer_cfg.total_training_steps is not None:
        return int(trainer_cfg.total_training_steps)
    return int(batches_per_epoch) * int(trainer_cfg.total_epochs)


@dataclass(frozen=True)
class DerivedConfig:
    """Everything derived from a `ValidatedConfig` (see the module docstring). `total_training_steps`
    is None until the training dataloader's length is known."""

    actor: RoleBatchPlan
    critic: RoleBatchPlan | None
    loss_scale_factor: float
    total_training_steps: int | None


def derive(v: Any, batches_per_epoch: int | None = None) -> DerivedConfig:
    """The derived values of a validated config `v` (`ValidatedConfig`), checking the batch-size
    rules; `batches_per_epoch` (the training dataloader's length) fixes the number of steps."""
    data, rollout, tr = v.data, v.rollout, v.trainer
    check_train_batch_split(data.train_batch_size, rollout.n, v.n_workers)
    actor = role_batch_plan("actor_rollout_ref.actor", v.actor, rollout.n, v.n_workers, data.train_batch_size)
    critic = None
    if v.use_critic:
        pool = tr.role_pools.get("critic")
        workers = sum(pool) if pool else v.n_workers
        critic = role_batch_plan("critic", v.critic, rollout.n, workers, data.train_batch_size)
    steps = None if batches_per_epoch is None else total_training_steps(tr, batches_per_epoch)
    return DerivedConfig(
        actor=actor,
        critic=critic,
        loss_scale_factor=default_loss_scale_factor(v.actor, rollout.response_length),
        total_training_steps=steps,
    )
