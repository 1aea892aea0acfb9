"""`rate_limited`: per-sample scoring under a concurrency bound and request / token rate limits,
for scoring functions that call a rate-limited API (an LLM judge behind a paid endpoint)."""

from __future__ import annotations

import asyncio
import logging

from verl.experimental.reward_loop.reward_manager.base import _check_timeout, config_get
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.experimental.reward_loop.reward_manager.registry import register

logger = logging.getLogger(__name__)


class AsyncTokenBucket:
    """A token bucket for asyncio code: `rate_limit` tokens per second flow into a bucket that holds
    at most `max_tokens` (default `rate_limit`) and starts full; `await acquire(n)` takes `n` tokens,
    sleeping until they are there.

    A request larger than the bucket (`n > max_tokens`) could never be served whole: it is taken
    on credit (the balance goes negative) after waiting for the part the bucket lacks, and later
    requests wait for the debt to be paid back. The refill clock starts at the first `acquire`.
    """

    def __init__(self, rate_limit: float, max_tokens: float | None = None):
        if not float(rate_limit) > 0:
            raise ValueError(f"AsyncTokenBucket rate_limit={rate_limit!r} must be > 0 tokens per second")
        self.rate_limit = float(rate_limit)
        self.max_tokens = float(max_tokens or rate_limit)
        self.tokens = self.max_tokens
        self.last_update: float | None = None
        self.lock = asyncio.Lock()

    def _refill(self, now: float) -> None:
        if self.last_update is not None:
            self.tokens = min(self.max_tokens, self.tokens + (now - self.last_update) * self.rate_limit)
        self.last_update = now

    async def acquire(self, num_tokens: float = 1.0) -> None:
        """Take `num_tokens` tokens, waiting as long as the rate requires."""
        while True:
            async with self.lock:
                self._refill(asyncio.get_running_loop().time())
                if num_tokens > self.max_tokens:
                    wait = max(num_tokens - self.tokens, 0.0) / self.rate_limit
                    self.tokens -= num_tokens
                    break
                if self.tokens >= num_tokens:
                    self.tokens -= num_tokens
                    return
                wait = (num_tokens - self.tokens) / self.rate_limit
            await asyncio.sleep(wait)
        await asyncio.sleep(wait)


@register("rate_limited")
class RateLimitedRewardManager(NaiveRewardManager):
    """Naive scoring, each call behind three limits (keys of the `reward` section, upstream's):

    - `reward.max_concurrent` (default 1): calls in flight at once;
    - `reward.max_rpm` (default null = unlimited): calls per minute;
    - `reward.max_tpm` (default null): tokens per minute, each call counting
      `reward.estimated_tokens_per_request` (default 2000);
    - `reward.timeout` (default 300 s): the deadline of one call (instead of
      `reward.reward_kwargs.timeout`); a call past it scores `error_score` with `timeout: true`.

    The limits hold for the whole run: each of the `reward.num_workers` reward workers enforces
    its share (`limit / num_workers`; concurrency at least 1 per worker, so a `max_concurrent`
    below `num_workers` is raised to `num_workers`, with a warning). Upstream keeps the limiters
    in class attributes, which bounds each worker process separately; here each manager instance
    (one per worker) owns its limiters, so two runs in one process do not share them either.
    """

    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        if tokenizer is None:
            raise TypeError("RateLimitedRewardManager requires `tokenizer`")
        super().__init__(config, tokenizer, compute_score, reward_router_address, reward_model_tokenizer)
        workers = int(config_get(config, "reward.num_workers", 1))
        max_concurrent = int(config_get(config, "reward.max_concurrent", 1))
        if max_concurrent < 1:
            raise ValueError(f"reward.max_concurrent={max_concurrent} must be >= 1")
        if max_concurrent < workers:
            logger.warning(
                "reward.max_concurrent=%d < reward.num_workers=%d: each worker runs 1 call at a time (%d in all)",
                max_concurrent,
                workers,
                workers,
            )
        self.timeout = _check_timeout(config_get(config, "reward.timeout", 300.0), "reward.timeout")
        self.max_concurrent = max(max_concurrent // workers, 1)
        self.semaphore = asyncio.Semaphore(self.max_concurrent)
        max_rpm = config_get(config, "reward.max_rpm")
        max_tpm = config_get(config, "reward.max_tpm")
        self.estimated_tokens_per_request = float(config_get(config, "reward.estimated_tokens_per_request", 2000))
        self.rpm_limiter = _bucket(max_rpm, workers, "reward.max_rpm")
        self.tpm_limiter = _bucket(max_tpm, workers, "reward.max_tpm")

    async def run_single(self, data) -> dict:
        sample = self.decode_sample(data)
        if self.rpm_limiter is not None:
            await self.rpm_limiter.acquire(1.0)
        if self.tpm_limiter is not None:
            await self.tpm_limiter.acquire(self.estimated_tokens_per_request)
        kwargs = dict(
            data_source=sample.data_source,
            solution_str=sample.solution_str,
            ground_truth=sample.ground_truth,
            extra_info=sample.extra_info,
            **self.router_kwargs(),
        )
        async with self.semaphore:
            value = await self.call_bounded(self.compute_score, kwargs)
        result = self.to_result(sample, value)
        info = result["reward_extra_info"]
        if info["score_error"]:  # upstream's columns for a failed call
            info["timeout"] = info["score_timeout"]
            info["error"] = getattr(value, "message", str(value))
        return result


def _bucket(per_minute, workers: int, key: str) -> AsyncTokenBucket | None:
    """A bucket refilled at `per_minute / 60 / workers` per second, holding one second's worth."""
    if per_minute is None:
        return None
    if not float(per_minute) > 0:
        raise ValueError(f"{key}={per_minute!r} must be > 0 per minute, or null for unlimited")
    rate = float(per_minute) / 60.0 / workers
    return AsyncTokenBucket(rate_limit=rate, max_tokens=rate)
