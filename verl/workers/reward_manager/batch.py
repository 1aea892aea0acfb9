"""`batch`: the scoring function receives the whole batch at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verl.workers.reward_manager.abstract import AbstractRewardManager, ScoreError, ScoreItem
from verl.workers.reward_manager.registry import register


@register("batch")
class BatchRewardManager(AbstractRewardManager):
    """For scorers that are cheaper per batch (a remote judge, vectorised checks).

    `compute_score(data_sources, solution_strs, ground_truths, extra_infos, **reward_kwargs)` gets
    lists of length B and returns B floats or dicts with `score`. If the call raises or runs past
    `timeout` seconds (default 300: one call scores the whole batch), every response of the batch
    is an error (scored `error_score`, counted).
    """

    DEFAULT_TIMEOUT_S = 300.0

    def __init__(
        self,
        tokenizer,
        num_examine: int = 0,
        compute_score: Callable | None = None,
        reward_fn_key: str = "data_source",
        **kwargs,
    ):
        if compute_score is None:
            raise ValueError(
                "reward_model.reward_manager=batch needs a batched scoring function: set "
                "custom_reward_function.path/name to fn(data_sources, solution_strs, ground_truths, extra_infos)"
            )
        base_keys = ("error_score", "truncation_penalty", "eos_token_id", "timeout")
        base = {k: kwargs.pop(k) for k in base_keys if k in kwargs}
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **base)
        self.reward_kwargs = kwargs  # passed through to every batched call

    def score_items(self, items: list[ScoreItem]) -> list[Any]:
        call = dict(
            data_sources=[it.data_source for it in items],
            solution_strs=[it.solution_str for it in items],
            ground_truths=[it.ground_truth for it in items],
            extra_infos=[it.extra_info for it in items],
            **self.reward_kwargs,
        )
        (results,) = self.run_bounded([call])
        if isinstance(results, ScoreError):
            return [results] * len(items)
        results = list(results)
        if len(results) != len(items):
            raise RuntimeError(
                f"the batched scoring function {self.fn_name} returned {len(results)} scores for {len(items)} responses"
            )
        return results
