"""First, cheap normalisation of a final answer (before any symbolic comparison).

`normalize_answer` maps surface variants of the same LaTeX answer to one string: it removes a
``\\text{...}`` wrapper, ``$``, ``\\left``/``\\right``, spaces, degree marks, trailing units written
as ``\\text{ cm}``, thousands separators, and rewrites ``\\dfrac``/``\\tfrac``/``\\frac12``/``a/b``
fractions and ``\\sqrt2`` into one canonical form (our `verl.utils.reward_score.math.strip_string`).
"""

from __future__ import annotations

import re

from verl.utils.reward_score.math import strip_string

__all__ = ["normalize_answer"]

_TEXT_WRAPPER = re.compile(r"^\\text\{(?P<inner>.*)\}$")


def normalize_answer(answer: str | None) -> str | None:
    """The canonical string of `answer`, or None for None (never raises on arbitrary text)."""
    if answer is None:
        return None
    text = str(answer).strip()
    wrapped = _TEXT_WRAPPER.match(text)
    if wrapped:
        text = wrapped.group("inner")
    try:
        return strip_string(text)
    except Exception:  # noqa: BLE001 - odd model text: fall back to the raw answer
        return text
