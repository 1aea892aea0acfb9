"""`AsyncRayPPOTrainer`: the PPO loop with a rollout of its own, kept in sync by a checkpoint engine.

One trainer for every mode that separates the rollout from the actor (`actor_rollout_ref.
hybrid_engine=False`); the modes differ only in `AsyncPlan.lookahead` (`async_plan.py`):

- `trainer.v1.trainer_mode=sync`: lookahead 0. Step t syncs nothing before generating: the
  rollout already holds the weights after step t-1, synced at the end of that step. Same
  computation as the colocated loop, with the rollout in its own process(es).
- `separate_async` (and its preset `verl.experimental.one_step_off_policy.main_ppo`): lookahead
  L >= 1. At the start of step t the generation of batch t+L is submitted (with the weights after
  step t-1, the last synced); step t trains batch t, which was generated with the weights after
  step t-1-L, while batch t+L is being generated. Staleness of batch t: min(t-1, L).

The weight sync after every step is `send_weights` on the actor group and `receive_weights` on
the rollout group at once (one broadcast group, built in `init_workers`), stamped with the step;
its probe check, version reply and every failure name the step and the rollout rank. Generation
requests carry the version they must be generated with (`weights_version`); the rollout returns
the version of every token, from which the staleness metrics come. Calls to each worker group go
through one thread of its own, in the order the driver makes them (generation t+1, then the sync
of step t), so every rank of a group sees the same sequence of calls.
"""

from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import torch

from verl.dataproto.futures import WorkerCallError
from verl.protocol import DataProto
from verl.trainer.config.derived import WorkerSettings
from verl.trainer.ppo.async_plan import AsyncPlan, plan_async
from verl.trainer.ppo.driver_ops import compute_response_mask, dp_compute
from verl.trainer.ppo.metric_utils import reduce_metrics
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, _EndOfData
from verl.trainer.ppo.step_context import StepContext
from verl.trainer.ppo.utils import Role

logger = logging.getLogger(__name__)

__all__ = ["AsyncRayPPOTrainer", "separate_rollout_layout", "trajectory_staleness"]


def trajectory_staleness(versions: torch.Tensor, mask: torch.Tensor, trained_version: int) -> torch.Tensor:
    """[B] staleness of each trajectory: `trained_version` minus the oldest version that sampled
    one of its valid tokens. `versions` / `mask` are [B, R] (`rollout_versions`, `response_mask`);
    a row without valid tokens counts its first column's version."""
    big = torch.iinfo(versions.dtype).max
    oldest = torch.where(mask.bool(), versions, torch.full_like(versions, big)).min(dim=-1).values
    oldest = torch.where(oldest == big, versions[:, 0], oldest)
    return trained_version - oldest


def separate_rollout_layout(plan: AsyncPlan, mapping: dict, pool_spec: dict, role_pool: dict, worker_cls) -> None:
    """Turn the colocated layout into actor + rollout (in place): `Role.ActorRollout` becomes
    `Role.Actor` in its pool, and `Role.Rollout` (`worker_cls`) gets `rollout_pool` of
    `rollout.nnodes x rollout.n_gpus_per_node` processes."""
    mapping[Role.Actor] = mapping.pop(Role.ActorRollout)
    role_pool[Role.Actor] = role_pool.pop(Role.ActorRollout)
    mapping[Role.Rollout] = worker_cls
    pool_spec["rollout_pool"] = [plan.rollout_n_per_node] * plan.rollout_nnodes
    role_pool[Role.Rollout] = "rollout_pool"


