"""`naive`: one call of the scoring function per response, in the driver process."""

from __future__ import annotations

from typing import Any

from verl.workers.reward_manager.abstract import AbstractRewardManager, ScoreItem
from verl.workers.reward_manager.registry import register


@register("naive")
class NaiveRewardManager(AbstractRewardManager):
    """Sequential scoring; the right choice for cheap rule-based scorers (string matching).

    Each call is bounded by `timeout` seconds (default 30): interrupted in place in the main
    thread, run in one worker process elsewhere (see `AbstractRewardManager.run_bounded`).
    """

    def score_items(self, items: list[ScoreItem]) -> list[Any]:
        return self.run_bounded([self.score_kwargs(it) for it in items])
