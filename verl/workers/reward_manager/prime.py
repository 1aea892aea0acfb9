"""`prime`: scoring in a pool of processes, each call bounded by a timeout."""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
import traceback
from typing import Any, Callable

from verl.workers.reward_manager.abstract import AbstractRewardManager, ScoreError, ScoreItem
from verl.utils.import_utils import import_external_libs
from verl.workers.reward_manager.registry import loaded_user_files, register


_SCORE_FN: Callable | None = None


def _init_child(user_files: list[str], compute_score: Callable) -> None:
    # spawned children start clean: re-import the user files so their functions unpickle, and
    # receive the scoring function once here rather than with every call
    global _SCORE_FN
    import_external_libs(user_files)
    _SCORE_FN = compute_score


def _on_alarm(signum, frame):
    raise TimeoutError("scoring call exceeded its timeout")


def _score_one(kwargs: dict, timeout: float) -> Any:
    """One scoring call in a child, interrupted by SIGALRM after `timeout` seconds."""
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return _SCORE_FN(**kwargs)
    except Exception as exc:  # noqa: BLE001 - sent back to the parent, counted there
        return ScoreError(exc, traceback.format_exc())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@register("prime")
class PrimeRewardManager(AbstractRewardManager):
    """For slow or untrusted scorers (code execution, heavy math checking).

    Responses are scored in `num_processes` spawned processes. A call running longer than
    `timeout` seconds is interrupted in its process (SIGALRM) and is an error (scored
    `error_score`, counted). A call that cannot be interrupted (stuck in native code) is caught
    by a deadline in the parent (`timeout` per round of calls plus `grace_s`); the pool is then
    terminated and a fresh one is started on the next batch.
    """

    def __init__(self, tokenizer, num_examine: int = 0, compute_score: Callable | None = None,
                 reward_fn_key: str = "data_source", num_processes: int = 4, timeout: float = 30.0,
                 grace_s: float = 30.0, **kwargs):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)
        if int(num_processes) < 1:
            raise ValueError(f"reward_model.reward_kwargs.num_processes={num_processes} must be >= 1")
        if float(timeout) <= 0:
            raise ValueError(f"reward_model.reward_kwargs.timeout={timeout} must be > 0 seconds")
        self.num_processes = int(num_processes)
        self.timeout = float(timeout)
        self.grace_s = float(grace_s)
        self._pool = None

    def _get_pool(self):
        if self._pool is None:
            ctx = mp.get_context("spawn")
            self._pool = ctx.Pool(self.num_processes, initializer=_init_child, initargs=(loaded_user_files(), self.compute_score))
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def score_items(self, items: list[ScoreItem]) -> list[Any]:
        pool = self._get_pool()
        pending = [
            pool.apply_async(
                _score_one,
                (dict(data_source=it.data_source, solution_str=it.solution_str,
                      ground_truth=it.ground_truth, extra_info=it.extra_info), self.timeout),
            )
            for it in items
        ]
        start = time.monotonic()
        results: list[Any] = []
        timed_out = False
        for i, res in enumerate(pending):
            # item i starts at the latest after i // num_processes earlier rounds of calls
            deadline = start + self.grace_s + self.timeout * (i // self.num_processes + 1)
            try:
                if timed_out:
                    raise mp.TimeoutError
                results.append(res.get(timeout=max(deadline - time.monotonic(), 0.0)))
            except mp.TimeoutError:
                # after a timeout the pool is torn down, so every later unfinished call fails too
                if not res.ready():
                    timed_out = True
                    results.append(ScoreError(f"TimeoutError: no result within the parent deadline ({self.timeout} s per call + {self.grace_s} s)"))
                else:
                    results.append(self._finished(res))
            except Exception as exc:  # noqa: BLE001 - counted and reported by the base class
                results.append(ScoreError(exc))
        if timed_out:
            self.close()
        return results

    @staticmethod
    def _finished(res) -> Any:
        try:
            return res.get(timeout=0)
        except Exception as exc:  # noqa: BLE001
            return ScoreError(exc)
