"""`dapo`: per-sample scoring plus DAPO's soft overlong penalty."""

from __future__ import annotations

from verl.experimental.reward_loop.reward_manager.base import config_get, reward_kwargs_of
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.experimental.reward_loop.reward_manager.registry import register
from verl.trainer.ppo.core_algos import compute_overlong_penalty

_OVERLONG_KEYS = ("enable", "len", "penalty_factor", "log")


@register("dapo")
class DAPORewardManager(NaiveRewardManager):
    """Naive scoring + overlong penalty.

    `reward.reward_kwargs.overlong_buffer_cfg` has keys `enable`, `len` (the buffer L_cache in
    tokens, 0 < len <= max_resp_len), `penalty_factor` and `log` (add `overlong_reward` and
    `overlong` to the extra info). A response longer than `max_resp_len - len` tokens loses
    `(length - (max_resp_len - len)) / len * penalty_factor`, at most `penalty_factor`.
    `reward.reward_kwargs.max_resp_len` defaults to `data.max_response_length`.
    """

    reward_kwargs_keys = (*NaiveRewardManager.reward_kwargs_keys, "overlong_buffer_cfg", "max_resp_len")

    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score, reward_router_address, reward_model_tokenizer)
        kwargs = reward_kwargs_of(config)
        cfg = dict(kwargs.get("overlong_buffer_cfg") or {})
        unknown = sorted(set(cfg) - set(_OVERLONG_KEYS))
        if unknown:
            raise ValueError(
                f"reward.reward_kwargs.overlong_buffer_cfg has unknown key(s) {unknown}; "
                f"accepted: {list(_OVERLONG_KEYS)}"
            )
        self.overlong_buffer_cfg = cfg or None
        self.overlong_enable = bool(cfg.get("enable", False))
        self.overlong_len = int(cfg.get("len", 0) or 0)
        self.overlong_factor = float(cfg.get("penalty_factor", 1.0))
        self.overlong_log = bool(cfg.get("log", False))
        self.max_resp_len = kwargs.get("max_resp_len")
        if self.overlong_enable:
            if self.max_resp_len is None:
                self.max_resp_len = config_get(config, "data.max_response_length")
            if self.max_resp_len is None:
                raise ValueError(
                    "reward.reward_kwargs.overlong_buffer_cfg.enable=true: max_resp_len must be provided "
                    "(reward.reward_kwargs.max_resp_len or data.max_response_length)"
                )
            if not 0 < self.overlong_len <= int(self.max_resp_len):
                raise ValueError(
                    f"reward.reward_kwargs.overlong_buffer_cfg.len={self.overlong_len} must be in "
                    f"(0, max_resp_len={self.max_resp_len}]"
                )

    def postprocess(self, sample, result: dict) -> dict:
        if self.overlong_enable:
            penalty = compute_overlong_penalty(
                sample.valid_response_length, int(self.max_resp_len), self.overlong_len, self.overlong_factor
            )
            result["reward_score"] += penalty
            if self.overlong_log:
                result["reward_extra_info"].update(overlong_reward=penalty, overlong=penalty < 0)
        return result
