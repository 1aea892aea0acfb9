"""Config dataclasses of the worker groups (upstream path: `verl.workers.config`)."""

from verl.workers.config.actor import ActorConfig, FSDPActorConfig, PolicyLossConfig, RefConfig
from verl.workers.config.critic import CriticConfig, FSDPCriticConfig, RewardModelConfig
from verl.workers.config.engine import FSDPEngineConfig, McoreEngineConfig, MixedPrecisionConfig
from verl.workers.config.megatron import McoreActorConfig
from verl.workers.config.model import HFModelConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig, McoreOptimizerConfig, OptimizerConfig
from verl.workers.config.rollout import (
    AgentLoopConfig,
    CheckpointEngineConfig,
    MultiTurnConfig,
    RolloutConfig,
    SamplingConfig,
)

__all__ = [
    "ActorConfig",
    "FSDPActorConfig",
    "PolicyLossConfig",
    "RefConfig",
    "CriticConfig",
    "FSDPCriticConfig",
    "RewardModelConfig",
    "FSDPEngineConfig",
    "MixedPrecisionConfig",
    "HFModelConfig",
    "OptimizerConfig",
    "FSDPOptimizerConfig",
    "McoreActorConfig",
    "McoreEngineConfig",
    "McoreOptimizerConfig",
    "AgentLoopConfig",
    "MultiTurnConfig",
    "RolloutConfig",
    "CheckpointEngineConfig",
    "SamplingConfig",
]
