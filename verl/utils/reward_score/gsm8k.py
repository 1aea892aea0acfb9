"""GSM8K scorer (data_source ``openai/gsm8k``).

GSM8K reference solutions end with ``#### <number>``; models trained on the upstream prompt ("Let's
think step by step and output the final answer after \"####\".") answer the same way.

* ``method="strict"``: the answer is the number after the last ``####``; no ``####`` means no answer.
* ``method="flexible"``: the answer is the last number anywhere in the response.

A found answer equal to the ground truth scores ``score`` (1.0); a found but wrong answer scores
``format_score`` (0.0 by default: set it > 0 to reward the format alone); no answer scores 0.0.
Numbers are compared after removing thousands separators, a ``$`` sign and a trailing period, and
numerically (``18.00`` equals ``18``).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# Only the tail matters (the final answer) and scanning a long generation with these regexes is
# the costly part of scoring, so look at the last characters only.
_TAIL_CHARS = 300
_STRICT = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
_NUMBER = re.compile(r"-?\$?[0-9][0-9,]*(?:\.[0-9]+)?")


def _normalize(number: str) -> str | None:
    text = number.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    # canonical form: no exponent, no trailing zeros after the point, "-0" -> "0"
    value = value.normalize()
    if value == 0:
        return "0"
    out = format(value, "f")
    return out


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The normalised final answer of ``solution_str`` or None (see module docstring)."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k extraction method {method!r} is not allowed; choose 'strict' or 'flexible'")
    tail = solution_str[-_TAIL_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return _normalize(found[-1]) if found else None
    for candidate in reversed(_NUMBER.findall(tail)):
        normalized = _normalize(candidate)
        if normalized is not None:
            return normalized
    return None


def compute_score(
    solution_str: str, ground_truth, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """Score one response against the ground-truth number (a str like ``"72"`` or a number)."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    truth = _normalize(str(ground_truth))
    if truth is None:
        raise ValueError(f"openai/gsm8k: ground truth must be a number, got {ground_truth!r}")
    return score if answer == truth else format_score
