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


# -------------------------------------------------------------------------------------------- upstream routing
def test_routing_of_upstream_data_sources():
    # math_dapo family: dict with +-1 score (wrong answers are penalised)
    for src in ("math_dapo", "math", "math_dapo_reasoning", "aime2024"):
        right = default_compute_score(src, "... so\nAnswer: 1,000", "1000")
        assert right == {"score": 1.0, "acc": True, "pred": "1000"}, src
        wrong = default_compute_score(src, "Answer: 12", "13")
        assert wrong["score"] == -1.0 and wrong["acc"] is False
    # no "Answer:" line: the boxed answer of the tail counts
    assert default_compute_score("math", r"thus \boxed{\frac{1}{2}}", r"\frac{1}{2}")["acc"] is True
    # prime_math (numina_*): tuple -> float(is_correct)
    assert default_compute_score("numina_olympiads", r"The answer is \boxed{\frac{1}{2}}", "0.5") == 1.0
    assert default_compute_score("numina_cn_k12", r"\boxed{x^2+2x+1}", "(x+1)^2") == 1.0
    assert default_compute_score("numina_amc_aime", "the answer is 7", "8") == 0.0
    # geometry3k: 0.9 * acc + 0.1 * format
    assert default_compute_score("hiyouga/geometry3k", r"<think>r=2</think> \boxed{4\pi}", r"4\pi") == pytest.approx(
        1.0
    )
    assert default_compute_score("hiyouga/geometry3k", r"\boxed{4\pi}", r"4\pi") == pytest.approx(0.9)
    assert default_compute_score("hiyouga/geometry3k", r"<think>x</think> \boxed{5}", "4") == pytest.approx(0.1)
    # search-R1: exact match of the last <answer> against any target after normalisation
    gt = {"target": ["The Eiffel Tower", "Eiffel tower"]}
    assert default_compute_score("searchR1_nq", "<answer>x</answer> <answer>eiffel tower!</answer>", gt) == 1.0
    assert default_compute_score("searchR1_hotpotqa", "<answer>Louvre</answer>", gt) == 0.0
    assert default_compute_score("searchR1_nq", "no tags", gt) == 0.0
    assert default_compute_score("searchR1_nq", "<answer>Eiffel Tower</answer>" * 11, gt) == 0.25  # tag spam
    # gsm8k keeps its extraction method keyword
    assert default_compute_score("openai/gsm8k", "it is 72", "72", method="flexible") == 1.0
    assert default_compute_score("openai/gsm8k", "it is 72", "72") == 0.0


def test_code_sources_need_a_sandbox_url():
    from verl.utils.reward_score import sandbox_fusion

    with pytest.raises(ValueError, match="sandbox URL"):
        default_compute_score("apps", "```python\nprint(1)\n```", '{"inputs": [""], "outputs": ["1"]}')
    with pytest.raises(ValueError, match="reward_model.sandbox_fusion.url"):
        sandbox_fusion.compute_score(None, None, None, "```python\nprint(1)\n```", {"inputs": [""], "outputs": ["1"]})


def test_sandbox_fusion_scores_against_a_fake_service(monkeypatch):
    import json

    import requests

    from verl.utils.reward_score import sandbox_fusion

    calls = []

    class FakeResponse:
        def __init__(self, payload):
            self.payload = payload

        def raise_for_status(self):
            pass

        def json(self):
            return self.payload

    def fake_post(url, json=None, timeout=None):  # noqa: A002 - requests' keyword
        calls.append((url, json))
        # the "program" doubles its input: right for inputs 1..3, the expected output of case 4 is wrong
        out = str(int(json["stdin"]) * 2) + "\n"
        return FakeResponse(
            {"status": "Success", "run_result": {"status": "Finished", "stdout": out, "return_code": 0}}
        )

    monkeypatch.setattr(requests, "post", fake_post)
    cases = {"inputs": ["1", "2", "3", "4"], "outputs": ["2", "4", "6", "9"]}
    score, meta = sandbox_fusion.compute_score(
        "http://sandbox/run_code", None, 256, "```python\nprint(int(input())*2)\n```", json.dumps(cases)
    )
    assert score == pytest.approx(0.75) and len(meta) == 4 and meta[3]["stdout"] == "8\n"
    assert (
        calls[0][0] == "http://sandbox/run_code"
        and calls[0][1]["memory_limit_MB"] == 256
        and calls[0][1]["code"].strip() == "print(int(input())*2)"
    )
    # continuous: 10 passing cases then a failing one -> 10 / 11, never 1.0
    many = {"inputs": [str(i) for i in range(11)], "outputs": [str(2 * i) for i in range(10)] + ["0"]}
    cont, _ = sandbox_fusion.compute_score(
        "http://sandbox/run_code", None, None, "```python\nx\n```", many, continuous=True
    )
    assert cont == pytest.approx(10 / 11)
    assert default_compute_score(
        "codeforces", "```python\nx\n```", cases, sandbox_fusion_url="http://sandbox/run_code"
    ) == pytest.approx(0.75)
    assert sandbox_fusion.compute_score("http://s", None, None, "no code here", cases) == (
        0.0,
        [{"error": "Invalid completion (missing code block)"}],
    )


def _score_for_pool(task, completion, reference, extra):
    if completion == "boom":
        raise RuntimeError("scorer failed")
    return (1.0, "tuple") if task == "t" else float(completion == reference)


def test_prime_parallel_compute_score_async_signature_and_results():
    import asyncio
    import inspect

    from verl.workers.reward_manager.prime import parallel_compute_score_async, run_reward_scoring

    params = list(inspect.signature(parallel_compute_score_async).parameters)
    assert params == ["evaluation_func", "completions", "references", "tasks", "extra_info", "num_processes"]
    scores = asyncio.run(
        parallel_compute_score_async(
            _score_for_pool, ["a", "b", "boom", "x"], ["a", "c", "a", "y"], ["s", "s", "s", "t"], num_processes=2
        )
    )
    assert scores == [1.0, 0.0, 0.0, 1.0]  # right, wrong, raised (0.0), tuple -> first element
    assert run_reward_scoring(_score_for_pool, ["a"], ["a"], ["s"], extra_info=[{"i": 0}], num_processes=1) == [1.0]
    with pytest.raises(ValueError, match="lengths differ"):
        asyncio.run(parallel_compute_score_async(_score_for_pool, ["a"], [], ["s"]))
