"""What a run's asynchronous settings mean, checked before Ray starts: `AsyncPlan`.

Reads `actor_rollout_ref.hybrid_engine`, `actor_rollout_ref.rollout.{nnodes, n_gpus_per_node,
checkpoint_engine}` and `trainer.v1.*` (see `verl/trainer/config/trainer_v1.py`, docs/async.md):

- `separate_rollout`: the rollout has workers of its own (`hybrid_engine=False`), in a pool of
  `rollout.nnodes x rollout.n_gpus_per_node` processes, fed by the checkpoint engine `backend`;
- `lookahead`: how many batches generation runs ahead of training. Batch t is generated with the
  weights after step t - 1 - lookahead, so a trained batch's staleness (versions between the
  weights that sampled it and the weights it is trained from) is min(t - 1, lookahead).
  `sync`: 0. `separate_async`: `num_warmup_batches`, within the staleness bound
  `sampler.max_off_policy_threshold - 1`.

Every refusal names the keys and their values.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["AsyncPlan", "plan_async"]


@dataclass(frozen=True)
class AsyncPlan:
    mode: str = "sync"
    separate_rollout: bool = False
    rollout_nnodes: int = 0
    rollout_n_per_node: int = 0
    backend: str = "naive"
    lookahead: int = 0
    max_staleness: int = 0
    strategy: str = "drop"

    @property
    def rollout_world_size(self) -> int:
        return self.rollout_nnodes * self.rollout_n_per_node


def _hybrid_engine(cfg: Any) -> bool:
    arr = cfg.get("actor_rollout_ref") or {}
    value = arr.get("hybrid_engine", True)
    if not isinstance(value, bool):
        raise ValueError(f"actor_rollout_ref.hybrid_engine={value!r} must be true or false")
    return value


def plan_async(cfg: Any, v) -> AsyncPlan:
    """The plan of the raw config `cfg` and its validated view `v` (`ValidatedConfig`)."""
    hybrid = _hybrid_engine(cfg)
    v1 = v.trainer.v1
    mode = v1.trainer_mode
    if mode == "colocate_async":  # also refused by the upstream-surface rule, named the same way
        raise ValueError(
            "trainer.v1.trainer_mode=colocate_async: the colocated asynchronous trainer is not available in this "
            "verl (available: sync, separate_async)"
        )
    if mode == "separate_async" and hybrid:
        raise ValueError(
            "trainer.v1.trainer_mode=separate_async needs a rollout with workers of its own: set "
            "actor_rollout_ref.hybrid_engine=False (got True) and actor_rollout_ref.rollout.nnodes / n_gpus_per_node"
        )
    if hybrid:
        return AsyncPlan(mode=mode)
    ro = v.rollout
    if ro.nnodes * ro.n_gpus_per_node <= 0:
        raise ValueError(
            f"actor_rollout_ref.hybrid_engine=False needs a rollout pool of at least one process: "
            f"actor_rollout_ref.rollout.nnodes={ro.nnodes} x actor_rollout_ref.rollout.n_gpus_per_node="
            f"{ro.n_gpus_per_node} is {ro.nnodes * ro.n_gpus_per_node} (upstream's one-step-off / fully-async "
            "configs set the top-level rollout.nnodes / rollout.n_gpus_per_node)"
        )
    if v.trainer.role_pools and "rollout" in v.trainer.role_pools:
        raise ValueError(
            "trainer.role_pools.rollout: the rollout pool is actor_rollout_ref.rollout.nnodes x n_gpus_per_node"
        )
    backend = _checked_backend(ro.checkpoint_engine, v.trainer.device)
    lookahead, bound = 0, v1.sampler.max_off_policy_threshold - 1
    if mode == "separate_async":
        _check_sync_step(v)
        lookahead = _bounded_lookahead(v1)
        if lookahead:
            _check_ahead(v, lookahead)
    return AsyncPlan(
        mode=mode,
        separate_rollout=True,
        rollout_nnodes=ro.nnodes,
        rollout_n_per_node=ro.n_gpus_per_node,
        backend=backend,
        lookahead=lookahead,
        max_staleness=bound if mode == "separate_async" else 0,
        strategy=v1.sampler.max_off_policy_strategy,
    )


def _checked_backend(ce, device: str) -> str:
    from verl.checkpoint_engine import resolve_backend
    from verl.utils.device import resolve_device
    from verl.utils.import_utils import import_external_libs

    if ce.custom_backend_module:
        try:
            import_external_libs([ce.custom_backend_module])
        except (ImportError, FileNotFoundError) as exc:
            raise type(exc)(
                f"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module={ce.custom_backend_module!r}: {exc}"
            ) from exc
    resolved = resolve_backend(ce.backend, resolve_device(device))
    from verl.checkpoint_engine.broadcast import ENGINE_KWARGS

    for name, kwargs in dict(ce.engine_kwargs or {}).items():
        unknown = sorted(set(dict(kwargs or {})) - set(ENGINE_KWARGS)) if name in ("gloo", "nccl") else []
        if unknown:
            raise ValueError(
                f"actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.{name}: {unknown} are not read by the "
                f"{name} engine; accepted: {sorted(ENGINE_KWARGS)}"
            )
    return resolved


def _check_sync_step(v) -> None:
    """Upstream's rule: one step trains `parameter_sync_step` mini-batches, then syncs."""
    tbs, mini = v.data.train_batch_size, v.actor.ppo_mini_batch_size
    step = v.trainer.v1.separate_async.parameter_sync_step
    if tbs != step * mini:
        raise ValueError(
            f"trainer.v1.trainer_mode=separate_async: data.train_batch_size={tbs} must equal "
            f"trainer.v1.separate_async.parameter_sync_step={step} x "
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} (= {step * mini})"
        )


