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

__all__ = [
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
