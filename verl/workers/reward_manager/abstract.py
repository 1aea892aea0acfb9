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

Errors: a scoring call that raises (or times out) is never silent. With `error_score` set (a
float, default 0.0) the response gets that score, the row is flagged in
`reward_extra_info["score_error"]` (the trainer logs the count as `reward/score_errors`) and the
first error of each manager is logged with its traceback. With `error_score=None` the error is
raised again, naming the row and its data source. `NotImplementedError` (the shipped
`default_compute_score` has no scorer for the data source) always stops the run: it is a
configuration mistake, and scoring every response 0 would hide it.
"""

from __future__ import annotations

import logging
import traceback
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import torch

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

    def __init__(self, exc: BaseException | str, tb: str = ""):
        self.message = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        self.traceback = tb

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
    """

    def __init__(
        self,
        tokenizer,
        num_examine: int = 0,
        compute_score: Callable | None = None,
        reward_fn_key: str = "data_source",
        error_score: float | None = 0.0,
        truncation_penalty: float | None = None,
        eos_token_id: int | list[int] | None = None,
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
        self._logged_first_error = False

    # ------------------------------------------------------------------ subclass hook
    def score_items(self, items: list[ScoreItem]) -> list[Any]:
        """Score every item; return a float, a dict with `score`, or a `ScoreError` per item."""
        raise NotImplementedError

    def postprocess(self, items: list[ScoreItem], scores: list[float], extra: dict[str, list]) -> list[float]:
        """Adjust final scores (e.g. length penalties) and add extra columns; default: unchanged."""
        return scores

    # ------------------------------------------------------------------ shared machinery
    def call_score_fn(self, item: ScoreItem) -> Any:
        """One call of the scoring function, errors turned into `ScoreError`."""
        try:
            return self.compute_score(
                data_source=item.data_source,
                solution_str=item.solution_str,
                ground_truth=item.ground_truth,
                extra_info=item.extra_info,
            )
        except NotImplementedError:
            raise  # no scorer for this data source: a configuration error, not a flaky scorer
        except Exception as exc:  # noqa: BLE001 - the error is counted and reported, see module docstring
            return ScoreError(exc, traceback.format_exc())

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
        resp_lens = response_mask.sum(-1).long().tolist()
        prompt_ids = [prompts[i][prompt_mask[i]].tolist() for i in range(len(resp_lens))]
        # response tokens are left-aligned: the first `len` positions are the generated ones
        resp_ids = [responses[i, :n].tolist() for i, n in enumerate(resp_lens)]
        prompt_strs = self.tokenizer.batch_decode(prompt_ids, skip_special_tokens=True)
        resp_strs = self.tokenizer.batch_decode(resp_ids, skip_special_tokens=True)

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
            if not isinstance(rm, dict) or "ground_truth" not in rm:
                raise ValueError(f"row {i}: reward_model={rm!r} must be a dict with a 'ground_truth' entry")
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
        raw = self.score_items(items) if items else []
        if len(raw) != len(items):
            raise RuntimeError(f"{type(self).__name__}.score_items returned {len(raw)} results for {len(items)} responses")

        extra: dict[str, list] = defaultdict(list)
        scores: list[float] = []
        dict_keys = sorted({k for r in raw if isinstance(r, dict) for k in r if k != "score"})
        for item, result in zip(items, raw):
            error = isinstance(result, ScoreError)
            if error:
                self._report_error(item, result)
                score, info = self.error_score, {}
            elif isinstance(result, dict):
                if "score" not in result:
                    raise ValueError(
                        f"the scoring function returned a dict without 'score' for row {item.index} "
                        f"(data_source={item.data_source!r}): keys {sorted(result)}"
                    )
                score, info = float(result["score"]), result
            else:
                score, info = float(result), {}
            if item.truncated and self.truncation_penalty is not None:
                score = self.truncation_penalty
            scores.append(score)
            for k in dict_keys:
                extra[k].append(info.get(k, None))
            extra["score_error"].append(error)
            extra["truncated"].append(item.truncated)

        scores = self.postprocess(items, scores, extra)
        reward_tensor = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        for item, score in zip(items, scores):
            # an empty response has no last token: its score sits on position 0 (masked anyway)
            reward_tensor[item.index, max(item.valid_response_length - 1, 0)] = score
        self._print_examples(items, scores)
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": dict(extra)}
        return reward_tensor

    def _report_error(self, item: ScoreItem, err: ScoreError) -> None:
        where = f"row {item.index} (data_source={item.data_source!r}, ground_truth={item.ground_truth!r})"
        if self.error_score is None:
            raise RuntimeError(f"the scoring function failed on {where}: {err.message}\n{err.traceback}")
        if not self._logged_first_error:
            self._logged_first_error = True
            logger.warning(
                "the scoring function failed on %s: %s; scored %s (error_score). Further errors are "
                "counted in reward/score_errors.\n%s",
                where, err.message, self.error_score, err.traceback,
            )

    def _print_examples(self, items: list[ScoreItem], scores: list[float]) -> None:
        if self.num_examine <= 0:
            return
        shown: dict[str, int] = defaultdict(int)
        for item, score in zip(items, scores):
            if shown[item.data_source] >= self.num_examine:
                continue
            shown[item.data_source] += 1
            print(
                f"[{item.data_source}] prompt={item.prompt_str!r} response={item.solution_str!r} "
                f"ground_truth={item.ground_truth!r} score={score}"
            )
