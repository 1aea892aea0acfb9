"""`dapo`: per-response scoring plus DAPO's soft overlong penalty."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verl.trainer.ppo.core_algos import compute_overlong_penalty
from verl.workers.reward_manager.abstract import AbstractRewardManager, ScoreItem
from verl.workers.reward_manager.registry import register

_OVERLONG_KEYS = ("enable", "len", "penalty_factor", "log")


@register("dapo")
class DAPORewardManager(AbstractRewardManager):
    """Naive scoring + overlong penalty.

    `overlong_buffer_cfg` (from `reward_model.reward_kwargs.overlong_buffer_cfg`) has keys
    `enable` (bool), `len` (buffer length L_cache in tokens, 0 < len <= max_resp_len),
    `penalty_factor` (float >= 0) and `log` (bool: add the `overlong_reward` and `overlong`
    columns to reward_extra_info). `max_resp_len` defaults to `data.max_response_length`.
    """

    def __init__(
        self,
        tokenizer,
        num_examine: int = 0,
        compute_score: Callable | None = None,
        reward_fn_key: str = "data_source",
        max_resp_len: int | None = None,
        overlong_buffer_cfg: dict | None = None,
        **kwargs,
    ):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)
        cfg = dict(overlong_buffer_cfg or {})
        unknown = sorted(set(cfg) - set(_OVERLONG_KEYS))
        if unknown:
            raise ValueError(
                f"reward.reward_kwargs.overlong_buffer_cfg has unknown key(s) {unknown}; accepted: "
                f"{list(_OVERLONG_KEYS)}"
            )
        self.overlong_enable = bool(cfg.get("enable", False))
        self.overlong_len = int(cfg.get("len", 0) or 0)
        self.overlong_factor = float(cfg.get("penalty_factor", 1.0))
        self.overlong_log = bool(cfg.get("log", False))
        self.max_resp_len = max_resp_len
        if self.overlong_enable:
            if max_resp_len is None:
                raise ValueError(
                    "dapo overlong penalty: max_resp_len must be provided (reward.reward_kwargs.max_resp_len or "
                    "data.max_response_length)"
                )
            if not 0 < self.overlong_len <= max_resp_len:
                raise ValueError(
                    f"reward.reward_kwargs.overlong_buffer_cfg.len={self.overlong_len} must be in "
                    f"(0, max_resp_len={max_resp_len}]: max_resp_len must be larger than overlong_buffer.len"
                )
            if self.overlong_factor < 0:
                raise ValueError(f"overlong_buffer_cfg.penalty_factor={self.overlong_factor} must be >= 0")

    def score_items(self, items: list[ScoreItem]) -> list[Any]:
        return self.run_bounded([self.score_kwargs(it) for it in items])

    def postprocess(self, items: list[ScoreItem], scores: list[float], extra: dict[str, list]) -> list[float]:
        if not self.overlong_enable:
            return scores
        out = []
        for item, score in zip(items, scores, strict=False):
            pen = compute_overlong_penalty(
                item.valid_response_length, self.max_resp_len, self.overlong_len, self.overlong_factor
            )
            out.append(score + pen)
            if self.overlong_log:
                extra["overlong_reward"].append(pen)
                extra["overlong"].append(pen < 0)
        return out
