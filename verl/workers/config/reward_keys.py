"""The legacy reward keys (`reward_model.*`, `custom_reward_function.*`, `sandbox_fusion.*`) and
their migration into upstream main's `reward.*` section, as plain-dict functions: used by the
trainer's config normalisation (`verl.trainer.config.reward`) and by the reward loop
(`verl.experimental.reward_loop`), so they live below both."""

from __future__ import annotations

import logging
import warnings
from typing import Any

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- legacy spellings
# (legacy key, key under `reward`); a legacy leaf that is null or {} is not set
LEGACY_REWARD_KEYS: tuple[tuple[str, str], ...] = (
    ("reward_model.num_workers", "num_workers"),
    ("reward_model.reward_kwargs", "reward_kwargs"),
    ("reward_model.enable", "reward_model.enable"),
    ("reward_model.model.path", "reward_model.model_path"),
    ("custom_reward_function.path", "custom_reward_function.path"),
    ("custom_reward_function.name", "custom_reward_function.name"),
    ("custom_reward_function.reward_kwargs", "custom_reward_function.reward_kwargs"),
    ("sandbox_fusion.url", "sandbox_fusion.url"),
    ("sandbox_fusion.max_concurrent", "sandbox_fusion.max_concurrent"),
    ("sandbox_fusion.memory_limit_mb", "sandbox_fusion.memory_limit_mb"),
)

_MISSING = object()


def get_dotted(tree: dict, dotted: str, default: Any = _MISSING) -> Any:
    """`tree[a][b][c]` for `dotted` = "a.b.c", or `default` when a part is missing."""
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def set_dotted(tree: dict, dotted: str, value: Any) -> None:
    """Set `tree[a][b][c] = value` for `dotted` = "a.b.c", making the missing levels."""
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def _is_set(value: Any) -> bool:
    return value is not _MISSING and value is not None and value != {}


def _manager_from_legacy(spec: str) -> dict:
    """`reward_model.reward_manager` (a registered name, or `file.py:Class` / `pkg.mod:Class`)
    as a `reward.reward_manager` section."""
    path, sep, name = str(spec).rpartition(":")
    if sep and path and name:
        return {"source": "importlib", "name": name, "module": {"path": path}}
    return {"source": "register", "name": str(spec)}


def migrate_legacy_reward_keys(raw: dict, drop_legacy: bool = False) -> list[str]:
    """Move the legacy reward keys that `raw` sets into `raw["reward"]` (in place; a set legacy
    key wins over the `reward.*` value, as upstream's migration); returns the legacy keys used.
    One DeprecationWarning (and one log line) names them all with their new spellings. A legacy
    key whose value already equals its `reward.*` value (a config normalised before) is not a use.
    With `drop_legacy`, the legacy keys are removed afterwards."""
    reward = raw.setdefault("reward", {})
    moved: list[tuple[str, str]] = []
    for old, new in LEGACY_REWARD_KEYS:
        value, current = get_dotted(raw, old), get_dotted(reward, new)
        if not _is_set(value):
            continue
        if isinstance(value, dict) and isinstance(current, dict):
            value = {**current, **value}
        if value != current:
            set_dotted(reward, new, value)
            moved.append((old, f"reward.{new}"))
    legacy_manager = get_dotted(raw, "reward_model.reward_manager")
    if _is_set(legacy_manager):
        current = dict(reward.get("reward_manager") or {})
        section = _manager_from_legacy(legacy_manager)
        merged = {**current, **section, "module": {**(current.get("module") or {}), **section.get("module", {})}}
        if merged != {**current, "module": current.get("module") or {}}:
            reward["reward_manager"] = merged
            moved.append(("reward_model.reward_manager", "reward.reward_manager.{source,name,module.path}"))
    if moved:
        text = (
            f"{', '.join(o for o, _ in moved)} {'is' if len(moved) == 1 else 'are'} deprecated (upstream moved "
            f"{'it' if len(moved) == 1 else 'them'} into the reward section): use {', '.join(n for _, n in moved)}"
        )
        warnings.warn(text, DeprecationWarning, stacklevel=3)
        logger.warning(text)
    if drop_legacy:
        raw.pop("custom_reward_function", None)
        raw.pop("sandbox_fusion", None)
        for key in ("num_workers", "reward_manager", "reward_kwargs", "enable"):
            (raw.get("reward_model") or {}).pop(key, None)
    return [o for o, _ in moved]
