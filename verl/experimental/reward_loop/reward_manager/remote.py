"""`remote`: each sample scored by an HTTP scoring endpoint (a sandbox, a judge service).

Request: `POST <url>` with the JSON body `{"data_source", "solution_str", "ground_truth",
"extra_info"}`. Answer: a JSON number, or an object with a number `score` (its other entries go
to the sample's extra info, like a scoring function's dict).

Keys (`reward.reward_kwargs.*`):

- `url` (required): the endpoint;
- `max_retries` (default 4): attempts after the first one; an HTTP 5xx answer, a refused or
  dropped connection and an attempt past `request_timeout` are retried after a backoff of
  `backoff_s` (default 0.5) doubling per retry up to `max_backoff_s` (default 8); an HTTP 4xx
  answer (the request itself is wrong) and an answer that is not JSON are not retried;
- `request_timeout` (default 10): seconds one attempt may take;
- `timeout` (the reward loop's per-sample bound, default 30): the total time of all attempts and
  backoffs of one sample; past it the sample is a timeout;
- `headers` (default {}): extra HTTP headers (e.g. an authorization token);
- `error_score`: as for every manager, the score of a sample whose request finally failed (it
  is counted in `reward/score_errors`); the sample's `remote_attempts` says how many attempts it took.

Divergence from upstream, on purpose: upstream's `remote` manager runs the scoring function in
separate Ray processes; here the reward workers are already Ray actors that run sync scoring
functions off their event loop, and `remote` is the HTTP client that reward workers otherwise lack.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import urllib.error
import urllib.request
from typing import Any

from verl.experimental.reward_loop.reward_manager.base import (
    BASE_REWARD_KWARGS,
    RewardManagerBase,
    _check_timeout,
    reward_kwargs_of,
)
from verl.experimental.reward_loop.reward_manager.registry import register

logger = logging.getLogger(__name__)

REMOTE_KWARGS = ("url", "max_retries", "backoff_s", "max_backoff_s", "request_timeout", "headers")


class RemoteRewardError(RuntimeError):
    """The scoring endpoint answered with an error (or not at all) and no retry is left."""


class _Retryable(Exception):
    """An attempt failed in a way that another attempt may not (5xx, connection, attempt timeout)."""


@register("remote")
class RemoteRewardManager(RewardManagerBase):
    """See the module docstring."""

    reward_kwargs_keys = (*BASE_REWARD_KWARGS, *REMOTE_KWARGS)

    def __init__(self, config, tokenizer, compute_score=None, reward_router_address=None, reward_model_tokenizer=None):
        if compute_score is not None:
            raise ValueError(
                "reward.reward_manager.name=remote scores through reward.reward_kwargs.url; "
                "reward.custom_reward_function.path is not used by it: unset it, or use the naive manager"
            )
        super().__init__(config, tokenizer, self.post_score)
        kwargs = reward_kwargs_of(config)
        self.url = kwargs.get("url")
        if not self.url or not str(self.url).startswith(("http://", "https://")):
            raise ValueError(
                f"reward.reward_kwargs.url={self.url!r}: the remote manager needs the http(s) URL of a scoring endpoint"
            )
        self.max_retries = int(kwargs.get("max_retries", 4))
        if self.max_retries < 0:
            raise ValueError(f"reward.reward_kwargs.max_retries={self.max_retries} must be >= 0")
        self.backoff_s = float(kwargs.get("backoff_s", 0.5))
        self.max_backoff_s = float(kwargs.get("max_backoff_s", 8.0))
        self.request_timeout = _check_timeout(
            kwargs.get("request_timeout", 10.0), "reward.reward_kwargs.request_timeout"
        )
        self.headers = {"Content-Type": "application/json", **dict(kwargs.get("headers") or {})}

    async def run_single(self, data) -> dict:
        sample = self.decode_sample(data)
        attempts: list[int] = []
        kwargs = dict(
            data_source=sample.data_source,
            solution_str=sample.solution_str,
            ground_truth=sample.ground_truth,
            extra_info=sample.extra_info,
            attempts=attempts,
        )
        result = self.to_result(sample, await self.call_bounded(self.compute_score, kwargs))
        result["reward_extra_info"]["remote_attempts"] = len(attempts)
        return result

    async def post_score(self, attempts: list[int] | None = None, **payload) -> Any:
        """POST `payload` with retries (see the module docstring); the decoded JSON answer.
        `attempts` (a list) gets one entry per attempt made, so a caller can count them."""
        body = json.dumps(payload, default=_jsonable).encode()
        loop = asyncio.get_running_loop()
        for attempt in range(self.max_retries + 1):
            if attempts is not None:
                attempts.append(attempt)
            try:
                return await loop.run_in_executor(None, functools.partial(self._post_once, body))
            except _Retryable as exc:
                if attempt == self.max_retries:
                    raise RemoteRewardError(f"{exc} (after {attempt + 1} attempts)") from None
                delay = min(self.backoff_s * 2**attempt, self.max_backoff_s)
                logger.debug("attempt %d to %s failed (%s); retrying in %.2f s", attempt + 1, self.url, exc, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def _post_once(self, body: bytes) -> Any:
        request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:200].decode(errors="replace")
            message = f"POST {self.url} answered HTTP {exc.code}: {detail}"
            if 500 <= exc.code < 600:
                raise _Retryable(message) from None
            raise RemoteRewardError(f"{message} (a client error: not retried)") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise _Retryable(f"POST {self.url} failed: {getattr(exc, 'reason', exc)}") from None
        try:
            return json.loads(text)
        except ValueError:
            message = f"POST {self.url} answered with something that is not JSON: {text[:200]!r}"
            raise RemoteRewardError(message) from None


def _jsonable(value: Any) -> Any:
    """numpy scalars / arrays and other objects in extra_info, as JSON can carry them."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
