"""Config dataclasses of the trainer (upstream path: `verl.trainer.config`)."""

from verl.trainer.config.algorithm import (
    AlgoConfig,
    FilterGroupsConfig,
    KLControlConfig,
    NormConfig,
    RolloutCorrectionConfig,
)

__all__ = ["AlgoConfig", "FilterGroupsConfig", "KLControlConfig", "NormConfig", "RolloutCorrectionConfig"]
