"""`prime`: scoring in a pool of processes, each call bounded by a timeout."""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from typing import Any, Callable

from verl.workers.reward_manager.abstract import AbstractRewardManager, ScoreError, ScoreItem
from verl.workers.reward_manager.registry import LOADED_USER_FILES, load_module, register


def _init_child(user_files: list[str]) -> None:
    # spawned children start clean: re-load the user files so their functions unpickle
    for path in user_files:
        load_module(path, "reward worker")


def _score_one(compute_score: Callable, kwargs: dict) -> Any:
    try:
        return compute_score(**kwargs)
    except Exception as exc:  # noqa: BLE001 - sent back to the parent, counted there
        return ScoreError(exc, traceback.format_exc())


@register("prime")
class PrimeRewardManager(AbstractRewardManager):
    """For slow or untrusted scorers (code execution, heavy math checking).

    Responses are scored in `num_processes` spawned processes. A call still running `timeout`
    seconds after its turn came is an error (scored `error_score`, counted); the pool is then
    terminated (stopping the runaway call) and a fresh one is started on the next batch.
    """

    def __init__(self, tokenizer, num_examine: int = 0, compute_score: Callable | None = None,
                 reward_fn_key: str = "data_source", num_processes: int = 4, timeout: float = 30.0, **kwargs):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)
        if int(num_processes) < 1:
            raise ValueError(f"reward_model.reward_kwargs.num_processes={num_processes} must be >= 1")
        if float(timeout) <= 0:
            raise ValueError(f"reward_model.reward_kwargs.timeout={timeout} must be > 0 seconds")
        self.num_processes = int(num_processes)
        self.timeout = float(timeout)
        self._pool = None

    def _get_pool(self):
        if self._pool is None:
            ctx = mp.get_context("spawn")
            self._pool = ctx.Pool(self.num_processes, initializer=_init_child, initargs=(list(LOADED_USER_FILES),))
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
                (self.compute_score, dict(data_source=it.data_source, solution_str=it.solution_str,
                                          ground_truth=it.ground_truth, extra_info=it.extra_info)),
            )
            for it in items
        ]
        start = time.monotonic()
        results: list[Any] = []
        timed_out = False
        for i, res in enumerate(pending):
            # item i starts at the latest after i // num_processes earlier rounds of calls
            deadline = start + self.timeout * (i // self.num_processes + 1)
            try:
                if timed_out:
                    raise mp.TimeoutError
                results.append(res.get(timeout=max(deadline - time.monotonic(), 0.0)))
            except mp.TimeoutError:
                # after a timeout the pool is torn down, so every later unfinished call fails too
                if not res.ready():
                    timed_out = True
                    results.append(ScoreError(f"TimeoutError: scoring took longer than {self.timeout} s"))
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
