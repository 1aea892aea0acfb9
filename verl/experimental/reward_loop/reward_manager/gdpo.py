"""`gdpo`: per-sample scoring for GDPO, whose scoring functions return several reward components.

The scoring function returns a dict with `score` and one entry per component (e.g. `correct`,
`format`); the GDPO estimator (`algorithm.adv_estimator=gdpo`) normalises each component named in
`algorithm.gdpo_reward_keys` within its group and combines them with `algorithm.gdpo_reward_weights`.
The function also sees `extra_info["experiment_name"]` (`trainer.experiment_name`), as upstream.
"""

from __future__ import annotations

from verl.experimental.reward_loop.reward_manager.base import config_get
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.experimental.reward_loop.reward_manager.registry import register


@register("gdpo")
class GDPORewardManager(NaiveRewardManager):
    """Naive scoring plus `extra_info["experiment_name"]`."""

    def decode_sample(self, data):
        sample = super().decode_sample(data)
        sample.extra_info["experiment_name"] = config_get(self.config, "trainer.experiment_name")
        return sample
