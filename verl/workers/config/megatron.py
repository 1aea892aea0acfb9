"""Upstream's Megatron-LM actor config, `McoreActorConfig`, and the refusal of Megatron by the
workers (`McoreEngineConfig` and `McoreOptimizerConfig` live in `engine.py` / `optimizer.py`, at
upstream's paths).

This project has one training backend, FSDP2. The classes exist so that code written against
upstream imports, builds and validates them (a `_target_` in a yaml, a test building a config);
handing one to a worker fails at once with `MEGATRON_NOT_AVAILABLE` (`refuse_megatron`), before
any model is built. Only the fields upstream's callers commonly set are kept; each is validated
the way upstream's are (parallel sizes >= 1, sequence parallelism off without tensor parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig
from verl.workers.config.actor import ActorConfig
from verl.workers.config.engine import McoreEngineConfig
from verl.workers.config.optimizer import McoreOptimizerConfig

__all__ = ["MEGATRON_NOT_AVAILABLE", "McoreActorConfig", "McoreEngineConfig", "McoreOptimizerConfig", "refuse_megatron"]

MEGATRON_NOT_AVAILABLE = (
    "Megatron is not available in this verl (no Megatron-LM backend): use strategy=fsdp (FSDP2) and "
    "fsdp_config instead of megatron / McoreActorConfig / McoreEngineConfig / McoreOptimizerConfig"
)


@dataclass
class McoreActorConfig(ActorConfig):
    """An actor trained with Megatron-LM (`strategy: megatron`)."""

    _STRATEGIES = ("megatron",)

    strategy: str = "megatron"
    megatron: McoreEngineConfig = field(default_factory=McoreEngineConfig)
    optim: McoreOptimizerConfig = field(default_factory=McoreOptimizerConfig)
    entropy_from_logits_chunk_size: int = 2048
    use_rollout_log_probs: bool = False
    profile: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        super().__post_init__()
        self.engine = self.megatron


def _strategy(section) -> Any:
    if isinstance(section, BaseConfig) or hasattr(section, "get"):
        return section.get("strategy", None)
    return getattr(section, "strategy", None)


def refuse_megatron(section) -> None:
    """Raise NotImplementedError (`MEGATRON_NOT_AVAILABLE`) for a worker config that asks for
    Megatron: one of the Mcore classes, or a section with `strategy: megatron`."""
    if isinstance(section, (McoreActorConfig, McoreEngineConfig, McoreOptimizerConfig)) or (
        _strategy(section) == "megatron"
    ):
        raise NotImplementedError(MEGATRON_NOT_AVAILABLE)
