"""Base class of the reward loop's managers: one sample in, one score out (`async run_single`).

A manager gets the run's config, the policy's tokenizer and the scoring function
`compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw) -> float | dict`
(sync or `async def`). `run_single(data)` scores the last row of `data` (a one-row `DataProto`
with `responses` [1, R], `attention_mask` [1, P+R] or [1, R], optionally `prompts` [1, P] and
`response_mask` [1, R]; non-tensor `reward_model` (dict with `ground_truth`), the data-source
column `data.reward_fn_key` (default `data_source`) and `extra_info`) and returns
`{"reward_score": float, "reward_extra_info": dict}`.

What every manager shares lives here (`score_sample`), applied per sample:

- a sync scoring function runs in the event loop's thread pool (never on the loop itself), an
  async one is awaited; either is bounded by `reward.reward_kwargs.timeout` seconds (default 30,
  null: unbounded). A sync call past its deadline cannot be stopped: its thread runs on, the
  sample is scored as a timeout;
- a call that raises, times out, returns a non-finite number (NaN, inf) or something that is not a
  number is never silent: with `reward.reward_kwargs.error_score` set (default 0.0) the sample gets
  that score and is flagged (`score_error`, `score_timeout` in its extra info, counted by the
  trainer as `reward/score_errors` and `reward/score_timeouts`), and the first failure of each kind
  is logged naming the function and the sample; with `error_score: null` it raises.
  `NotImplementedError` (the shipped scorer has no rule for the data source) always raises;
- `reward.reward_kwargs.truncation_penalty` (when set) replaces the score of a response that ends
  without an EOS token.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import numbers
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from verl.utils.torch_functional import response_span
from verl.workers.reward_manager.abstract import ScoreError
from verl.workers.reward_manager.registry import load_object

logger = logging.getLogger(__name__)

RawRewardFn = Callable[..., Any] | None

DEFAULT_TIMEOUT_S = 30.0
# keys of reward.reward_kwargs that the base class reads (a manager may accept more)
BASE_REWARD_KWARGS = ("timeout", "error_score", "truncation_penalty", "eos_token_id")


def config_get(config: Any, dotted: str, default: Any = None) -> Any:
    """`config.<dotted>` of a DictConfig / dict (None config: `default`); a missing key: `default`."""
    node = config
    for part in dotted.split("."):
        if node is None:
            return default
        try:
            node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
        except Exception:  # noqa: BLE001 - a struct DictConfig without the key
            return default
    return default if node is None else node


def reward_kwargs_of(config: Any) -> dict:
    """`reward.reward_kwargs` as a plain dict."""
    kwargs = config_get(config, "reward.reward_kwargs", {}) or {}
    if hasattr(kwargs, "items"):
        from omegaconf import DictConfig, OmegaConf

        return OmegaConf.to_container(kwargs, resolve=True) if isinstance(kwargs, DictConfig) else dict(kwargs)
    raise TypeError(f"reward.reward_kwargs={kwargs!r} must be a mapping of keyword arguments")


@dataclass
class Sample:
    """One decoded response (what the scoring function sees, plus what the score needs)."""

    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: dict
    valid_response_length: int
    truncated: bool


class RewardManagerBase(ABC):
    """See the module docstring. Subclasses implement `run_single`, usually as
    `return await self.score_sample(data)` plus their own adjustments (`postprocess`)."""

    # the keys of reward.reward_kwargs the class reads; another key fails at construction
    reward_kwargs_keys: tuple[str, ...] = BASE_REWARD_KWARGS

    def __init__(self, config: Any, tokenizer: Any, compute_score: RawRewardFn):
        if compute_score is None:
            from verl.utils.reward_score import default_compute_score

            compute_score = default_compute_score
        self.config = config
        self.tokenizer = tokenizer
        self.compute_score = compute_score
        self.is_async_reward_score = _is_async(compute_score)
        self.init_class(config, tokenizer)
        kwargs = reward_kwargs_of(config)
        unknown = sorted(set(kwargs) - set(self.reward_kwargs_keys))
        if unknown:
            raise ValueError(
                f"reward.reward_kwargs has key(s) {unknown} that the {type(self).__name__} reward manager does "
                f"not read; accepted: {sorted(self.reward_kwargs_keys)}"
            )
        self.reward_fn_key = config_get(config, "data.reward_fn_key", "data_source")
        self.timeout = _check_timeout(kwargs.get("timeout", DEFAULT_TIMEOUT_S), "reward.reward_kwargs.timeout")
        error_score = kwargs.get("error_score", 0.0)
        self.error_score = None if error_score is None else float(error_score)
        penalty = kwargs.get("truncation_penalty")
        self.truncation_penalty = None if penalty is None else float(penalty)
        eos = kwargs.get("eos_token_id", getattr(tokenizer, "eos_token_id", None))
        self.eos_token_ids = set() if eos is None else ({int(eos)} if isinstance(eos, int) else {int(t) for t in eos})
        self._reported_kinds: set[str] = set()

    @classmethod  # noqa: B027 - an optional hook, empty by design
    def init_class(cls, config: Any, tokenizer: Any) -> None:
        """Upstream's hook for state shared by every instance of a class. The managers here keep
        their state (rate limiters, clients) on the instance: one per reward worker."""

    @abstractmethod
    async def run_single(self, data) -> dict:
        """Score the last row of `data`: `{"reward_score": float, "reward_extra_info": dict}`."""
        raise NotImplementedError

    @classmethod
    def assemble_rm_scores(cls, data, scores: list[float]) -> torch.Tensor:
        """`rm_scores` [B, R] float32: score i on the last generated token of row i, 0 elsewhere."""
        lengths = valid_response_lengths(data)
        rm_scores = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        rows = torch.arange(rm_scores.size(0))
        # an empty response has no last token: its score sits on position 0 (masked anyway)
        rm_scores[rows, (lengths - 1).clamp(min=0)] = torch.tensor([float(s) for s in scores], dtype=torch.float32)
        return rm_scores

    # ------------------------------------------------------------------ shared per-sample machinery
    def decode_sample(self, data) -> Sample:
        """Decode the last row of `data` (a DataProto) into a `Sample`."""
        data = data[-1:]
        n = int(valid_response_lengths(data)[0])
        ids = data.batch["responses"][0, :n].tolist()
        ntb = data.non_tensor_batch
        for key in (self.reward_fn_key, "reward_model"):
            if key not in ntb:
                raise KeyError(f"the sample has no non-tensor column {key!r}; columns: {sorted(ntb)}")
        rm = ntb["reward_model"][0]
        if not isinstance(rm, dict) or rm.get("ground_truth") is None:
            raise ValueError(f"reward_model={rm!r} must be a dict with a non-null 'ground_truth' entry")
        extra = ntb["extra_info"][0] if "extra_info" in ntb else None
        extra = dict(extra) if isinstance(extra, dict) else {}
        tool_fields = ntb["tool_extra_fields"][0] if "tool_extra_fields" in ntb else None
        if isinstance(tool_fields, dict):
            extra.update(tool_fields)
        if "__num_turns__" in ntb:
            extra["num_turns"] = ntb["__num_turns__"][0]
        truncated = bool(self.eos_token_ids) and (n == 0 or int(ids[-1]) not in self.eos_token_ids)
        return Sample(
            data_source=ntb[self.reward_fn_key][0],
            solution_str=self.tokenizer.decode(ids, skip_special_tokens=True),
            ground_truth=rm["ground_truth"],
            extra_info=extra,
            valid_response_length=n,
            truncated=truncated,
        )

    async def call_bounded(self, fn: Callable, kwargs: dict, timeout: float | None = None) -> Any:
        """`fn(**kwargs)` bounded by `timeout` (default `self.timeout`): its value or a `ScoreError`."""
        timeout = self.timeout if timeout is None else timeout
        try:
            if _is_async(fn):
                return await asyncio.wait_for(fn(**kwargs), timeout)
            loop = asyncio.get_running_loop()
            return await asyncio.wait_for(loop.run_in_executor(None, functools.partial(fn, **kwargs)), timeout)
        except TimeoutError:
            return ScoreError(f"TimeoutError: the call ran longer than its timeout of {timeout} s", timed_out=True)
        except NotImplementedError:
            raise  # no scorer for the data source: a configuration error, never a 0 score
        except Exception as exc:  # noqa: BLE001 - reported and counted in to_result
            return ScoreError(exc, traceback.format_exc())

    async def score_sample(self, data, extra_kwargs: dict | None = None) -> dict:
        """Decode, score (bounded) and check one sample: the result dict of `run_single`."""
        sample = self.decode_sample(data)
        kwargs = dict(
            data_source=sample.data_source,
            solution_str=sample.solution_str,
            ground_truth=sample.ground_truth,
            extra_info=sample.extra_info,
            **(extra_kwargs or {}),
        )
        value = await self.call_bounded(self.compute_score, kwargs)
        return self.postprocess(sample, self.to_result(sample, value))

    def postprocess(self, sample: Sample, result: dict) -> dict:
        """Adjust a checked result (e.g. a length penalty); default: unchanged."""
        return result

    def to_result(self, sample: Sample, value: Any) -> dict:
        """Check a scoring function's return value: `{"reward_score", "reward_extra_info"}`.

        A float `v` gives extra info `{"acc": v}`; a dict gives its entries (`score` included).
        """
        score, info = self.error_score, {}
        if not isinstance(value, ScoreError):
            if isinstance(value, dict) and "score" not in value:
                raise ValueError(
                    f"the scoring function {_fn_name(self.compute_score)} returned a dict without 'score' "
                    f"(data_source={sample.data_source!r}): keys {sorted(value)}"
                )
            raw = value["score"] if isinstance(value, dict) else value
            number = _as_number(raw)
            if number is None:
                value = ScoreError(
                    f"TypeError: returned {type(raw).__name__} {raw!r:.200}, not a number "
                    "(a float, or a dict with a float 'score')"
                )
            elif not math.isfinite(number):
                value = ScoreError(f"ValueError: returned a non-finite score {number}")
            else:
                score = number
                info = {**value, "score": number} if isinstance(value, dict) else {"acc": number}
        failed = isinstance(value, ScoreError)
        if failed:
            self.report_error(sample, value)
            info = {"acc": score}
        if sample.truncated and self.truncation_penalty is not None:
            score = self.truncation_penalty
        info.update(score_error=failed, score_timeout=failed and value.timed_out, truncated=sample.truncated)
        return {"reward_score": float(score), "reward_extra_info": info}

    def report_error(self, sample: Sample, err: ScoreError) -> None:
        """Raise (error_score null) or log the first failure of each kind (later ones are counted)."""
        where = (
            f"the scoring function {_fn_name(self.compute_score)} failed on a sample "
            f"(data_source={sample.data_source!r}, ground_truth={sample.ground_truth!r:.200}, "
            f"response={sample.solution_str[:200]!r}{_origin(sample)})"
        )
        if self.error_score is None:
            raise RuntimeError(f"{where}: {err.message}\n{err.traceback}")
        kind = "timeout" if err.timed_out else ("non-finite" if "non-finite" in err.message else "error")
        if kind in self._reported_kinds:
            return
        self._reported_kinds.add(kind)
        counter = "reward/score_timeouts" if err.timed_out else "reward/score_errors"
        logger.warning(
            "%s: %s; scored %s (reward.reward_kwargs.error_score). Further cases are counted in %s.\n%s",
            where,
            err.message,
            self.error_score,
            counter,
            err.traceback,
        )


def valid_response_lengths(data) -> torch.Tensor:
    """[B] long: the length of each response up to its last generated token.

    From `response_mask` [B, R] when present, else from the response part of `attention_mask`
    (its last R columns: [B, P+R] with prompts, or [B, R] without).
    """
    responses = data.batch["responses"]
    if "response_mask" in data.batch.keys():
        mask = data.batch["response_mask"]
    else:
        mask = data.batch["attention_mask"][:, -responses.shape[-1] :]
    return response_span(mask)


def load_class(spec_path: str, name: str, what: str) -> type:
    """`name` of the .py file or module `spec_path` (for `source: importlib`)."""
    return load_object(f"{spec_path}:{name}", what=what)


def _is_async(fn: Any) -> bool:
    inner = getattr(fn, "func", fn)  # functools.partial
    call = getattr(type(inner), "__call__", None)  # noqa: B004 - an object with an `async def __call__`
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _check_timeout(timeout: Any, key: str) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not float(timeout) > 0:
        raise ValueError(f"{key}={timeout!r} must be a number of seconds > 0, or null for no limit")
    return float(timeout)


def _as_number(value: Any) -> float | None:
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 else None
    if isinstance(value, numbers.Real):
        return float(value)
    return None


def _fn_name(fn: Any) -> str:
    from verl.utils.reward_score.bounded import callable_name

    return callable_name(fn)


def _origin(sample: Sample) -> str:
    index = sample.extra_info.get("index") if isinstance(sample.extra_info, dict) else None
    return "" if index is None else f", extra_info.index={index!r}"
