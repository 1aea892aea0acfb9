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


# ------------------------------------------------------------------------------------------
# upstream's module-level helpers (asyncio + a process pool), for user code that calls them


async def single_compute_score(evaluation_func, completion, reference, task, task_extra_info, executor, timeout=300.0):
    """``evaluation_func(task, completion, reference, task_extra_info)`` in `executor`; None when
    it raises or takes longer than `timeout` seconds (the row then scores 0.0)."""
    import asyncio
    from functools import partial

    loop = asyncio.get_running_loop()
    try:
        future = loop.run_in_executor(executor, partial(evaluation_func, task, completion, reference, task_extra_info))
        return await asyncio.wait_for(future, timeout=timeout)
    except TimeoutError:
        print(f"[Timeout] Task timeout: {str(completion)[:80]}")
        return None
    except Exception as exc:  # noqa: BLE001 - a failed row scores 0, as upstream
        print(f"[Error] Task failed: {exc}, completion: {str(completion)[:80]}")
        return None


async def parallel_compute_score_async(evaluation_func, completions, references, tasks, extra_info=None, num_processes=64):
    """Score row i as ``evaluation_func(tasks[i], completions[i], references[i], extra_info[i])``
    in a pool of `num_processes` processes (300 s per row). Returns one float per row: 0.0 for
    failed or timed-out rows, ``float(result)`` for numbers, ``float(result[0])`` for tuples.
    The pool's processes are terminated at the end, so a stuck call cannot outlive the batch."""
    import asyncio
    from concurrent.futures import ProcessPoolExecutor

    if extra_info is None:
        extra_info = [None] * len(tasks)
    if not (len(completions) == len(references) == len(tasks) == len(extra_info)):
        raise ValueError(f"parallel_compute_score_async: lengths differ (completions={len(completions)}, references={len(references)}, "
                         f"tasks={len(tasks)}, extra_info={len(extra_info)})")
    executor = ProcessPoolExecutor(max_workers=num_processes)
    try:
        results = await asyncio.gather(*[
            single_compute_score(evaluation_func, c, r, t, e, executor, timeout=300.0)
            for c, r, t, e in zip(completions, references, tasks, extra_info)
        ])
    finally:
        processes = list(getattr(executor, "_processes", {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            if proc.is_alive():
                proc.terminate()
        for proc in processes:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
    scores = []
    for res in results:
        if res is None or isinstance(res, Exception):
            scores.append(0.0)
        elif isinstance(res, (int, float, bool)):
            scores.append(float(res))
        elif isinstance(res, dict):
            scores.append(float(res["score"]))
        else:
            scores.append(float(res[0]))
    return scores


def run_reward_scoring(evaluation_func, completions, references, tasks, extra_info=None, num_processes=64):
    """Synchronous wrapper of `parallel_compute_score_async` (runs its own event loop)."""
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(parallel_compute_score_async(evaluation_func, completions, references, tasks, extra_info, num_processes))
    finally:
        loop.close()
