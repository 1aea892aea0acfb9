"""Which config dataclass each section of the PPO config becomes.

One table for the config layer (`upstream_keys` lists and fills keys by it) and for the trainer
(key listings and "did you mean" suggestions). Importing this module imports the worker config
dataclasses; `upstream_keys` therefore reads it lazily.
"""

from __future__ import annotations

from verl.trainer.config import AlgoConfig, CustomRewardFunctionConfig, DataConfig, RayKwargsConfig, TrainerConfig
from verl.trainer.config.reward import RewardConfig
from verl.workers.config import ActorConfig, CriticConfig, HFModelConfig, RefConfig, RewardModelConfig, RolloutConfig

__all__ = ["SECTION_DATACLASSES"]

# dotted section -> the dataclass it is converted into
SECTION_DATACLASSES: dict[str, type] = {
    "data": DataConfig,
    "actor_rollout_ref.model": HFModelConfig,
    "actor_rollout_ref.actor": ActorConfig,
    "actor_rollout_ref.ref": RefConfig,
    "actor_rollout_ref.rollout": RolloutConfig,
    "critic": CriticConfig,
    "reward_model": RewardModelConfig,
    "custom_reward_function": CustomRewardFunctionConfig,
    "reward": RewardConfig,
    "algorithm": AlgoConfig,
    "trainer": TrainerConfig,
    "ray_kwargs": RayKwargsConfig,
}
