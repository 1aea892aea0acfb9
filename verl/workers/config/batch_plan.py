"""What a worker needs of the trainer's derived values, below the workers so that they do not
import the trainer's config layer (`verl/trainer/config/derived.py` computes and re-exports these):

- `RoleBatchPlan` / `role_batch_plan`: how one trained role splits a training batch, with the
  divisibility rules of docs/batch_sizes.md and their messages (config validation and the workers
  both call it);
- `default_loss_scale_factor`: Dr.GRPO's constant divisor (the response length limit) by default;
- `WorkerSettings`: what the trainer hands each worker besides its config section (typed fields
  instead of environment variables): the seed of its sampling stream and its batch plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RoleBatchPlan", "WorkerSettings", "default_loss_scale_factor", "role_batch_plan"]


@dataclass(frozen=True)
class RoleBatchPlan:
    """How one trained role (`actor_rollout_ref.actor` or `critic`) splits a training batch.

    `per_rank_mini_batch`: sequences per rank per optimizer step (what the role's config holds as
    `ppo_mini_batch_size` inside the worker); `micro_batch_per_rank`: sequences per forward
    (None with `use_dynamic_bsz`, where `max_token_len_per_rank` tokens bound a forward);
    `n_mini_batches`: optimizer steps per epoch over one training batch (None when the training
    batch size is not known, e.g. a worker built by hand).
    """

    owner: str
    mini_batch_prompts: int
    rollout_n: int
    world_size: int
    per_rank_mini_batch: int
    use_dynamic_bsz: bool
    micro_batch_per_rank: int | None
    max_token_len_per_rank: int | None
    n_mini_batches: int | None

    @property
    def mini_batch_sequences(self) -> int:
        return self.mini_batch_prompts * self.rollout_n


def role_batch_plan(
    owner: str,
    role_cfg: Any,
    rollout_n: int,
    world_size: int,
    train_batch_size: int | None = None,
) -> RoleBatchPlan:
    """The batch plan of one role, checking the rules of docs/batch_sizes.md with the numbers in
    every message.

    `role_cfg` is the role's config (`ActorConfig` / `CriticConfig`) with `ppo_mini_batch_size`
    still in prompts. With `train_batch_size`: the mini-batch must not exceed it and must divide
    it (equal-sized optimizer steps). Always: `ppo_mini_batch_size * rollout.n` splits over
    `world_size` ranks and, without dynamic batch sizes, `ppo_micro_batch_size_per_gpu` is set and
    divides the per-rank mini-batch.
    """
    mini = int(role_cfg.ppo_mini_batch_size)
    n = int(rollout_n)
    micro = role_cfg.ppo_micro_batch_size_per_gpu
    dynamic = bool(role_cfg.use_dynamic_bsz)
    if train_batch_size is not None:
        if mini > train_batch_size:
            raise ValueError(
                f"{owner}.ppo_mini_batch_size={mini} is larger than data.train_batch_size={train_batch_size} "
                "(both count prompts); use at most the train batch size"
            )
        if train_batch_size % mini:
            raise ValueError(
                f"data.train_batch_size={train_batch_size} is not a multiple of {owner}.ppo_mini_batch_size={mini} "
                f"(both count prompts): the last mini-batch would hold {train_batch_size % mini} prompts; "
                f"use a divisor of {train_batch_size}"
            )
    mini_seqs = mini * n
    if mini_seqs % world_size:
        raise ValueError(
            f"{owner}.ppo_mini_batch_size * rollout.n = {mini} * {n} = {mini_seqs} sequences cannot be split over "
            f"{world_size} data-parallel workers; make it a multiple of {world_size}"
        )
    per_rank = mini_seqs // world_size
    if not dynamic and micro is None:
        raise ValueError(
            f"{owner}.ppo_micro_batch_size_per_gpu is null and {owner}.use_dynamic_bsz=False: set one of them"
        )
    if not dynamic and per_rank % micro:
        raise ValueError(
            f"{owner}.ppo_micro_batch_size_per_gpu={micro} does not divide the per-worker mini-batch "
            f"ppo_mini_batch_size * rollout.n / workers = {mini} * {n} / {world_size} = {per_rank} sequences; "
            f"use a divisor of {per_rank} (or use_dynamic_bsz=True)"
        )
    return RoleBatchPlan(
        owner=owner,
        mini_batch_prompts=mini,
        rollout_n=n,
        world_size=int(world_size),
        per_rank_mini_batch=per_rank,
        use_dynamic_bsz=dynamic,
        micro_batch_per_rank=None if dynamic else int(micro),
        max_token_len_per_rank=int(role_cfg.ppo_max_token_len_per_gpu) if dynamic else None,
        n_mini_batches=None if train_batch_size is None else train_batch_size // mini,
    )


def default_loss_scale_factor(actor_cfg: Any, response_length: int) -> float:
    """`actor.loss_scale_factor`, or by default the response length limit (Dr.GRPO's constant
    divisor: never a micro-batch's own width, which would make the loss depend on the split)."""
    value = actor_cfg.loss_scale_factor
    return float(response_length) if value is None else float(value)


@dataclass(frozen=True)
class WorkerSettings:
    """What the trainer hands a worker besides its config section.

    `seed`: the base of the worker's sampling stream (rank r uses `seed + r`; `trainer.seed`);
    `batch_plan`: the role's batch plan (the worker checks it against its own world size);
    `deterministic`: torch's deterministic algorithms in the worker (`trainer.deterministic`).
    """

    seed: int
    batch_plan: RoleBatchPlan | None = None
    deterministic: bool = True
