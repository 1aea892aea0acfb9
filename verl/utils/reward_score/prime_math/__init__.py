"""Math grader for the NuminaMath sources (``numina_*``), as upstream's ``prime_math`` routing.

Our own implementation of upstream's contract:

- `compute_score(model_output, ground_truth) -> (is_correct, format_correctness, extracted)`;
  ``format_correctness`` is True when the output contains ``Step 2:`` and a ``\\box`` (the PRIME
  step format); ``default_compute_score`` turns the tuple into ``float(is_correct)``.
- The answer is extracted by `match_answer`: the text after the last "answer is" / "answer:"
  marker, then the last ``\\boxed{}`` inside it, then what follows a final ``=`` / "is".
- Equality (`grade_answer`, then `grader.math_equal`): equal normalised strings, equal numbers
  (tolerance 1e-4), equal tuple elements, or sympy proving the difference zero. In the strict
  first pass an integer reference needs an integer answer and expressions sympy could hang on
  (many unknowns, towers of powers) are not evaluated; ``(a, b)`` never equals ``[a, b]``.
"""

from __future__ import annotations

import math
import re

from . import math_normalize
from .grader import math_equal, symbolic_equal

__all__ = [
    "are_equal_under_sympy",
    "compute_score",
    "count_unknown_letters_in_expr",
    "grade_answer",
    "match_answer",
    "remove_boxed",
    "should_allow_eval",
    "split_tuple",
]

_RISKY = (re.compile(r"\^\{"), re.compile(r"\^\("), re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9]{2,}"))


def remove_boxed(s: str) -> str | None:
    """``\\boxed{x}`` -> ``x``; None when `s` is not exactly one boxed expression."""
    if isinstance(s, str) and s.startswith("\\boxed{") and s.endswith("}"):
        return s[len("\\boxed{") : -1]
    return None


def _last_boxed_content(text: str) -> str | None:
    from verl.utils.reward_score.math import last_boxed_only_string
    from verl.utils.reward_score.math import remove_boxed as _strip

    boxed = last_boxed_only_string(text)
    return None if boxed is None else _strip(boxed).strip()


def match_answer(response: str) -> tuple[bool, str]:
    """(found an answer with a digit in it, the extracted answer text)."""
    text = str(response)
    found = False
    lower = text.lower()
    for marker in ("answer:", "answer is", "answers are"):
        at = lower.rfind(marker)
        if at >= 0:
            found, text = True, text[at + len(marker) :].strip()
            lower = text.lower()
    for marker in ("is answer", "is the answer", "are answers", "are the answers"):
        at = lower.rfind(marker)
        if at >= 0:
            found, text = True, text[:at].strip()
            lower = text.lower()
    boxed = _last_boxed_content(text)
    if boxed:
        found, text = True, boxed
    else:
        sentence_end = text.rfind(". ")
        if sentence_end >= 0:
            text = text[:sentence_end].strip()
        for marker in ("=", " is ", " be ", " are ", ": ", " get "):
            at = text.lower().rfind(marker)
            if at >= 0:
                found, text = True, text[at + len(marker) :].strip()
    text = text.strip().rstrip(".").strip()
    return found and any(ch.isdigit() for ch in text), text


def count_unknown_letters_in_expr(expr: str) -> int:
    """Distinct letters of `expr`, not counting those of ``sqrt`` and ``frac``."""
    stripped = expr.replace("sqrt", "").replace("frac", "")
    return len({ch for ch in stripped if ch.isalpha()})


def should_allow_eval(expr: str) -> bool:
    """False for expressions sympy may hang on: more than two unknowns or large exponents."""
    if count_unknown_letters_in_expr(expr) > 2:
        return False
    return not any(p.search(expr) for p in _RISKY)


def are_equal_under_sympy(ground_truth_normalized: str, given_normalized: str) -> bool:
    """sympy proves the two expressions equal (5 s limit; False when not safe to evaluate)."""
    expr = f"({ground_truth_normalized})-({given_normalized})"
    if not should_allow_eval(expr):
        return False
    return symbolic_equal(ground_truth_normalized, given_normalized, timeout=5.0)


def split_tuple(expr: str) -> list[str]:
    """Elements of ``(a, b)`` / ``[a, b]`` (thousands separators kept inside numbers); else ``[expr]``."""
    s = re.sub(r"(\d),(\d{3})(?!\d)", r"\1\2", expr.strip())
    if not s:
        return []
    if len(s) > 2 and s[0] in "([" and s[-1] in ")]" and not any(c in s[1:-1] for c in "()[]"):
        return [e.strip() for e in s[1:-1].split(",")]
    return [s]


_FRACTION = re.compile(r"^-?\d+/\d+$")


def _is_int_text(s: str) -> bool:
    try:
        v = float(s.replace(",", ""))
    except ValueError:
        return False
    return math.isfinite(v) and abs(v - round(v)) < 1e-7


def grade_answer(given_answer: str | None, ground_truth: str) -> bool:
    """Strict-ish equality of an extracted answer and the reference (see the module docstring)."""
    if given_answer is None:
        return False
    truth = math_normalize.normalize_answer(ground_truth)
    given = math_normalize.normalize_answer(given_answer)
    if truth is None or not given:
        return False
    if truth == given:
        return True
    truth_elems, given_elems = split_tuple(truth), split_tuple(given)
    if len(truth_elems) != len(given_elems):
        return False
    if len(truth_elems) > 1 and (truth[0], truth[-1]) != (given[0], given[-1]):
        return False  # (a, b) is not [a, b]
    for t, g in zip(truth_elems, given_elems, strict=False):
        if _FRACTION.match(t) and _FRACTION.match(g):
            ok = t == g  # unreduced fractions only match themselves
        elif _is_int_text(t) != _is_int_text(g):
            ok = False
        elif _is_int_text(t):
            ok = int(round(float(t.replace(",", "")))) == int(round(float(g.replace(",", ""))))
        else:
            ok = are_equal_under_sympy(t, g)
        if not ok:
            return False
    return True


def compute_score(model_output: str, ground_truth: str) -> tuple[bool, bool, str]:
    """(is_correct, format_correctness, extracted answer) for one response."""
    model_output, ground_truth = str(model_output), str(ground_truth)
    _, extracted = match_answer(model_output)
    format_ok = "Step 2:" in model_output and "\\box" in model_output
    if grade_answer(extracted, ground_truth):
        return True, True, extracted
    try:
        if "\\pi" in extracted or "\\pi" in ground_truth:
            correct = any(math_equal(extracted, ground_truth, timeout=True, pi=p) for p in (math.pi, 3.14))
        else:
            correct = math_equal(extracted, ground_truth, timeout=True)
    except Exception:  # noqa: BLE001 - model text never makes scoring raise
        correct = False
    return bool(correct), format_ok, extracted
