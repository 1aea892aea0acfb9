"""Geometry3K scorer (``hiyouga/geometry3k``), upstream's contract: `compute_score(predict_str,
ground_truth, use_boxed=True, format_score=0.1) = (1 - format_score) * acc + format_score * format`.

``format`` is 1.0 when the response is ``<think>...</think>`` followed by a ``\\boxed{}``;
``acc`` is 1.0 when the boxed answer (or the whole response with ``use_boxed=False``) equals the
ground truth under the MATH normaliser / numeric / symbolic comparison (upstream uses the
`mathruler` package here; this is our own grader).
"""

from __future__ import annotations

import re

from verl.utils.reward_score.math import is_equiv, last_boxed_only_string, remove_boxed
from verl.utils.reward_score.prime_math.grader import math_equal

__all__ = ["acc_reward", "compute_score", "format_reward"]

_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(predict_str: str) -> float:
    return 1.0 if _FORMAT.fullmatch(predict_str) else 0.0


def acc_reward(predict_str: str, ground_truth: str, use_boxed: bool = True) -> float:
    if use_boxed:
        boxed = last_boxed_only_string(predict_str)
        answer = remove_boxed(boxed) if boxed is not None else ""
    else:
        answer = predict_str
    if not answer.strip():
        return 0.0
    return 1.0 if is_equiv(answer, str(ground_truth)) or math_equal(answer, str(ground_truth), timeout=True) else 0.0


def compute_score(predict_str: str, ground_truth: str, use_boxed: bool = True, format_score: float = 0.1) -> float:
    return (1.0 - format_score) * acc_reward(predict_str, ground_truth, use_boxed) + format_score * format_reward(
        predict_str
    )