def _bounded_lookahead(v1) -> int:
    """`num_warmup_batches` within the staleness bound: `wait` generates later instead, `drop`
    refuses a pipeline whose every batch would be evicted."""
    warmup = v1.separate_async.num_warmup_batches
    threshold = v1.sampler.max_off_policy_threshold
    if warmup <= threshold - 1:
        return warmup
    if v1.sampler.max_off_policy_strategy == "wait":
        logger.warning(
            "trainer.v1.separate_async.num_warmup_batches=%d is beyond the staleness bound of "
            "max_off_policy_threshold=%d (wait): generation runs %d batch(es) ahead",
            warmup,
            threshold,
            threshold - 1,
        )
        return threshold - 1
    raise ValueError(
        f"trainer.v1.separate_async.num_warmup_batches={warmup} generates every batch {warmup} version(s) behind, "
        f"beyond trainer.v1.sampler.max_off_policy_threshold={threshold} (a trajectory may span at most "
        f"{threshold} versions, staleness {threshold - 1}): with max_off_policy_strategy=drop every batch from step "
        f"{threshold + 1} on would be evicted. Use max_off_policy_strategy=wait, "
        f"num_warmup_batches <= {threshold - 1}, or a larger threshold"
    )


def _check_ahead(v, lookahead: int) -> None:
    """What the pipeline cannot do yet with batches generated ahead, refused by name."""
    from verl.trainer.ppo import core_algos

    ahead = f"with batches generated ahead (trainer.v1.separate_async.num_warmup_batches={lookahead})"
    fallback = "(available: trainer.v1.trainer_mode=sync)"
    if v.algorithm.filter_groups.enable:
        raise ValueError(
            f"algorithm.filter_groups.enable=True {ahead}: dynamic sampling in the asynchronous pipeline is not "
            f"available in this verl {fallback}"
        )
    estimator = v.algorithm.adv_estimator
    if core_algos.get_adv_estimator_traits(estimator).needs_greedy_baseline:
        raise ValueError(
            f"algorithm.adv_estimator={estimator} {ahead}: a greedy baseline generated with each batch is not "
            f"available in this verl {fallback}"
        )
    if v.trainer.save_freq > 0:
        raise ValueError(
            f"trainer.save_freq={v.trainer.save_freq} {ahead}: checkpoints that record batches in flight are not "
            f"available in this verl (available: trainer.save_freq=-1, or trainer.v1.trainer_mode=sync)"
        )
