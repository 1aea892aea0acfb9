"""NaiveRewardManager under upstream main's names: `compute_score_timeout` and `_score_timeout`,
and a tokenizer that only has `decode`."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from verl import DataProto
from verl.workers.reward_manager.naive import NaiveRewardManager, _score_timeout


class _DecodeOnly:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "x" * len(ids)


def _batch(n=2):
    return DataProto.from_single_dict(
        {
            "prompts": torch.zeros((n, 2), dtype=torch.long),
            "responses": torch.ones((n, 3), dtype=torch.long),
            "attention_mask": torch.ones((n, 5), dtype=torch.long),
            "data_source": np.array(["d"] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": str(i)} for i in range(n)], dtype=object),
        }
    )


def test_score_timeout_interrupts_the_body_and_restores_the_handler():
    with pytest.raises(TimeoutError, match="timeout of 0.2 s"):
        with _score_timeout(0.2):
            time.sleep(5)
    with _score_timeout(None), _score_timeout(0):
        time.sleep(0.01)  # no limit: nothing installed


def test_compute_score_timeout_scores_a_hung_call_as_an_error():
    def score(data_source, solution_str, ground_truth, extra_info=None):
        if ground_truth == "0":
            time.sleep(5)
        return float(len(solution_str))

    manager = NaiveRewardManager(_DecodeOnly(), compute_score=score, compute_score_timeout=0.2)
    assert manager.timeout == manager.compute_score_timeout == 0.2
    out = manager(_batch(), return_dict=True)
    # sample 0 timed out: error_score 0 on its last token; sample 1 scored len("xxx") = 3
    assert out["reward_tensor"].sum(-1).tolist() == [0.0, 3.0]
    assert out["reward_extra_info"]["score_timeout"] == [True, False]


def test_compute_score_timeout_none_or_zero_is_unbounded_and_conflicts_are_named():
    assert NaiveRewardManager(_DecodeOnly(), compute_score_timeout=None).timeout is None
    assert NaiveRewardManager(_DecodeOnly(), compute_score_timeout=0).timeout is None
    assert NaiveRewardManager(_DecodeOnly()).timeout == NaiveRewardManager.DEFAULT_TIMEOUT_S
    with pytest.raises(ValueError, match="compute_score_timeout .* or timeout, not both"):
        NaiveRewardManager(_DecodeOnly(), compute_score_timeout=1.0, timeout=2.0)
