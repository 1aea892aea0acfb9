"""`naive`: one call of the scoring function per response, in the driver process."""

from __future__ import annotations

import contextlib
import signal
import time
from typing import Any

from verl.utils.reward_score.bounded import alarm_available
from verl.workers.reward_manager.abstract import AbstractRewardManager, ScoreItem
from verl.workers.reward_manager.registry import register

_UNSET = object()


@contextlib.contextmanager
def _score_timeout(seconds: float | None):
    """Raise TimeoutError in the body after `seconds` (upstream's helper). None or 0: no limit;
    outside the main thread (no SIGALRM there) the body runs without a limit. A timer that was
    already running gets back the time it has left."""
    if not seconds or not alarm_available():
        yield
        return

    def on_alarm(signum, frame):
        raise TimeoutError(f"compute_score ran longer than its timeout of {seconds} s")

    start = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    outer = signal.setitimer(signal.ITIMER_REAL, float(seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if outer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, max(outer[0] - (time.monotonic() - start), 1e-3), outer[1])


@register("naive")
class NaiveRewardManager(AbstractRewardManager):
    """Sequential scoring; the right choice for cheap rule-based scorers (string matching).

    Each call is bounded by `timeout` seconds (default 30): interrupted in place in the main
    thread, run in one worker process elsewhere (see `AbstractRewardManager.run_bounded`). A call
    past it scores `error_score` (0.0) and is counted. Upstream's `compute_score_timeout` is the
    same setting under its name (None or 0: no limit); give one of the two.
    """

    def __init__(
        self,
        tokenizer,
        num_examine: int = 0,
        compute_score=None,
        reward_fn_key: str = "data_source",
        error_score: float | None = 0.0,
        truncation_penalty: float | None = None,
        eos_token_id=None,
        timeout: float | None | str = "default",
        compute_score_timeout: Any = _UNSET,
    ):
        if compute_score_timeout is not _UNSET:
            if timeout != "default":
                raise ValueError(
                    "NaiveRewardManager: give compute_score_timeout (upstream's name) or timeout, not both "
                    f"(got {compute_score_timeout!r} and {timeout!r})"
                )
            timeout = compute_score_timeout or None
        super().__init__(
            tokenizer, num_examine, compute_score, reward_fn_key, error_score, truncation_penalty, eos_token_id, timeout
        )

    @property
    def compute_score_timeout(self) -> float | None:
        return self.timeout

    def score_items(self, items: list[ScoreItem]) -> list[Any]:
        return self.run_bounded([self.score_kwargs(it) for it in items])
