"""Model-based reward scoring (`reward_model.enable=True`)."""

from verl.workers.reward_model.dp_reward_model import DataParallelRewardModel, find_score_head

__all__ = ["DataParallelRewardModel", "find_score_head"]
