"""`prime`: scoring in a pool of worker processes, each call bounded by a timeout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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

    def __init__(
        self,
        tokenizer,
        num_examine: int = 0,
        compute_score: Callable | None = None,
        reward_fn_key: str = "data_source",
        num_processes: int = 4,
        **kwargs,
    ):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
            raise ValueError(f"reward_model.reward_kwargs.num_processes={num_processes!r} must be an integer >= 1")
        if self.timeout is None:
            raise ValueError("reward_model.reward_kwargs.timeout=null: the prime manager needs a timeout in seconds")
        self.num_processes = int(num_processes)

    def score_items(self, items: list[ScoreItem]) -> list[Any]:
        return self.run_bounded(
            [self.score_kwargs(it) for it in items], num_processes=self.num_processes, always_in_process_pool=True
        )


# ----------------------------------------------------------------------------- upstream's async helpers
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


async def parallel_compute_score_async(
    evaluation_func, completions, references, tasks, extra_info=None, num_processes=64
):
    """Score row i as ``evaluation_func(tasks[i], completions[i], references[i], extra_info[i])``
    in a pool of `num_processes` processes (300 s per row). Returns one float per row: 0.0 for
    failed or timed-out rows, ``float(result)`` for numbers, ``float(result[0])`` for tuples.
    The pool's processes are terminated at the end, so a stuck call cannot outlive the batch."""
    import asyncio
    from concurrent.futures import ProcessPoolExecutor

    if extra_info is None:
        extra_info = [None] * len(tasks)
    if not (len(completions) == len(references) == len(tasks) == len(extra_info)):
        raise ValueError(
            f"parallel_compute_score_async: lengths differ (completions={len(completions)}, "
            f"references={len(references)}, "
            f"tasks={len(tasks)}, extra_info={len(extra_info)})"
        )
    executor = ProcessPoolExecutor(max_workers=num_processes)
    try:
        results = await asyncio.gather(
            *[
                single_compute_score(evaluation_func, c, r, t, e, executor, timeout=300.0)
                for c, r, t, e in zip(completions, references, tasks, extra_info, strict=False)
            ]
        )
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
        return loop.run_until_complete(
            parallel_compute_score_async(evaluation_func, completions, references, tasks, extra_info, num_processes)
        )
    finally:
        loop.close()
