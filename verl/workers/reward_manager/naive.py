"""`naive`: one call of the scoring function per response, in the driver process."""

from __future__ import annotations

import contextlib
import signal
from typing import Any

from verl.workers.reward_manager.abstract import AbstractRewardManager, ScoreItem
from verl.workers.reward_manager.registry import register


@register("naive")
class NaiveRewardManager(AbstractRewardManager):
    """Sequential scoring; the right choice for cheap rule-based scorers (string matching).

    Each call is bounded by `timeout` seconds (default 30): interrupted in place in the main
    thread, run in one worker process elsewhere (see `AbstractRewardManager.run_bounded`).
    """

    def __init__(self, tokenizer, num_examine=0, compute_score=None, reward_fn_key="data_source", **kwargs):
        if "compute_score_timeout" in kwargs:  # upstream's name of the per-call timeout
            if "timeout" in kwargs:
                raise ValueError("give reward_kwargs.timeout or compute_score_timeout, not both")
            kwargs["timeout"] = kwargs.pop("compute_score_timeout") or None
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)

    def score_items(self, items: list[ScoreItem]) -> list[Any]:
        return self.run_bounded([self.score_kwargs(it) for it in items])


@contextlib.contextmanager
def _score_timeout(seconds: float | None):
    """Upstream's helper: raise TimeoutError inside the block after `seconds` (SIGALRM, main thread
    only); None or 0 sets no limit. The managers bound calls with `run_bounded` instead."""
    if not seconds:
        yield
        return

    def on_alarm(signum, frame):
        raise TimeoutError(f"the call ran longer than its timeout of {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, float(seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
