"""Building the reward function of a run from the config (upstream names kept).

- `get_custom_reward_fn(config)`: the user scoring function of `custom_reward_function.path/name`
  (with `custom_reward_function.reward_kwargs` bound), or None.
- `load_reward_manager(config, tokenizer, num_examine, **reward_kwargs)`: the reward manager named by
  `reward_model.reward_manager`, wired to that function (or the shipped `default_compute_score`).
- `compute_reward(data, reward_fn)`: `(token_level_scores [B, R], reward_extra_info)`.
- `build_reward_fns(config, tokenizer, backend)`: the run's (training, validation) reward
  functions: the reward loop (`verl.experimental.reward_loop.RewardLoopManager`, one for both)
  when `reward.reward_manager` names a reward-loop manager (the default `naive` does), else two
  driver-side managers of `verl.workers.reward_manager` (`batch`, `prime`, a user class of theirs).
- `resolve_reward_manager_cls(config)`, `extract_reward(batch)`: upstream's helpers.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.utils.import_utils import load_extern_type
from verl.workers.reward_manager import get_reward_manager_cls


def _section(config: Any, name: str) -> dict:
    sec = config.get(name) if hasattr(config, "get") else getattr(config, name, None)
    if sec is None:
        return {}
    if isinstance(sec, DictConfig):
        return OmegaConf.to_container(sec, resolve=True)
    return dict(sec)


def get_custom_reward_fn(config: Any) -> Callable | None:
    """The function `custom_reward_function.name` of `custom_reward_function.path`, or None.

    `reward_kwargs` are appended to every call, so a user function
    `fn(data_source, solution_str, ground_truth, extra_info=None, scale=1.0)` can be configured
    with `custom_reward_function.reward_kwargs.scale=2`.
    """
    cfg = _section(config, "custom_reward_function")
    path = cfg.get("path")
    if not path:
        return None
    name = cfg.get("name") or "compute_score"
    try:
        fn = load_extern_type(path, name)
    except (ImportError, FileNotFoundError, AttributeError) as exc:
        raise type(exc)(f"custom_reward_function (path={path!r}, name={name!r}): {exc}") from exc
    if not callable(fn):
        raise TypeError(f"custom_reward_function.name={name!r} in {path!r} is a {type(fn).__name__}, not a function")
    kwargs = dict(cfg.get("reward_kwargs") or {})
    if not kwargs:
        return fn
    return functools.partial(fn, **kwargs)


def load_reward_manager(config: Any, tokenizer, num_examine: int, **reward_kwargs):
    """Instantiate `reward_model.reward_manager` with the run's scoring function.

    `reward_kwargs` (normally `reward_model.reward_kwargs`) go to the manager's constructor; a
    key the manager does not accept raises a TypeError naming it. The DAPO manager's
    `max_resp_len` defaults to `data.max_response_length`.
    """
    rm_cfg = _section(config, "reward_model")
    name = rm_cfg.get("reward_manager") or "naive"
    cls = get_reward_manager_cls(name)
    compute_score = get_custom_reward_fn(config)
    data_cfg = _section(config, "data")
    params = inspect.signature(cls.__init__).parameters
    if "max_resp_len" in params and "max_resp_len" not in reward_kwargs:
        reward_kwargs["max_resp_len"] = data_cfg.get("max_response_length")
    try:
        return cls(
            tokenizer=tokenizer,
            num_examine=num_examine,
            compute_score=compute_score,
            reward_fn_key=data_cfg.get("reward_fn_key", "data_source"),
            **reward_kwargs,
        )
    except TypeError as exc:
        raise TypeError(
            f"reward_model.reward_manager={name!r} ({cls.__name__}) rejected reward_model.reward_kwargs "
            f"{sorted(reward_kwargs)}: {exc}"
        ) from exc


def compute_reward(data, reward_fn) -> tuple[Any, dict[str, list]]:
    """Score `data` with `reward_fn`; returns (token_level_scores [B, R], extra info columns)."""
    out = reward_fn(data, return_dict=True)
    if isinstance(out, dict):
        return out["reward_tensor"], dict(out.get("reward_extra_info", {}))
    return out, {}


def resolve_reward_manager_cls(config: Any) -> type:
    """The reward-loop manager class of `reward.reward_manager` (upstream's helper)."""
    from verl.experimental.reward_loop.reward_loop import resolve_reward_manager_cls as resolve

    return resolve(config)


def checked_by_reward_loop(v: Any) -> bool:
    """Whether the reward loop scores the run of the validated config `v`; if so, its manager name
    and the keys of `reward.reward_kwargs` are checked here (before Ray starts)."""
    if getattr(v, "reward", None) is None:
        return False
    from verl.experimental.reward_loop.reward_loop import (
        load_compute_score,
        resolve_reward_manager_cls,
        uses_reward_loop,
    )

    cfg = {"reward": v.reward, "data": v.data}
    if not uses_reward_loop(cfg):
        return False
    load_compute_score(cfg)  # the scoring function (or reward.components) loads
    cls = resolve_reward_manager_cls(cfg)
    accepted = sorted(getattr(cls, "reward_kwargs_keys", ()))
    unknown = sorted(set(v.reward.reward_kwargs or {}) - set(accepted))
    if unknown:
        raise ValueError(
            f"reward.reward_kwargs.{unknown[0]}: reward.reward_manager.name={v.reward.reward_manager.name!r} "
            f"({cls.__name__}) does not accept {unknown}; accepted keys: {accepted}"
        )
    return True


def build_reward_fns(config: Any, tokenizer, backend: str | None = None) -> tuple[Any, Any]:
    """(reward_fn, val_reward_fn) of a normalised config; see the module docstring. `backend`
    (`ray` or `local`) decides where the reward workers run."""
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager, uses_reward_loop

    if uses_reward_loop(config):
        manager = RewardLoopManager(config, tokenizer=tokenizer, backend=backend)
        return manager, manager
    reward_kwargs = dict(_section(config, "reward_model").get("reward_kwargs") or {})
    return (
        load_reward_manager(config, tokenizer, num_examine=0, **dict(reward_kwargs)),
        load_reward_manager(config, tokenizer, num_examine=1, **dict(reward_kwargs)),
    )


def reward_component_metrics(reward_fn: Any, extra: dict[str, list]) -> dict[str, float]:
    """`reward/<name>/mean` of each weighted reward component (`reward.components`) in `extra`."""
    out = {}
    for name in getattr(reward_fn, "component_names", ()):
        values = [float(v) for v in extra.get(name, []) if v is not None]
        if values:
            out[f"reward/{name}/mean"] = sum(values) / len(values)
    return out


def extract_reward(batch) -> tuple[Any, dict]:
    """(`rm_scores` [B, R], {extra-info key: column}) of a batch scored by the reward loop."""
    keys = batch.meta_info.get("reward_extra_keys", [])
    return batch.batch["rm_scores"], {key: batch.non_tensor_batch[key] for key in keys}
