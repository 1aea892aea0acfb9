"""The reward loop: reward workers that score samples one by one, concurrently.

- `RewardLoopWorker`: holds one reward manager (`reward.reward_manager.*`, see
  `reward_manager/`) and the run's scoring function (`reward.custom_reward_function.*`, else the
  shipped `default_compute_score`); `compute_score(data)` scores one sample,
  `compute_score_batch(data)` every row of `data` concurrently (one asyncio task per row).
- `RewardLoopManager`: starts `reward.num_workers` workers as Ray actors (CPU only, no CPU reserved:
  scoring waits on sleeps, sockets and subprocesses more than it computes) or, without Ray (the
  one-worker `trainer.worker_backend=local`), one worker in this process; splits a batch over
  them and assembles `rm_scores` [B, R] (each score on its response's last generated token) and
  the extra-info columns. It is also the trainer's reward function: `manager(data, return_dict=True)`
  gives `{"reward_tensor", "reward_extra_info"}` like the driver-side reward managers.

Every sample is scored on its own, so the rewards of a batch do not depend on how many workers
score it, nor on whether they run in Ray or in this process.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import numpy as np

from verl.experimental.reward_loop.components import load_components
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase, config_get
from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER, get_reward_manager_cls
from verl.protocol import DataProto
from verl.workers.config.reward_keys import migrate_legacy_reward_keys

logger = logging.getLogger(__name__)

__all__ = [
    "RewardLoopManager",
    "RewardLoopWorker",
    "load_compute_score",
    "migrate_legacy_reward_impl",
    "resolve_reward_manager_cls",
]


def migrate_legacy_reward_impl(config):
    """Upstream's name: the legacy keys (`reward_model.reward_manager`, `reward_model.num_workers`,
    `reward_model.reward_kwargs`, `custom_reward_function.*`, `sandbox_fusion.*`, ...) moved into
    the `reward` section (one deprecation warning), then removed. Returns a new DictConfig."""
    from omegaconf import DictConfig, OmegaConf

    raw = OmegaConf.to_container(config, resolve=False) if isinstance(config, DictConfig) else dict(config)
    migrate_legacy_reward_keys(raw, drop_legacy=True)
    return OmegaConf.create(raw)


def resolve_reward_manager_cls(config: Any) -> type:
    """The reward-loop manager class of `reward.reward_manager` (`source: register` by name in
    the registry, `source: importlib` the class `name` of the file or module `module.path`)."""
    import verl.experimental.reward_loop.reward_manager  # noqa: F401 - registers the shipped managers

    source = config_get(config, "reward.reward_manager.source", "register")
    name = config_get(config, "reward.reward_manager.name", "naive")
    if source == "register":
        return get_reward_manager_cls(name)
    if source == "importlib":
        from verl.workers.reward_manager.registry import load_object

        path = config_get(config, "reward.reward_manager.module.path")
        if not path:
            raise ValueError("reward.reward_manager.source=importlib needs reward.reward_manager.module.path")
        cls = load_object(f"{path}:{name}", what="reward.reward_manager (module.path:name)")
        if not (isinstance(cls, type) and issubclass(cls, RewardManagerBase)):
            raise TypeError(
                f"reward.reward_manager.name={name!r} in {path!r} is not a subclass of "
                "verl.experimental.reward_loop.reward_manager.base.RewardManagerBase"
            )
        return cls
    raise ValueError(
        f"reward.reward_manager.source={source!r} is not allowed; expected one of ['register', 'importlib']"
    )


def uses_reward_loop(config: Any) -> bool:
    """Whether `reward.reward_manager` names a reward-loop manager (a registered one, or an
    importlib class derived from `RewardManagerBase`) rather than a driver-side one
    (`verl.workers.reward_manager`: batch, prime, or a user class of theirs). A name in neither
    registry raises, listing both."""
    import verl.experimental.reward_loop.reward_manager  # noqa: F401 - registers the shipped managers
    from verl.workers.reward_manager import REWARD_MANAGER_REGISTRY, AbstractRewardManager

    source = config_get(config, "reward.reward_manager.source", "register")
    name = config_get(config, "reward.reward_manager.name", "naive")
    if source == "importlib":
        from verl.workers.reward_manager.registry import load_object

        path = config_get(config, "reward.reward_manager.module.path")
        cls = load_object(f"{path}:{name}", what="reward.reward_manager (module.path:name)")
        return not (isinstance(cls, type) and issubclass(cls, AbstractRewardManager))
    if name in REWARD_MANAGER:
        return True
    if name in REWARD_MANAGER_REGISTRY:
        return False
    raise ValueError(
        f"Unknown reward manager: {name}. reward.reward_manager.name={name!r} (legacy spelling "
        f"reward_model.reward_manager) is not registered; reward-loop "
        f"managers: {sorted(REWARD_MANAGER)}, driver-side managers: {sorted(REWARD_MANAGER_REGISTRY)} "
        "(or source=importlib with module.path)"
    )


def load_compute_score(config: Any):
    """The scoring function of `reward.custom_reward_function.{path,name}` with its
    `reward_kwargs` bound, or the weighted `reward.components` (see `components.py`), or None
    (the shipped `default_compute_score`)."""
    from verl.utils.import_utils import load_extern_type

    path = config_get(config, "reward.custom_reward_function.path")
    components = load_components(config_get(config, "reward.components"))
    if components is not None:
        if path:
            raise ValueError(
                f"reward.components and reward.custom_reward_function.path={path!r} are both set: give the "
                "function as one of the components (or unset reward.components)"
            )
        return components
    if not path:
        return None
    name = config_get(config, "reward.custom_reward_function.name", "compute_score")
    try:
        fn = load_extern_type(path, name)
    except (ImportError, FileNotFoundError, AttributeError) as exc:
        raise type(exc)(f"reward.custom_reward_function (path={path!r}, name={name!r}): {exc}") from exc
    if not callable(fn):
        raise TypeError(f"reward.custom_reward_function.name={name!r} in {path!r} is a {type(fn).__name__}")
    kwargs = config_get(config, "reward.custom_reward_function.reward_kwargs", {}) or {}
    return functools.partial(fn, **dict(kwargs)) if kwargs else fn


class RewardLoopWorker:
    """One reward worker (a Ray actor, or a plain object in the driver). See the module docstring.

    Args:
        config: the run's config (its `reward`, `data` and `trainer` sections are read).
        reward_router_address: `host:port` of a served reward model, passed to the scoring
            function (upstream's GenRM contract); None without one.
        tokenizer: the policy's tokenizer; None loads it from `actor_rollout_ref.model.tokenizer_path`
            (or `.path`), as upstream.
    """

    def __init__(self, config: Any, reward_router_address: str | None = None, tokenizer: Any = None):
        from verl.utils.import_utils import import_external_libs

        self.config = config
        self.reward_router_address = reward_router_address
        modules = config_get(config, "trainer.external_modules") or []
        import_external_libs([modules] if isinstance(modules, str) else list(modules))
        if tokenizer is None:
            from verl.utils.tokenizer import hf_tokenizer

            path = config_get(config, "actor_rollout_ref.model.tokenizer_path") or config_get(
                config, "actor_rollout_ref.model.path"
            )
            tokenizer = hf_tokenizer(path)
        self.input_tokenizer = tokenizer
        cls = resolve_reward_manager_cls(config)
        extra = {} if reward_router_address is None else {"reward_router_address": reward_router_address}
        self.reward_manager = cls(config=config, tokenizer=tokenizer, compute_score=load_compute_score(config), **extra)

    async def compute_score(self, data: DataProto) -> dict:
        """Score the last row of `data`: `{"reward_score": float, "reward_extra_info": dict}`."""
        return await self.reward_manager.run_single(data)

    async def compute_score_batch(self, data: DataProto) -> list[dict]:
        """Score every row of `data` concurrently; one result per row, in order."""
        return list(await asyncio.gather(*(self.compute_score(data[i : i + 1]) for i in range(len(data)))))


class RewardLoopManager:
    """Starts and drives the reward workers (see the module docstring).

    Args:
        config: the run's config.
        rm_resource_pool: upstream's pool of a served reward model; not used here (the
            discriminative reward model is the trainer's reward-model worker group).
        tokenizer: the policy's tokenizer, sent to each worker (None: loaded there from the config).
        backend: `ray` (workers are Ray actors), `local` (one worker in this process) or None
            (`ray` when Ray is initialised, else `local`).
    """

    def __init__(self, config: Any, rm_resource_pool: Any = None, tokenizer: Any = None, backend: str | None = None):
        self.config = config
        self.reward_router_address = None
        self.reward_manager_cls = resolve_reward_manager_cls(config)
        if backend is None:
            import sys

            ray = sys.modules.get("ray")
            backend = "ray" if ray is not None and ray.is_initialized() else "local"
        if backend not in ("ray", "local"):
            raise ValueError(f"RewardLoopManager backend={backend!r}; expected 'ray', 'local' or None")
        self.backend = backend
        # the extra-info columns the trainer logs as reward/<name>/mean (reward.components)
        self.component_names = [str(c["name"]) for c in (config_get(config, "reward.components") or [])]
        self.num_workers = int(config_get(config, "reward.num_workers", 1))
        if self.num_workers < 1:
            raise ValueError(f"reward.num_workers={self.num_workers} must be >= 1")
        self._loop: asyncio.AbstractEventLoop | None = None
        self.reward_loop_workers: list = []
        if backend == "local":
            if self.num_workers > 1:
                logger.info(
                    "reward.num_workers=%d: without Ray one reward worker runs in this process "
                    "(its samples are still scored concurrently)",
                    self.num_workers,
                )
            self._local = RewardLoopWorker(config, None, tokenizer)
            self._loop = asyncio.new_event_loop()
        else:
            import ray

            actor_cls = ray.remote(num_cpus=0, scheduling_strategy="SPREAD")(RewardLoopWorker)
            self.reward_loop_workers = [actor_cls.remote(config, None, tokenizer) for _ in range(self.num_workers)]

    @property
    def reward_loop_worker_handles(self) -> list | None:
        """The workers' Ray handles (for scoring from agent loop workers); None in-process."""
        return self.reward_loop_workers or None

    def score_rows(self, data: DataProto) -> list[dict]:
        """One result dict per row of `data`, in order, from the workers."""
        if len(data) == 0:
            return []
        if self.backend == "local":
            return self._loop.run_until_complete(self._local.compute_score_batch(data))
        import ray

        bounds = np.linspace(0, len(data), min(self.num_workers, len(data)) + 1).astype(int)
        refs = [
            worker.compute_score_batch.remote(data[int(a) : int(b)])
            for worker, a, b in zip(self.reward_loop_workers, bounds[:-1], bounds[1:], strict=False)
        ]
        return [row for chunk in ray.get(refs) for row in chunk]

    def compute_rm_score(self, data: DataProto) -> DataProto:
        """`rm_scores` [B, R] plus one non-tensor column per extra-info key (listed in
        `meta_info["reward_extra_keys"]`; a key some rows lack is None there)."""
        from tensordict import TensorDict

        rows = self.score_rows(data)
        rm_scores = self.reward_manager_cls.assemble_rm_scores(data, [r["reward_score"] for r in rows])
        keys: list[str] = []
        for r in rows:
            keys.extend(k for k in r.get("reward_extra_info", {}) if k not in keys)
        non_tensor = {}
        for key in keys:
            column = np.empty(len(rows), dtype=object)  # one object per row, lists stay lists
            for i, r in enumerate(rows):
                column[i] = r.get("reward_extra_info", {}).get(key)
            non_tensor[key] = column
        batch = TensorDict({"rm_scores": rm_scores}, batch_size=[len(data)])
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info={"reward_extra_keys": keys})

    def __call__(self, data: DataProto, return_dict: bool = False):
        """The trainer's reward function: `token_level_scores` [B, R], or with `return_dict`
        `{"reward_tensor", "reward_extra_info": {key: list of B values}}`. A batch that already
        has `rm_scores` (the reward-model worker scored it) is returned as it is."""
        if "rm_scores" in data.batch.keys():
            out = {"reward_tensor": data.batch["rm_scores"], "reward_extra_info": {}}
        else:
            scored = self.compute_rm_score(data)
            extra = {k: list(scored.non_tensor_batch[k]) for k in scored.meta_info["reward_extra_keys"]}
            out = {"reward_tensor": scored.batch["rm_scores"], "reward_extra_info": extra}
        return out if return_dict else out["reward_tensor"]

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        if self.reward_loop_workers:
            import ray

            for worker in self.reward_loop_workers:
                try:
                    ray.kill(worker)
                except Exception:  # noqa: BLE001 - Ray already shut down
                    pass
            self.reward_loop_workers = []
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()
