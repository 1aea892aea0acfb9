"""Exact-match QA scorer for the Search-R1 sources (``searchR1_nq``, ``searchR1_hotpotqa``...),
upstream's contract: the answer is the last ``<answer>...</answer>``; `compute_score` gives
`score` (1.0) when it matches one of ``ground_truth["target"]`` after normalisation (lower case,
no punctuation, no articles, single spaces), `format_score` (0.0) when it does not, 0 without an
answer tag, and ``score / 4`` for a match in a response spamming more than 10 answer tags.
`compute_score_subem` accepts a target contained in the answer."""

from __future__ import annotations

import re
import string

__all__ = [
    "compute_score",
    "compute_score_subem",
    "count_answer_tags",
    "em_check",
    "extract_solution",
    "normalize_answer",
    "subem_check",
]

_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(s: str) -> str:
    text = str(s).lower().translate(_PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _targets(golden_answers) -> list[str]:
    if isinstance(golden_answers, str):
        return [golden_answers]
    return [str(g) for g in golden_answers]


def em_check(prediction: str, golden_answers) -> int:
    pred = normalize_answer(prediction)
    return int(any(normalize_answer(g) == pred for g in _targets(golden_answers)))


def subem_check(prediction: str, golden_answers) -> int:
    pred = normalize_answer(prediction)
    return int(any(normalize_answer(g) in pred for g in _targets(golden_answers)))


def extract_solution(solution_str: str) -> str | None:
    found = re.findall(r"<answer>(.*?)</answer>", solution_str, re.DOTALL)
    return found[-1].strip() if found else None


def count_answer_tags(text: str) -> tuple[int, int]:
    return text.count("<answer>"), text.count("</answer>")


def _target_of(ground_truth):
    if isinstance(ground_truth, dict):
        if "target" not in ground_truth:
            raise ValueError(
                f"search-R1 ground truth must be a dict with a 'target' list, got keys {sorted(ground_truth)}"
            )
        return ground_truth["target"]
    return ground_truth


def compute_score(
    solution_str: str, ground_truth, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    answer = extract_solution(solution_str)
    if answer is None:
        return 0
    if em_check(answer, _target_of(ground_truth)):
        opened, closed = count_answer_tags(solution_str)
        return score / 4 if opened > 10 or closed > 10 else score
    return format_score


def compute_score_subem(
    solution_str: str, ground_truth, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    answer = extract_solution(solution_str)
    if answer is None:
        return 0
    return score if subem_check(answer, _target_of(ground_truth)) else format_score
