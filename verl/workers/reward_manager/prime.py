"""`prime`: scoring in a pool of worker processes, each call bounded by a timeout."""

from __future__ import annotations

from typing import Any, Callable

from verl.workers.reward_manager.abstract import AbstractRewardManager, ScoreItem
from verl.workers.reward_manager.registry import register


@register("prime")
class PrimeRewardManager(AbstractRewardManager):
    """For slow or untrusted scorers (code execution, heavy math checking).

    Responses are scored in `num_processes` spawned worker processes, one call per process at a
    time. A call running longer than `timeout` seconds (default 30) has its process killed and
    replaced: that one response is an error (scored `error_score`, counted in
    `reward/score_timeouts`), every other response is scored normally, and the batch takes about
    `timeout` longer at worst, whatever the scorer does (a Python loop, a sleep, native code).
    The pool is kept between batches (`close()` stops it).
    """

    def __init__(self, tokenizer, num_examine: int = 0, compute_score: Callable | None = None,
                 reward_fn_key: str = "data_source", num_processes: int = 4, **kwargs):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
            raise ValueError(f"reward_model.reward_kwargs.num_processes={num_processes!r} must be an integer >= 1")
        if self.timeout is None:
            raise ValueError("reward_model.reward_kwargs.timeout=null: the prime manager needs a timeout in seconds")
        self.num_processes = int(num_processes)

    def score_items(self, items: list[ScoreItem]) -> list[Any]:
        return self.run_bounded([self.score_kwargs(it) for it in items], num_processes=self.num_processes,
                                always_in_process_pool=True)
