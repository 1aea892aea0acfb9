"""`naive`: each sample scored by one call of the scoring function (sync or async)."""

from __future__ import annotations

from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.experimental.reward_loop.reward_manager.registry import register


@register("naive")
class NaiveRewardManager(RewardManagerBase):
    """The default: decode, call `compute_score`, check the result (see `RewardManagerBase`).

    With a reward router (a served judge model), the scoring function also receives
    `reward_router_address` and `reward_model_tokenizer` (upstream's GenRM contract).
    """

    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)
        self.reward_router_address = reward_router_address
        self.reward_model_tokenizer = reward_model_tokenizer

    def router_kwargs(self) -> dict:
        if self.reward_router_address is None:
            return {}
        return {
            "reward_router_address": self.reward_router_address,
            "reward_model_tokenizer": self.reward_model_tokenizer,
        }

    async def run_single(self, data) -> dict:
        return await self.score_sample(data, self.router_kwargs())
