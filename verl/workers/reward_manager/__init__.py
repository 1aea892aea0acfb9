"""Reward managers: turn generated responses into token-level scores.

`reward_model.reward_manager` selects one by registry name (`naive`, `batch`, `dapo`, `prime`),
or a user class as `path/to/file.py:ClassName`. See `abstract.AbstractRewardManager`.
"""

from verl.workers.reward_manager.abstract import AbstractRewardManager, ScoreError, ScoreItem
from verl.workers.reward_manager.batch import BatchRewardManager
from verl.workers.reward_manager.dapo import DAPORewardManager
from verl.workers.reward_manager.naive import NaiveRewardManager
from verl.workers.reward_manager.prime import PrimeRewardManager
from verl.workers.reward_manager.registry import (
    REWARD_MANAGER_REGISTRY,
    get_reward_manager_cls,
    load_object,
    loaded_user_files,
    register,
)

__all__ = [
    "REWARD_MANAGER_REGISTRY",
    "AbstractRewardManager",
    "BatchRewardManager",
    "DAPORewardManager",
    "NaiveRewardManager",
    "PrimeRewardManager",
    "ScoreError",
    "ScoreItem",
    "get_reward_manager_cls",
    "loaded_user_files",
    "load_object",
    "register",
]
