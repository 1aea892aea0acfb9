"""Value-model engines."""

from verl.workers.critic.base import BasePPOCritic
from verl.workers.critic.dp_critic import DataParallelPPOCritic

__all__ = ["BasePPOCritic", "DataParallelPPOCritic"]
