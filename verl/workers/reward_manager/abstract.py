"""Base class of the reward managers: decoded responses in, token-level scores out.

A reward manager turns a generated batch (a `DataProto` with `prompts` [B, P], `responses`
[B, R], `attention_mask` [B, P+R] and optionally `response_mask` [B, R]; non-tensor
`reward_model` (dict with `ground_truth`), the `reward_fn_key` column (usually `data_source`)
and `extra_info`) into `token_level_scores` [B, R]: the scalar score of each response is placed
on its last valid token, every other position is 0.

Subclasses only decide *how the scoring function is called* (`score_items`): one call per
response (naive), one call per batch (batch), a process pool with a timeout (prime). Everything
else lives here once: decoding, error accounting, the EOS-trick truncation penalty, placement of
the score and the `reward_extra_info` columns.

Errors: a scoring call that raises, runs past its timeout, returns a non-finite number (NaN,
inf) or something that is not a number (a string, None) is never silent. With `error_score` set
(a float, default 0.0) the response gets that score, the row is flagged in
`reward_extra_info["score_error"]` (and `["score_timeout"]` for a timeout; the trainer logs the
counts as `reward/score_errors` and `reward/score_timeouts`) and the first error of each kind is
logged with the function, the row and its traceback. With `error_score=None` the error is raised,
naming the function, the row and its data source. `NotImplementedError` (the shipped
`default_compute_score` has no scorer for the data source) always stops the run: it is a
configuration mistake, and scoring every response 0 would hide it.

Deadlines: every call of the scoring function is bounded by `timeout` seconds
(`reward_model.reward_kwargs.timeout`; `DEFAULT_TIMEOUT_S` of the manager, None = unbounded).
In the main thread the call runs here and is interrupted by SIGALRM; anywhere else (a thread, an
executor) it runs in a worker process that is killed at the deadline (see
`verl.utils.reward_score.bounded`). math_verify fallbacks of the built-in math scorer are
flagged per row in `reward_extra_info["math_verify_fallback"]` (`reward/math_verify_fallbacks`).
"""

from __future__ import annotations

import logging
import math
import numbers
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from verl.utils.reward_score.bounded import (
    CallOutcome,
    ScorerPool,
    alarm_available,
    call_with_alarm,
    callable_name,
)
from verl.utils.torch_functional import response_span

logger = logging.getLogger(__name__)


@dataclass
class ScoreItem:
    """One response to score (what the scoring function sees)."""

    index: int
    data_source: str
    prompt_str: str
    solution_str: str
    ground_truth: Any
    extra_info: dict
    valid_response_length: int
    truncated: bool


class ScoreError:
    """Result placeholder of a scoring call that failed (kept so the error can be reported)."""

    def __init__(self, exc: BaseException | str, tb: str = "", timed_out: bool = False):
        self.message = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        self.traceback = tb
        self.timed_out = timed_out

    def __repr__(self) -> str:
        return f"ScoreError({self.message!r})"


