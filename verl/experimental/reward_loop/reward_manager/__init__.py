"""The reward loop's managers (upstream's `verl.experimental.reward_loop.reward_manager`): each
scores one sample per `async run_single(data)` call. Select one with `reward.reward_manager.name`."""

from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER, get_reward_manager_cls, register  # noqa: I001
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager
from verl.experimental.reward_loop.reward_manager.gdpo import GDPORewardManager
from verl.experimental.reward_loop.reward_manager.limited import RateLimitedRewardManager
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.experimental.reward_loop.reward_manager.remote import RemoteRewardManager

__all__ = [
    "REWARD_MANAGER",
    "DAPORewardManager",
    "GDPORewardManager",
    "NaiveRewardManager",
    "RateLimitedRewardManager",
    "RemoteRewardManager",
    "RewardManagerBase",
    "get_reward_manager_cls",
    "register",
]
