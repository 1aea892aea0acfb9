"""Rule-based scorers: gsm8k, MATH, the toy task, and the data_source dispatch."""

import sys
import types

import pytest

from verl.utils.reward_score import default_compute_score, gsm8k, known_data_sources, verl_toy
from verl.utils.reward_score import math as math_score


# ---------------------------------------------------------------------------------------------- gsm8k
@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7", 1.0),
        ("#### 1,234", "1234", 1.0),
        ("#### $18.00", "18", 1.0),
        ("#### -5", "-5", 1.0),
        ("#### 8", "7", 0.0),
        ("The answer is 7", "7", 0.0),  # strict: no #### means no answer
        ("#### 3\n...then #### 7", "7", 1.0),  # the last #### counts
    ],
)
def test_gsm8k_strict(response, truth, expected):
    assert gsm8k.compute_score(response, truth) == expected


def test_gsm8k_flexible_takes_last_number_and_format_score():
    assert gsm8k.extract_solution("I think 3, no wait, 12.", method="flexible") == "12"
    assert gsm8k.extract_solution("no digits here", method="flexible") is None
    assert gsm8k.compute_score("The answer is 7", "7", method="flexible") == 1.0
    # a wrong but well-formed answer earns format_score
    assert gsm8k.compute_score("#### 9", "7", format_score=0.1) == 0.1
    assert gsm8k.compute_score("nothing", "7", format_score=0.1) == 0.0
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_solution("#### 1", method="loose")


def test_gsm8k_bad_ground_truth_is_a_data_error():
    with pytest.raises(ValueError, match="ground truth"):
        gsm8k.compute_score("#### 7", "seven")


# ----------------------------------------------------------------------------------------------- math
def test_last_boxed_and_remove_boxed():
    text = r"first \boxed{1} then \boxed{\frac{1}{2}} done"
    assert math_score.last_boxed_only_string(text) == r"\boxed{\frac{1}{2}}"
    assert math_score.remove_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert math_score.last_boxed_only_string(r"\boxed{unbalanced") is None
    assert math_score.last_boxed_only_string("no box") is None
    assert math_score.remove_boxed(r"\fbox{3}") == "3"
    # model output is arbitrary: malformed or stray boxes are skipped, never an exception
    assert math_score.last_boxed_only_string(r"\boxed{4} and then \boxed5 and {x}") == r"\boxed{4}"
    assert math_score.last_boxed_only_string(r"answer \fbox 3 {y}") is None
    assert math_score.last_boxed_only_string(r"\boxed{7} (the \boxed{ command") == r"\boxed{7}"
    assert math_score.last_boxed_only_string(r"so \boxed {1/2} done") == r"\boxed{1/2}"
    assert math_score.last_boxed_only_string(r"so $\boxed 5$ done") == r"\boxed 5"
    assert math_score.last_boxed_only_string("\\boxed   ") is None
    for text in (r"\boxed5 and {x}", r"answer \fbox 3 {y}", r"\boxed", r"\boxed{", "\\boxed $", r"}{\fbox}"):
        assert math_score.compute_score(text, "5") == 0.0
    assert math_score.compute_score(r"\boxed {5} (written with \boxed)", "5") == 1.0


@pytest.mark.parametrize(
    "a, b",
    [
        (r"\frac12", r"\frac{1}{2}"),
        (r"\dfrac{1}{2}", r"\frac{1}{2}"),
        ("0.5", r"\frac{1}{2}"),
        ("1/2", r"\frac{1}{2}"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"90^\circ", "90"),
        (r"\$5", "5"),
        (r"10\%", "10"),
        (r"5 \text{ cm}", "5"),
        (r"x = 3", "3"),
        (r"\sqrt2", r"\sqrt{2}"),
        ("2.50", "2.5"),
        (".5", r"\frac{1}{2}"),
    ],
)
def test_math_normaliser_equivalences(a, b):
    assert math_score.is_equiv(a, b)


def test_math_normaliser_keeps_different_answers_apart():
    assert not math_score.is_equiv("3", "4")
    assert not math_score.is_equiv(r"\frac{1}{3}", r"\frac{1}{2}")
    assert not math_score.is_equiv(None, "1")