class AbstractRewardManager:
    """Common machinery; see the module docstring.

    Args:
        tokenizer: decodes prompts and responses (`batch_decode`, `eos_token_id`).
        num_examine: number of (prompt, response, ground truth, score) examples printed per data
            source on each call (0 = quiet). The trainer uses 0 for training, 1 for validation.
        compute_score: `fn(data_source, solution_str, ground_truth, extra_info=None) -> float | dict`;
            None uses `verl.utils.reward_score.default_compute_score`.
        reward_fn_key: non-tensor column naming the data source (`data.reward_fn_key`).
        error_score: score of a response whose scoring raised; None re-raises.
        truncation_penalty: when set, a response that ends without an EOS token (cut by the length
            limit) gets this score instead of the scorer's (the "EOS trick").
        eos_token_id: int or list of ints that end a response; default: the tokenizer's.
        timeout: seconds one call of the scoring function may run (None: unbounded); default
            `DEFAULT_TIMEOUT_S`. A call past it is an error (scored `error_score`, counted).
    """

    DEFAULT_TIMEOUT_S: float | None = 30.0

    def __init__(
        self,
        tokenizer,
        num_examine: int = 0,
        compute_score: Callable | None = None,
        reward_fn_key: str = "data_source",
        error_score: float | None = 0.0,
        truncation_penalty: float | None = None,
        eos_token_id: int | list[int] | None = None,
        timeout: float | None | str = "default",
    ):
        if compute_score is None:
            from verl.utils.reward_score import default_compute_score

            compute_score = default_compute_score
        self.tokenizer = tokenizer
        self.num_examine = int(num_examine)
        self.compute_score = compute_score
        self.reward_fn_key = reward_fn_key
        self.error_score = None if error_score is None else float(error_score)
        self.truncation_penalty = None if truncation_penalty is None else float(truncation_penalty)
        if eos_token_id is None:
            eos_token_id = getattr(tokenizer, "eos_token_id", None)
        if eos_token_id is None:
            self.eos_token_ids: set[int] = set()
        elif isinstance(eos_token_id, int):
            self.eos_token_ids = {eos_token_id}
        else:
            self.eos_token_ids = {int(t) for t in eos_token_id}
        if isinstance(timeout, str) and timeout == "default":
            timeout = self.DEFAULT_TIMEOUT_S
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not float(timeout) > 0:
                raise ValueError(
                    f"reward_model.reward_kwargs.timeout={timeout!r} must be a number of seconds > 0, "
                    "or null for no limit"
                )
            timeout = float(timeout)
        self.timeout = timeout
        self._pool: ScorerPool | None = None
        self._logged_kinds: set[str] = set()
        self._fallbacks_in_call: list[int] = []
        self.fn_name = callable_name(compute_score)

    # ------------------------------------------------------------------ subclass hook
    def score_items(self, items: list[ScoreItem]) -> list[Any]:
        """Score every item; return a float, a dict with `score`, or a `ScoreError` per item."""
        raise NotImplementedError

    def postprocess(self, items: list[ScoreItem], scores: list[float], extra: dict[str, list]) -> list[float]:
        """Adjust final scores (e.g. length penalties) and add extra columns; default: unchanged."""
        return scores

    # ------------------------------------------------------------------ shared machinery
    @staticmethod
    def score_kwargs(item: ScoreItem) -> dict:
        """Keyword arguments of the per-response scoring call of `item`."""
        return dict(
            data_source=item.data_source,
            solution_str=item.solution_str,
            ground_truth=item.ground_truth,
            extra_info=item.extra_info,
        )

    def call_score_fn(self, item: ScoreItem) -> Any:
        """One bounded call of the scoring function; errors and timeouts become `ScoreError`."""
        return self.run_bounded([self.score_kwargs(item)])[0]

    def run_bounded(
        self,
        calls: list[dict],
        num_processes: int = 1,
        fn: Callable | None = None,
        always_in_process_pool: bool = False,
    ) -> list[Any]:
        """Call `fn(**kw)` (default: the scoring function) for each `kw` of `calls`, each call bounded
        by `self.timeout`: here under SIGALRM in the main thread, otherwise (or with
        `always_in_process_pool`) in a pool of `num_processes` worker processes kept between
        batches. Returns the value of each call or a `ScoreError`."""
        fn = fn or self.compute_score
        if not calls:
            return []
        if not always_in_process_pool and (self.timeout is None or alarm_available()):
            outcomes = [call_with_alarm(fn, kw, self.timeout) for kw in calls]
        else:
            if self._pool is None or self._pool.num_processes != num_processes:
                self.close()
                from verl.workers.reward_manager.registry import loaded_user_files

                self._pool = ScorerPool(fn, num_processes, loaded_user_files(), what=callable_name(fn))
            outcomes = self._pool.run(calls, self.timeout)
        return [self._from_outcome(o) for o in outcomes]

    def _from_outcome(self, o: CallOutcome) -> Any:
        self._fallbacks_in_call.append(int(o.fallbacks))
        if o.ok:
            return o.value
        return ScoreError(o.error, o.traceback, timed_out=o.timed_out)

    def close(self) -> None:
        """Stop the worker processes of this manager, if any (a new pool starts when needed)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def decode(self, data) -> list[ScoreItem]:
        """Decode prompts and valid response tokens of every row of `data` (a DataProto)."""
        prompts = data.batch["prompts"]
        responses = data.batch["responses"]
        prompt_len = prompts.shape[-1]
        if "response_mask" in data.batch.keys():
            response_mask = data.batch["response_mask"]
        else:
            response_mask = data.batch["attention_mask"][:, prompt_len:]
        prompt_mask = data.batch["attention_mask"][:, :prompt_len].bool()
        # the span up to the last generated token: a multi-turn response holds observation tokens
        # (mask 0) between its turns; for a single turn this is the mask's sum
        resp_lens = response_span(response_mask).tolist()
        prompt_ids = [prompts[i][prompt_mask[i]].tolist() for i in range(len(resp_lens))]
        # response tokens are left-aligned: the first `len` positions are the generated ones
        resp_ids = [responses[i, :n].tolist() for i, n in enumerate(resp_lens)]
        prompt_strs = _decode_all(self.tokenizer, prompt_ids)
        resp_strs = _decode_all(self.tokenizer, resp_ids)

        ntb = data.non_tensor_batch
        if self.reward_fn_key not in ntb:
            raise KeyError(
                f"the batch has no non-tensor column {self.reward_fn_key!r} (data.reward_fn_key); "
                f"columns: {sorted(ntb)}"
            )
        if "reward_model" not in ntb:
            raise KeyError(f"the batch has no 'reward_model' column (with 'ground_truth'); columns: {sorted(ntb)}")
        items = []
        for i, n in enumerate(resp_lens):
            rm = ntb["reward_model"][i]
            if not isinstance(rm, dict) or "ground_truth" not in rm or rm["ground_truth"] is None:
                raise ValueError(
                    f"row {i} of the batch{_row_origin(ntb, i)}: reward_model={rm!r} must be a dict with a non-null "
                    "'ground_truth' entry (give every row a ground truth; an empty string if the scorer ignores it)"
                )
            extra = ntb["extra_info"][i] if "extra_info" in ntb else None
            extra = dict(extra) if isinstance(extra, dict) else {}
            truncated = n == 0 or int(resp_ids[i][-1]) not in self.eos_token_ids
            items.append(
                ScoreItem(
                    index=i,
                    data_source=ntb[self.reward_fn_key][i],
                    prompt_str=prompt_strs[i],
                    solution_str=resp_strs[i],
                    ground_truth=rm["ground_truth"],
                    extra_info=extra,
                    valid_response_length=int(n),
                    truncated=bool(truncated) and bool(self.eos_token_ids),
                )
            )
        return items

    def __call__(self, data, return_dict: bool = False):
        """Score `data`; returns `token_level_scores` [B, R] (float32), or with `return_dict` a
        dict `{"reward_tensor": ..., "reward_extra_info": {column: list of B values}}`."""
        if "rm_scores" in data.batch.keys():
            # a reward-model worker already scored the batch; rule scores are not mixed in
            if return_dict:
                return {"reward_tensor": data.batch["rm_scores"], "reward_extra_info": {}}
            return data.batch["rm_scores"]

        items = self.decode(data)
        self._fallbacks_in_call: list[int] = []
        raw = self.score_items(items) if items else []
        if len(raw) != len(items):
            raise RuntimeError(
                f"{type(self).__name__}.score_items returned {len(raw)} results for {len(items)} responses"
            )
        # math_verify fallbacks per row when the calls were per response, else all on row 0
        fallbacks = (
            self._fallbacks_in_call
            if len(self._fallbacks_in_call) == len(items)
            else ([sum(self._fallbacks_in_call)] + [0] * (len(items) - 1))
        )

        extra: dict[str, list] = defaultdict(list)
        scores: list[float] = []
        dict_keys = sorted({k for r in raw if isinstance(r, dict) for k in r if k != "score"})
        for item, result, n_fallbacks in zip(items, raw, fallbacks, strict=False):
            score, info = self.error_score, {}
            if not isinstance(result, ScoreError):
                value = result.get("score") if isinstance(result, dict) else result
                if isinstance(result, dict) and "score" not in result:
                    raise ValueError(
                        f"the scoring function {self.fn_name} returned a dict without 'score' for row {item.index} "
                        f"(data_source={item.data_source!r}): keys {sorted(result)}"
                    )
                number = _as_number(value)
                if number is None:
                    result = ScoreError(
                        f"TypeError: returned {type(value).__name__} {value!r:.200}, not a number "
                        "(a float, or a dict with a float 'score')"
                    )
                elif not math.isfinite(number):
                    result = ScoreError(f"ValueError: returned a non-finite score {number}")
                else:
                    score, info = number, (result if isinstance(result, dict) else {})
            error = isinstance(result, ScoreError)
            if error:
                self._report_error(item, result)
            if item.truncated and self.truncation_penalty is not None:
                score = self.truncation_penalty
            scores.append(score)
            for k in dict_keys:
                extra[k].append(info.get(k, None))
            extra["score_error"].append(error)
            extra["score_timeout"].append(error and result.timed_out)
            extra["math_verify_fallback"].append(n_fallbacks > 0)
            extra["truncated"].append(item.truncated)

        scores = self.postprocess(items, scores, extra)
        reward_tensor = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        for item, score in zip(items, scores, strict=False):
            # an empty response has no last token: its score sits on position 0 (masked anyway)
            reward_tensor[item.index, max(item.valid_response_length - 1, 0)] = score
        self._print_examples(items, scores)
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": dict(extra)}
        return reward_tensor

    def _report_error(self, item: ScoreItem, err: ScoreError) -> None:
        kind = "timeout" if err.timed_out else ("non-finite" if "non-finite" in err.message else "error")
        where = (
            f"the scoring function {self.fn_name} failed on row {item.index} (data_source={item.data_source!r}, "
            f"ground_truth={item.ground_truth!r:.200}, response={item.solution_str[:200]!r})"
        )
        if self.error_score is None:
            raise RuntimeError(f"{where}: {err.message}\n{err.traceback}")
        if kind not in self._logged_kinds:
            self._logged_kinds.add(kind)
            counter = "reward/score_timeouts" if err.timed_out else "reward/score_errors"
            logger.warning(
                "%s: %s; scored %s (reward_kwargs.error_score). Further cases are counted in %s.\n%s",
                where,
                err.message,
                self.error_score,
                counter,
                err.traceback,
            )

    def _print_examples(self, items: list[ScoreItem], scores: list[float]) -> None:
        if self.num_examine <= 0:
            return
        shown: dict[str, int] = defaultdict(int)
        for item, score in zip(items, scores, strict=False):
            if shown[item.data_source] >= self.num_examine:
                continue
            shown[item.data_source] += 1
            print(
                f"[{item.data_source}] prompt={item.prompt_str!r} response={item.solution_str!r} "
                f"ground_truth={item.ground_truth!r} score={score}"
            )


def _as_number(value: Any) -> float | None:
    """`value` as a float when it is a real number (bool, int, float, numpy scalar, 0-d tensor)."""
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 else None
    if isinstance(value, numbers.Real):  # numpy scalars register as numbers.Real too
        return float(value)
    return None


def _decode_all(tokenizer, seqs: list[list[int]]) -> list[str]:
    """`batch_decode` (special tokens skipped), or one `decode` per row for a tokenizer without it."""
    if hasattr(tokenizer, "batch_decode"):
        return tokenizer.batch_decode(seqs, skip_special_tokens=True)
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in seqs]


def _row_origin(ntb: dict, i: int) -> str:
    """` (extra_info.index=...)` when the row carries its dataset index, else ''."""
    parts = []
    extra = ntb["extra_info"][i] if "extra_info" in ntb else None
    if isinstance(extra, dict) and "index" in extra:
        parts.append(f"extra_info.index={extra['index']!r}")
    return f" ({', '.join(parts)})" if parts else ""