class AsyncRayPPOTrainer(RayPPOTrainer):
    """`RayPPOTrainer` with rollout workers of their own (see the module docstring)."""

    separate_rollout_capable = True

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        plan = self.cfg.async_plan or plan_async(config, self.cfg)
        if not plan.separate_rollout:
            raise ValueError(
                "AsyncRayPPOTrainer drives a rollout of its own: set actor_rollout_ref.hybrid_engine=False"
            )
        self.plan = plan
        self.rollout_version = 0  # the weights the rollout holds (0: the initial model)
        self.actor_version = 0  # the weights the actor holds
        self._inflight: deque[tuple[int, DataProto, Future]] = deque()
        # one lane (thread) per worker group: calls reach each group's workers in the order the
        # driver made them (two threads calling one group could reach its ranks in different
        # orders, pairing one rank's batch with another rank's collective)
        self._lanes = {
            role: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"verl-{role}") for role in ("actor", "rollout")
        }

    # ------------------------------------------------------------------ workers
    def _policy_roles(self) -> list[tuple[Role, str, dict]]:
        seed, arr, det = self.cfg.trainer.seed, self.config.actor_rollout_ref, self.cfg.trainer.deterministic
        actor = dict(config=arr, role="actor", settings=WorkerSettings(seed, self.derived.actor, det))
        rollout = dict(config=arr, role="rollout", settings=WorkerSettings(seed, deterministic=det))
        return [(Role.Actor, "actor_rollout", actor), (Role.Rollout, "rollout", rollout)]

    def init_workers(self) -> None:
        super().init_workers()
        self.rollout_wg = self._wg_by_name["rollout"]
        self.rollout_wg.init_model()
        # the broadcast group: actor rank 0 + every rollout rank, built once
        connection = self.actor_rollout_wg.checkpoint_engine_prepare()[0]
        world = 1 + self.rollout_wg.world_size
        self._concurrently(
            "building the checkpoint engine",
            actor=lambda: self.actor_rollout_wg.checkpoint_engine_init(world, connection),
            rollout=lambda: self.rollout_wg.checkpoint_engine_init(world, connection),
        )

    @property
    def generation_wg(self):
        return self.rollout_wg

    def shutdown(self) -> None:
        super().shutdown()
        self._inflight.clear()
        for lane in self._lanes.values():
            lane.shutdown(wait=False, cancel_futures=True)

    def _concurrently(self, what: str, **calls) -> list[Any]:
        """Run worker-group calls (role name -> call) at the same time, e.g. the two sides of a
        collective; the first failure raises at once, naming the role and rank, instead of
        waiting for its peers (a peer of a dead worker would wait for its timeout)."""
        futures = {role: self._lanes[role].submit(call) for role, call in calls.items()}
        done, _ = wait(futures.values(), return_when=FIRST_EXCEPTION)
        for role, fut in futures.items():
            if fut in done and fut.exception() is not None:
                raise self._named(fut.exception(), what, role) from fut.exception()
        return [f.result() for f in futures.values()]

    @staticmethod
    def _named(exc: BaseException, what: str, role: str) -> BaseException:
        if isinstance(exc, WorkerCallError):
            return RuntimeError(f"{what}: the {role} worker (rank {exc.rank}) failed: {exc}")
        return exc

    # ------------------------------------------------------------------ weight sync
    def sync_rollout_weights(self, version: int, metrics: dict) -> None:
        """Send the actor's weights (those after step `version`) to every rollout rank; the
        version advances only when every rank applied the last bucket and passed the probe."""
        sent, received = self._concurrently(
            f"weight sync of step {version}",
            actor=lambda: self.actor_rollout_wg.send_weights(version),
            rollout=lambda: self.rollout_wg.receive_weights(version),
        )
        for rank, reply in enumerate(received):
            if not isinstance(reply, dict) or reply.get("version") != version:
                raise RuntimeError(
                    f"weight sync of step {version}: rollout rank {rank} reported {reply!r} "
                    f"instead of version {version}"
                )
        self.rollout_version = version
        metrics["rollout/weight_sync_max_logp_diff"] = max(r["max_logp_diff"] for r in received)
        metrics["rollout/weight_sync_buckets"] = sent[0]["buckets"]

    def _gen_meta(self, validate: bool) -> dict:
        meta = super()._gen_meta(validate)
        meta["weights_version"] = self.rollout_version
        return meta

    def _begin_fit(self) -> None:
        super()._begin_fit()
        # after a resume the actor holds the restored step's weights; the rollout the initial ones
        self.actor_version = self.global_steps
        if self.rollout_version != self.actor_version:
            self.sync_rollout_weights(self.actor_version, {})

    # ------------------------------------------------------------------ the pipeline
    def collect_batch(self, prompts, ctx: StepContext) -> DataProto | None:
        """Lookahead 0: the base loop's collection. Otherwise keep `lookahead + 1` batches in
        flight (generation of batch t+L is submitted now, with the weights synced last) and return
        batch t, scored."""
        if self.plan.lookahead == 0:
            return super().collect_batch(prompts, ctx)
        step = ctx.step + len(self._inflight)
        while len(self._inflight) < self.plan.lookahead + 1:
            try:
                batch_dict = next(prompts)
            except StopIteration:
                break
            self._inflight.append(self._submit(batch_dict, step))
            step += 1
        if not self._inflight:
            raise _EndOfData
        for_step, batch, future = self._inflight.popleft()
        with ctx.timer("gen"):
            out = self._wait_generation(future, for_step)
        out.meta_info.pop("timing", None)
        ctx.metrics.update(reduce_metrics(out.meta_info.pop("metrics", {}) or {}))
        batch = batch.union(out)
        if "response_mask" not in batch.batch.keys():
            batch.batch["response_mask"] = compute_response_mask(batch)
        batch = self.compute_reward(batch, ctx)
        for cb in self.callbacks:
            cb.on_batch_scored(self, batch, ctx.metrics)
        return batch

    def _submit(self, batch_dict: dict, for_step: int) -> tuple[int, DataProto, Future]:
        """Start generating the batch of step `for_step` (uids as the loop gives them)."""
        batch = DataProto.from_single_dict(batch_dict)
        batch.non_tensor_batch["uid"] = np.array([f"{for_step}-0-{i}" for i in range(len(batch))], dtype=object)
        batch = batch.repeat(repeat_times=self.cfg.rollout.n, interleave=True)
        gen_in = self._generation_input(batch, validate=False)
        gen_in.meta_info["global_steps"] = for_step
        return for_step, batch, self._lanes["rollout"].submit(dp_compute, self.rollout_wg, "generate_sequences", gen_in)

    def _wait_generation(self, future: Future, for_step: int) -> DataProto:
        try:
            return future.result()
        except Exception as exc:
            raise self._named(exc, f"generation of the batch of step {for_step}", "rollout") from exc

    # ------------------------------------------------------------------ one step
    def train_step(self, batch: DataProto, ctx: StepContext) -> DataProto:
        """Staleness metrics of the batch, the base step, then the weight sync."""
        self._staleness_metrics(batch, ctx.metrics)
        batch = super().train_step(batch, ctx)
        self.actor_version = ctx.step
        with ctx.timer("update_weights"):
            self.sync_rollout_weights(self.actor_version, ctx.metrics)
        return batch

    def _staleness_metrics(self, batch: DataProto, metrics: dict) -> None:
        versions = batch.batch["rollout_versions"]
        stale = trajectory_staleness(versions, batch.batch["response_mask"], self.actor_version).float()
        metrics["training/off_policy/trajectory_staleness/mean"] = stale.mean().item()
        metrics["training/off_policy/trajectory_staleness/max"] = stale.max().item()
        metrics["training/off_policy/trajectory_staleness/min"] = stale.min().item()
        # the whole-batch pipeline generates within the bound by construction (async_plan)
        metrics["training/off_policy/evicted_samples"] = 0
        if stale.max().item() > self.plan.max_staleness:
            raise RuntimeError(
                f"step {self.global_steps}: a trajectory of staleness {int(stale.max())} exceeds the bound "
                f"{self.plan.max_staleness} (trainer.v1.sampler.max_off_policy_threshold - 1)"
            )