def test_math_compute_score(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # force the hand normaliser
    assert math_score.compute_score(r"so \boxed{\dfrac{1}{2}}.", r"\frac12") == 1.0
    assert math_score.compute_score(r"so \boxed{3}", "4") == 0.0
    assert math_score.compute_score("the answer is 3", "3") == 0.0
    assert math_score.compute_score(r"\boxed{3}", r"\boxed{3}") == 1.0  # boxed ground truth is unwrapped


def test_math_uses_math_verify_when_importable(monkeypatch):
    calls = []
    fake = types.ModuleType("math_verify")
    # called with math_verify's signal-based timeouts off (they fail outside the main thread)
    fake.parse = lambda s, parsing_timeout=5: calls.append(("parse", parsing_timeout)) or [s]
    fake.verify = lambda gold, pred, timeout_seconds=5: calls.append((gold, pred, timeout_seconds)) or True
    monkeypatch.setitem(sys.modules, "math_verify", fake)
    assert math_score.compute_score(r"\boxed{x^2}", "y") == 1.0  # the fake says "equal" to anything
    assert calls == [("parse", None), ("parse", None), ([r"\boxed{y}"], [r"\boxed{x^2}"], None)]
    # a parser failure falls back to the normaliser
    fake.parse = lambda s, parsing_timeout=5: (_ for _ in ()).throw(RuntimeError("bad latex"))
    assert math_score.compute_score(r"\boxed{x^2}", "y") == 0.0


# ------------------------------------------------------------------------------------------------ toy
@pytest.mark.parametrize(
    "response, expected",
    [
        ("132", 1.0),
        (" 132 \n", 1.0),
        ("132<|end|>", 1.0),  # decoded without skipping special tokens
        ("0132", 1.0),  # same integer
        ("22", 0.0),  # the carry-dropping mistake
        ("131", 0.0),
        ("132 133", 0.0),  # two numbers: not an answer
        ("the sum is 132", 0.0),
        ("", 0.0),
        ("<|end|>", 0.0),
        ("13a2", 0.0),
        ("+132", 1.0),
        ("9" * 5000, 0.0),  # longer than int()'s 4300-digit limit: scores 0, never raises
    ],
)
def test_toy_addition_scorer(response, expected):
    assert verl_toy.compute_score(response, "132") == expected


def test_toy_scorer_canonical_integers():
    assert verl_toy.compute_score("-0", "0") == 1.0 and verl_toy.compute_score("-007", "-7") == 1.0
    assert verl_toy.compute_score("7", "-7") == 0.0 and verl_toy.compute_score("-7", "+7") == 0.0
    assert verl_toy.extract_answer("1" + "0" * 5000) == "1" + "0" * 5000


def test_toy_scorer_rejects_bad_ground_truth_and_unknown_task():
    with pytest.raises(ValueError, match="ground truth"):
        verl_toy.compute_score("1", "one")
    with pytest.raises(NotImplementedError, match="addition"):
        verl_toy.compute_score("1", "1", task="sorting")


# -------------------------------------------------------------------------------------------- dispatch
def test_default_compute_score_dispatches_by_data_source(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)
    assert default_compute_score("openai/gsm8k", "#### 72", "72") == 1.0
    for src in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        assert default_compute_score(src, r"\boxed{\frac{3}{4}}", r"\frac34") == 1.0
        assert default_compute_score(src, r"\boxed{1}", "2") == 0.0
    assert default_compute_score("verl_toy/addition", "132", "132", extra_info={"a": 47, "b": 85}) == 1.0
    assert default_compute_score("verl_toy/addition", "22", "132", sandbox_fusion_url=None) == 0.0


def test_unknown_data_source_names_it_and_lists_known_ones():
    with pytest.raises(NotImplementedError) as e:
        default_compute_score("my/dataset", "x", "y")
    msg = str(e.value)
    assert "my/dataset" in msg
    for src in known_data_sources():
        assert src in msg
    assert "openai/gsm8k" in known_data_sources() and "verl_toy/addition" in known_data_sources()
