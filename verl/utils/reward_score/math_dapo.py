"""DAPO-style math scorer (data sources ``math_dapo``, ``math``, ``math_dapo_reasoning``, ``aime*``).

Upstream's contract: `compute_score(solution_str, ground_truth, strict_box_verify=False,
pause_tokens_index=None)` looks at the last 300 characters of the response and returns
``{"score": 1.0 | -1.0, "acc": bool, "pred": str}`` (wrong answers are penalised with -1).

The answer is the last ``Answer: ...`` line (case-insensitive); when there is none, the last
``\\boxed{}`` of the final 100 characters. Both sides go through `normalize_final_answer` and must
then be equal strings. With ``strict_box_verify=True`` only the boxed answer counts, compared
verbatim (after the last pause token when `pause_tokens_index` is given).
"""

from __future__ import annotations

import re

from verl.utils.reward_score.math import last_boxed_only_string
from verl.utils.reward_score.math import remove_boxed as _remove_boxed

__all__ = [
    "compute_score",
    "is_correct_minerva",
    "is_correct_strict_box",
    "last_boxed_only_string",
    "normalize_final_answer",
    "remove_boxed",
    "verify",
]

_ANSWER_LINE = r"(?i)Answer\s*:\s*([^\n]+)"
_UNIT_WORDS = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
)
_LATEX_NOISE = (
    "\\ldots",
    "\\dots",
    "\\text{s}",
    "\\text{.}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
)


def remove_boxed(s: str) -> str:
    """``\\boxed{x}`` -> ``x`` (ValueError naming the text otherwise)."""
    if not (s.startswith("\\boxed{") and s.endswith("}")):
        raise ValueError(f"box error: {s!r} is not a \\boxed{{...}} expression")
    return _remove_boxed(s)


def normalize_final_answer(final_answer: str) -> str:
    """Canonical text of a final answer: the part after the last ``=``, without spaces, ``$``,
    articles, unit words, ``\\text{}``/``\\textbf{}``/``\\overline{}``/``\\boxed{}`` wrappers and
    LaTeX spacing; ``\\fracab`` -> ``\\frac{a}{b}``, ``\\sqrta`` -> ``\\sqrt{a}``; ``1,000`` -> ``1000``."""
    s = final_answer.split("=")[-1]
    for before, after in (
        ("an ", ""),
        ("a ", ""),
        (".$", "$"),
        ("\\$", ""),
        ("\\ ", ""),
        (" ", ""),
        ("mbox", "text"),
        (",\\text{and}", ","),
        ("\\text{and}", ","),
        ("\\text{m}", "\\text{}"),
    ):
        s = s.replace(before, after)
    for noise in (*_UNIT_WORDS, *_LATEX_NOISE):
        s = s.replace(noise, "")
    s = re.sub(r"^.*?\$(.*?)\$.*$", r"$\1$", s)
    for wrapper in ("text", "textbf", "overline"):
        s = re.sub(r"\\" + wrapper + r"\{(.*?)\}", r"\1", s)
    s = re.sub(r"\\boxed\{(.*)\}", r"\1", s)
    s = re.sub(r"frac([^{])(.)", r"frac{\1}{\2}", s)
    s = re.sub(r"sqrt([^{])", r"sqrt{\1}", s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def is_correct_minerva(
    solution_str: str, gt: str, gt_need_extract: bool = False, answer_pattern: str = _ANSWER_LINE
) -> tuple[bool, str]:
    """(normalised ``Answer:`` line == normalised truth, the normalised prediction or ``[INVALID]``)."""
    found = re.findall(answer_pattern, solution_str)
    pred = normalize_final_answer(found[-1]) if found else "[INVALID]"
    if gt_need_extract:
        boxed = last_boxed_only_string(gt)
        gt = remove_boxed(boxed) if boxed else gt
    return pred == normalize_final_answer(gt), pred


def is_correct_strict_box(pred: str, gt: str, pause_tokens_index: list[int] | None = None) -> tuple[int, str | None]:
    """(1 or -1, the boxed answer of the last 100 characters, or None)."""
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index needs 4 entries, got {len(pause_tokens_index)}")
        pred = pred[pause_tokens_index[-1] - 100 :]
    else:
        pred = pred[-100:]
    boxed = last_boxed_only_string(pred)
    extracted = _remove_boxed(boxed) if boxed is not None else None
    return (1 if extracted == gt else -1), extracted


def verify(
    solution_str: str, answer: str, strict_box_verify: bool = False, pause_tokens_index: list[int] | None = None
) -> tuple[bool, str | None]:
    """(correct, prediction): the ``Answer:`` line first, the boxed answer as fallback."""
    if strict_box_verify:
        score, pred = is_correct_strict_box(solution_str, answer, pause_tokens_index)
        return score == 1, pred
    correct, pred = is_correct_minerva(solution_str, answer)
    if pred != "[INVALID]":
        return correct, pred
    _, boxed = is_correct_strict_box(solution_str, answer, pause_tokens_index)
    if boxed is not None:
        boxed = normalize_final_answer(boxed)
        return boxed == normalize_final_answer(answer), boxed
    return correct, pred


def compute_score(
    solution_str: str, ground_truth: str, strict_box_verify: bool = False, pause_tokens_index: list[int] | None = None
) -> dict:
    """``{"score": 1.0 or -1.0, "acc": bool, "pred": str}`` for one response."""
    correct, pred = verify(str(solution_str)[-300:], str(ground_truth), strict_box_verify, pause_tokens_index)
    return {"score": 1.0 if correct else -1.0, "acc": bool(correct), "pred": pred}
