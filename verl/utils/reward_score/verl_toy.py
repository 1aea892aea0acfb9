"""Rule-based scorer of the project's toy tasks (data sources ``verl_toy/<task>``).

For ``verl_toy/calculator`` (multi-turn, tool use) the response ends with ``=<product>``: the text after
the last ``=`` must be exactly the integer (tool calls and results before it are ignored).

For ``verl_toy/addition`` the answer must be the decimal sum and nothing else: surrounding whitespace
and a trailing end-of-turn marker that survived decoding are ignored, but any other text (a second
number, words, a missing answer) scores 0. Strictness is deliberate: the reward is what RL optimises,
and a lenient "first number anywhere" rule would reward answers that merely contain the sum.
"""

from __future__ import annotations

import re

# Markers a decoder may leave when special tokens are not skipped.
_TRAILING_MARKERS = ("<|end|>", "<|pad|>")
_INTEGER = re.compile(r"[+-]?\d+")

KNOWN_TASKS = ("addition", "calculator")


def extract_answer(solution_str: str) -> str | None:
    """The integer the response states, or None when the response is not exactly one integer."""
    text = solution_str
    stripped = True
    while stripped:
        stripped = False
        text = text.strip()
        for marker in _TRAILING_MARKERS:
            if text.endswith(marker):
                text = text[: -len(marker)]
                stripped = True
    if not _INTEGER.fullmatch(text):
        return None
    return _canonical_integer(text)


def _canonical_integer(text: str) -> str:
    """``"+007"`` -> ``"7"``, ``"-0"`` -> ``"0"``: the same as ``str(int(text))`` but without int(),
    which refuses strings of more than 4300 digits (a long generation must score 0, not raise)."""
    negative = text.startswith("-")
    digits = text.lstrip("+-").lstrip("0") or "0"
    return "-" + digits if negative and digits != "0" else digits


def compute_score(solution_str: str, ground_truth, task: str = "addition") -> float:
    """1.0 when the response is exactly the ground-truth integer, else 0.0.

    Raises ValueError when ``ground_truth`` itself is not an integer (a data error, not a wrong answer).
    """
    if task not in KNOWN_TASKS:
        raise NotImplementedError(f"verl_toy task {task!r} has no scorer; known tasks: {', '.join(KNOWN_TASKS)}")
    truth = str(ground_truth).strip()
    if not _INTEGER.fullmatch(truth):
        raise ValueError(f"verl_toy/{task}: ground truth must be an integer string, got {ground_truth!r}")
    text = str(solution_str)
    if task == "calculator":
        # the response spans the whole conversation (tool calls and results); the final answer is
        # written "=<integer>" and must end the response
        at = text.rfind("=")
        if at < 0:
            return 0.0
        text = text[at + 1 :]
    answer = extract_answer(text)
    return 1.0 if answer is not None and answer == _canonical_integer(truth) else 0.0
