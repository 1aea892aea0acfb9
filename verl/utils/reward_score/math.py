"""MATH-style scorer: the last ``\\boxed{...}`` of the response against the reference answer.

Used for ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500`` and
similar sources. When the optional package ``math_verify`` is importable it decides equivalence
(symbolic comparison); otherwise both answers go through a hand-written LaTeX normaliser (fractions,
``\\left``/``\\right``, units in ``\\text{}``, degrees, dollar signs, spaces, ``0.5`` vs ``.5``,
``a/b`` vs ``\\frac{a}{b}``, ``\\sqrt2`` vs ``\\sqrt{2}``) and are compared as strings.

Score: 1.0 when equivalent, 0.0 otherwise (also when the response has no ``\\boxed{}``).

math_verify is called with its own signal-based timeouts switched off (``parsing_timeout=None``,
``timeout_seconds=None``): they use SIGALRM, which only works in a main thread, and elsewhere (a
threaded reward manager, a Ray actor) every call would fail. The deadline is the reward manager's
per-call ``reward_model.reward_kwargs.timeout`` instead. A call where math_verify raises or cannot
parse either answer falls back to the normaliser; those fallbacks are counted
(``math_verify_fallbacks()``, reported by the reward managers as ``reward/math_verify_fallbacks``)
and the first one of a process is logged.
"""

from __future__ import annotations

import logging
import re

logger = logging.getLogger(__name__)

_FALLBACKS = 0  # math_verify calls that raised or could not parse, in this process

__all__ = [
    "math_verify_fallbacks",
    "compute_score",
    "last_boxed_only_string",
    "remove_boxed",
    "strip_string",
    "is_equiv",
]


def last_boxed_only_string(text: str) -> str | None:
    """The last well-formed ``\\boxed{...}`` / ``\\fbox{...}`` (braces balanced) or ``\\boxed ...``
    (up to the next ``$``) in ``text``; None when there is none.

    Model output is arbitrary text: an occurrence that is not followed by a complete answer (a
    stray ``\\boxed`` in prose, an unclosed brace) is skipped, so `remove_boxed` of the result
    never fails.
    """
    end = len(text)
    while True:
        idx = max(text.rfind("\\boxed", 0, end), text.rfind("\\fbox", 0, end))
        if idx < 0:
            return None
        found = _boxed_at(text, idx)
        if found is not None:
            return found
        end = idx


def _boxed_at(text: str, idx: int) -> str | None:
    """The boxed expression starting at ``text[idx]`` (``\\boxed``/``\\fbox``), or None if incomplete."""
    prefix = "\\boxed" if text.startswith("\\boxed", idx) else "\\fbox"
    start = idx + len(prefix)
    while start < len(text) and text[start] == " ":
        start += 1
    if start == len(text) or text[start] != "{":
        if prefix == "\\boxed" and start > idx + len(prefix):
            # "\boxed 5$" style: up to the next "$" or the end of the text
            stop = text.find("$", start)
            answer = text[start : len(text) if stop < 0 else stop].strip()
            return "\\boxed " + answer if answer else None
        return None
    depth = 0
    for k in range(start, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return prefix + text[start : k + 1]
    return None  # unbalanced braces: no complete answer


def remove_boxed(boxed: str) -> str:
    """``\\boxed{x}`` -> ``x``; ``\\boxed x`` -> ``x``; ``\\fbox{x}`` -> ``x``."""
    for prefix in ("\\boxed ",):
        if boxed.startswith(prefix):
            return boxed[len(prefix) :]
    for prefix in ("\\boxed{", "\\fbox{"):
        if boxed.startswith(prefix) and boxed.endswith("}"):
            return boxed[len(prefix) : -1]
    raise ValueError(f"not a boxed expression: {boxed!r}")


def _fix_fracs(s: str) -> str:
    # \frac12 -> \frac{1}{2}, \frac1{72} -> \frac{1}{72}
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{") or len(part) < 2:
            out += part
            continue
        a, b, rest = part[0], part[1], part[2:]
        if b == "{":
            out += "{" + a + "}" + b + rest
        else:
            out += "{" + a + "}{" + b + "}" + rest
    return out


def _fix_a_slash_b(s: str) -> str:
    m = re.fullmatch(r"(-?\d+)/(\d+)", s)
    return f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}" if m else s


def _fix_sqrt(s: str) -> str:
    return re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)


def _remove_right_units(s: str) -> str:
    # "5 \text{ cm}" -> "5"
    if "\\text{ " in s:
        return s.split("\\text{ ")[0]
    return s


def strip_string(s: str) -> str:
    """Normalise a LaTeX answer so that equivalent spellings compare equal as strings."""
    s = s.replace("\n", "").replace("\\!", "")
    s = s.replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    s = _remove_right_units(s)
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    s = s.replace("\\mbox", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    # "x = 5" -> "5" when the left side is a short variable name
    if s.count("=") == 1 and len(s.split("=")[0].strip()) <= 2:
        s = s.split("=")[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    s = _fix_a_slash_b(s)
    # trailing zeros of a plain decimal: 2.50 -> 2.5, 3.0 -> 3
    if re.fullmatch(r"-?\d+\.\d+", s):
        s = s.rstrip("0").rstrip(".")
    s = s.rstrip(".")
    return s


def is_equiv(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    return strip_string(a) == strip_string(b)


def math_verify_fallbacks() -> int:
    """Number of comparisons in this process where math_verify failed and the normaliser decided."""
    return _FALLBACKS


def _count_fallback(reason: str) -> None:
    global _FALLBACKS
    _FALLBACKS += 1
    if _FALLBACKS == 1:
        logger.warning(
            "math_verify could not decide (%s); the LaTeX normaliser decides instead. Further "
            "fallbacks are counted in reward/math_verify_fallbacks",
            reason,
        )


def _math_verify_equal(answer_latex: str, truth: str) -> bool | None:
    """math_verify's verdict, or None when the package is not installed or cannot decide (counted)."""
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    try:
        # no signal-based timeouts (see the module docstring): the reward manager bounds the call
        gold = parse("\\boxed{" + truth + "}", parsing_timeout=None)
        pred = parse("\\boxed{" + answer_latex + "}", parsing_timeout=None)
        if not gold or not pred:
            _count_fallback("an answer did not parse")
            return None
        return bool(verify(gold, pred, timeout_seconds=None))
    except Exception as exc:  # noqa: BLE001 - math_verify raises on exotic LaTeX; the normaliser decides
        _count_fallback(f"{type(exc).__name__}: {exc}")
        return None


def compute_score(solution_str: str, ground_truth) -> float:
    """1.0 when the last boxed answer of ``solution_str`` equals ``ground_truth``, else 0.0."""
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return 0.0
    answer = remove_boxed(boxed)
    truth = str(ground_truth)
    if truth.lstrip().startswith(("\\boxed", "\\fbox")):
        inner = last_boxed_only_string(truth)
        truth = remove_boxed(inner) if inner else truth
    verdict = _math_verify_equal(answer, truth)
    if verdict is None:
        verdict = is_equiv(answer, truth)
    return 1.0 if verdict else 0.0
