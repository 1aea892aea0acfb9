"""Config dataclasses of the trainer (upstream path: `verl.trainer.config`)."""

from verl.trainer.config.algorithm import (
    AlgoConfig,
    FilterGroupsConfig,
    KLControlConfig,
    NormConfig,
    RolloutCorrectionConfig,
)
from verl.trainer.config.checkpoint import CheckpointConfig
from verl.trainer.config.data import CustomClassConfig, DataConfig
from verl.trainer.config.trainer import CustomRewardFunctionConfig, RayKwargsConfig, TrainerConfig
from verl.trainer.config.trainer_v1 import (
    HybridRolloutSwitchConfig,
    SamplerConfig,
    SeparateAsyncConfig,
    TrainerV1Config,
)

__all__ = [
    "HybridRolloutSwitchConfig",
    "SamplerConfig",
    "SeparateAsyncConfig",
    "TrainerV1Config",
    "AlgoConfig",
    "FilterGroupsConfig",
    "KLControlConfig",
    "NormConfig",
    "RolloutCorrectionConfig",
    "CheckpointConfig",
    "CustomClassConfig",
    "DataConfig",
    "CustomRewardFunctionConfig",
    "RayKwargsConfig",
    "TrainerConfig",
]
