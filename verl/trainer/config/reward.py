"""The `reward` section (upstream main's current reward config) and its legacy spellings.

`reward.*` is where a run's reward is configured: the reward workers (`num_workers`), the scoring
function (`custom_reward_function.*`), the reward manager (`reward_manager.{source,name,module}`),
the manager's keyword arguments (`reward_kwargs`), the reward model (`reward_model.*`), sandbox
fusion (`sandbox_fusion.*`) and the rate limits of the `rate_limited` manager.

The older top-level keys keep working: `custom_reward_function.*`, `reward_model.reward_manager`,
`reward_model.num_workers`, `reward_model.reward_kwargs`, `reward_model.enable`,
`reward_model.model.path` and `sandbox_fusion.*` are moved into `reward.*` with one deprecation
warning naming the new spellings (`migrate_legacy_reward_keys`). The driver-side code that still
reads the old places (the reward-model worker, the batch-level reward managers) gets them back
from `reward.*` (`apply_reward_section`): `reward.*` is the one source of truth.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig, check_choice
from verl.trainer.config.trainer import CustomRewardFunctionConfig

logger = logging.getLogger(__name__)

__all__ = [
    "RewardConfig",
    "RewardLoopModelConfig",
    "RewardManagerConfig",
    "RewardManagerModuleConfig",
    "SandboxFusionConfig",
    "apply_reward_section",
    "migrate_legacy_reward_keys",
]


@dataclass
class RewardManagerModuleConfig(BaseConfig):
    """`reward.reward_manager.module`: the file or module of a user manager (`source: importlib`);
    `name` is kept for upstream's yaml (the class is `reward.reward_manager.name`, as upstream)."""

    path: str | None = None
    name: str = "custom_reward_manager"


@dataclass
class RewardManagerConfig(BaseConfig):
    """`reward.reward_manager`: `source: register` selects `name` from the reward-loop registry
    (naive, dapo, gdpo, rate_limited, remote; or the driver-side batch, prime); `source: importlib`
    loads the class `name` from `module.path` (a .py file or an importable module)."""

    source: str = "register"
    name: str = "naive"
    module: RewardManagerModuleConfig = field(default_factory=RewardManagerModuleConfig)

    def __post_init__(self):
        check_choice("reward.reward_manager", "source", self.source, ("register", "importlib"))
        if self.source == "importlib" and not self.module.path:
            raise ValueError(
                "reward.reward_manager.source=importlib needs reward.reward_manager.module.path (a .py file or module)"
            )


@dataclass
class RewardLoopModelConfig(BaseConfig):
    """`reward.reward_model`: `enable` turns on the reward-model worker (`model_path`); the other
    keys describe upstream's served reward model (see docs/config_reference.md for what they do here)."""

    enable: bool = False
    enable_resource_pool: bool = False
    n_gpus_per_node: int = 8
    nnodes: int = 0
    model_path: str | None = None
    rollout: dict[str, Any] = field(default_factory=dict)


@dataclass
class SandboxFusionConfig(BaseConfig):
    """`reward.sandbox_fusion`: a remote code-execution service for code rewards."""

    url: str | None = None
    max_concurrent: int = 64
    memory_limit_mb: int = 1024


@dataclass
class RewardConfig(BaseConfig):
    """`reward.*` (see the module docstring and docs/reward_loop.md).

    - `num_workers`: reward workers (Ray actors; one in-process worker without Ray).
    - `reward_kwargs`: keyword arguments of the reward manager (`timeout`, `error_score`,
      `truncation_penalty`, `overlong_buffer_cfg`, ...).
    - `max_concurrent`, `max_rpm`, `max_tpm`, `estimated_tokens_per_request`, `timeout`: the
      limits of the `rate_limited` manager (upstream's keys).
    - `components`: several scoring functions `{name, path, function, weight, reward_kwargs}`;
      the score is their weighted sum and each is logged as `reward/<name>/mean`.
    """

    num_workers: int = 8
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    reward_manager: RewardManagerConfig = field(default_factory=RewardManagerConfig)
    reward_model: RewardLoopModelConfig = field(default_factory=RewardLoopModelConfig)
    sandbox_fusion: SandboxFusionConfig = field(default_factory=SandboxFusionConfig)
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    max_concurrent: int = 1
    max_rpm: float | None = None
    max_tpm: float | None = None
    estimated_tokens_per_request: int = 2000
    timeout: float = 300.0
    # ours (not upstream's): several scoring functions with weights, see docs/reward_loop.md
    components: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self):
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) or self.num_workers < 1:
            raise ValueError(f"reward.num_workers={self.num_workers!r} must be an integer >= 1")
        if self.max_concurrent < 1:
            raise ValueError(f"reward.max_concurrent={self.max_concurrent!r} must be >= 1")


# the legacy spellings and their migration live below the workers (the reward loop uses them too)
from verl.workers.config.reward_keys import (  # noqa: E402,F401 - re-exported
    LEGACY_REWARD_KEYS,
    migrate_legacy_reward_keys,
)


def apply_reward_section(raw: dict) -> None:
    """Write `reward.*` back into the places the driver-side code reads (in place):
    `custom_reward_function.*`, `reward_model.{reward_manager, reward_kwargs, enable, model.path}`."""
    reward = raw.get("reward") or {}
    crf = raw.setdefault("custom_reward_function", {})
    for key, value in (reward.get("custom_reward_function") or {}).items():
        if value is not None:
            crf[key] = value
    rm = raw.setdefault("reward_model", {})
    manager = reward.get("reward_manager") or {}
    if manager.get("source", "register") == "importlib":
        module = manager.get("module") or {}
        if not module.get("path"):
            raise ValueError(
                "reward.reward_manager.source=importlib needs reward.reward_manager.module.path (a .py file or module)"
            )
        rm["reward_manager"] = f"{module['path']}:{manager.get('name') or 'naive'}"
    elif manager.get("source", "register") == "register":
        rm["reward_manager"] = manager.get("name") or "naive"
    else:
        raise ValueError(
            f"reward.reward_manager.source={manager.get('source')!r} is not allowed; "
            "expected one of ['register', 'importlib']"
        )
    if reward.get("reward_kwargs"):
        rm["reward_kwargs"] = reward["reward_kwargs"]
    new_rm = reward.get("reward_model") or {}
    rm["enable"] = new_rm.get("enable", False)  # not coerced: a bad value fails its type check
    if new_rm.get("model_path") is not None:
        rm.setdefault("model", {})["path"] = new_rm["model_path"]
