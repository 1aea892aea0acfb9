"""Faulty scoring functions: NaN/inf and non-numbers are counted errors naming the function and
the row; every manager bounds each call by `timeout` in the main thread and off it; a stuck call
in `prime` costs one timeout, not the batch; math_verify runs without its signal timeouts and its
fallbacks are counted; null ground truths are named."""

import sys
import threading
import time
import types

import numpy as np
import pytest
import torch
from scorers_for_pools import batched_sleeper, sleeps_on_nine, stubborn_on_nine
from test_reward_manager import CharTokenizer, make_batch

from verl.workers.reward_manager import (
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    PrimeRewardManager,
)


# ------------------------------------------------------------------ module-level scorers (they pickle)
def nan_on_nine(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "9":
        return float("nan")
    if solution_str == "8":
        return {"score": float("-inf")}
    return float(solution_str == ground_truth)


def string_scorer(data_source, solution_str, ground_truth, extra_info=None):
    return "1.0" if solution_str == "7" else 1.0


def swallows_everything(data_source, solution_str, ground_truth, extra_info=None):
    """A scorer whose broad `except Exception` must not swallow the deadline."""
    try:
        if solution_str == "9":
            while True:
                time.sleep(0.01)
        return 1.0
    except Exception:  # noqa: BLE001 - the point of the test
        return 5.0


def numeric_types(data_source, solution_str, ground_truth, extra_info=None):
    return {"1": np.float32(0.5), "2": True, "3": torch.tensor(0.25), "4": 2}[solution_str]


# ------------------------------------------------------------------ 1. non-finite and non-numeric scores
def test_nan_and_inf_scores_are_counted_errors_with_the_row_logged(caplog):
    mgr = NaiveRewardManager(CharTokenizer(), 0, nan_on_nine, error_score=-0.5)
    with caplog.at_level("WARNING"):
        out = mgr(make_batch(["1$", "9$", "8$", "9$"], ["1", "1", "1", "1"]), return_dict=True)
    scores = out["reward_tensor"].sum(-1)
    assert torch.isfinite(scores).all()
    assert scores.tolist() == [1.0, -0.5, -0.5, -0.5]
    assert out["reward_extra_info"]["score_error"] == [False, True, True, True]
    assert out["reward_extra_info"]["score_timeout"] == [False] * 4
    # the first non-finite case is logged once, with the function and the row
    warnings = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert len(warnings) == 1
    assert "test_reward_faults.nan_on_nine" in warnings[0] and "row 1" in warnings[0] and "nan" in warnings[0]


def test_nan_score_raises_naming_the_row_when_error_score_is_none():
    mgr = NaiveRewardManager(CharTokenizer(), 0, nan_on_nine, error_score=None)
    with pytest.raises(RuntimeError, match=r"nan_on_nine failed on row 0 .*non-finite score nan"):
        mgr(make_batch(["9$"], ["1"]))


def test_a_string_score_is_an_error_naming_the_function_and_the_row(caplog):
    mgr = NaiveRewardManager(CharTokenizer(), 0, string_scorer)
    with caplog.at_level("WARNING"):
        out = mgr(make_batch(["1$", "7$"], ["1", "7"]), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0]
    assert out["reward_extra_info"]["score_error"] == [False, True]
    assert "test_reward_faults.string_scorer failed on row 1" in caplog.text
    assert "returned str '1.0', not a number" in caplog.text
    with pytest.raises(RuntimeError, match="string_scorer failed on row 0.*returned str"):
        NaiveRewardManager(CharTokenizer(), 0, string_scorer, error_score=None)(make_batch(["7$"], ["7"]))


def test_numpy_bool_tensor_and_int_scores_are_numbers():
    out = NaiveRewardManager(CharTokenizer(), 0, numeric_types)(
        make_batch(["1$", "2$", "3$", "4$"], ["", "", "", ""]), return_dict=True
    )
    assert out["reward_tensor"].sum(-1).tolist() == [0.5, 1.0, 0.25, 2.0]
    assert not any(out["reward_extra_info"]["score_error"])


def test_null_ground_truth_is_named():
    data = make_batch(["1$", "2$"], ["1", None])
    data.non_tensor_batch["extra_info"][1] = {"index": 17}
    with pytest.raises(ValueError, match=r"row 1 of the batch \(extra_info.index=17\).*non-null 'ground_truth'"):
        NaiveRewardManager(CharTokenizer(), 0, nan_on_nine)(data)


# ------------------------------------------------------------------ 2. bounded waits
def test_naive_timeout_in_the_main_thread_cuts_only_the_slow_call():
    mgr = NaiveRewardManager(CharTokenizer(), 0, sleeps_on_nine, timeout=0.3, error_score=-1.0)
    t0 = time.monotonic()
    out = mgr(make_batch(["1$", "9$", "2$"], ["1", "1", "2"]), return_dict=True)
    elapsed = time.monotonic() - t0
    assert elapsed < 3, elapsed
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, -1.0, 1.0]
    assert out["reward_extra_info"]["score_timeout"] == [False, True, False]
    assert out["reward_extra_info"]["score_error"] == [False, True, False]


def test_the_deadline_is_not_swallowed_by_a_broad_except():
    mgr = NaiveRewardManager(CharTokenizer(), 0, swallows_everything, timeout=0.2)
    out = mgr(make_batch(["9$", "1$"], ["", ""]), return_dict=True)
    assert out["reward_extra_info"]["score_timeout"] == [True, False]
    assert out["reward_tensor"].sum(-1).tolist() == [0.0, 1.0]


def _in_thread(fn):
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            box["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the reward manager hung off the main thread"
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.mark.slow
@pytest.mark.parametrize("cls", [NaiveRewardManager, DAPORewardManager])
def test_timeout_off_the_main_thread_runs_in_a_killable_worker(cls):
    mgr = cls(CharTokenizer(), 0, sleeps_on_nine, timeout=1.0, error_score=-1.0)
    try:
        data = make_batch(["1$", "9$", "2$"], ["1", "1", "2"])
        out = _in_thread(lambda: mgr(data, return_dict=True))
        assert out["reward_tensor"].sum(-1).tolist() == [1.0, -1.0, 1.0]
        assert out["reward_extra_info"]["score_timeout"] == [False, True, False]
        pids = mgr._pool.pids()
        assert len(pids) == 1  # the killed worker was replaced
        # the second batch: one timeout for its stuck call (plus a fresh worker for the last row),
        # not the 30 s the call would take
        t0 = time.monotonic()
        out = _in_thread(lambda: mgr(data, return_dict=True))
        assert out["reward_extra_info"]["score_timeout"] == [False, True, False]
        assert time.monotonic() - t0 < 25
    finally:
        mgr.close()


def test_off_main_thread_with_an_unpicklable_scorer_says_what_to_do():
    mgr = NaiveRewardManager(CharTokenizer(), 0, lambda **kw: 1.0, timeout=1.0)
    with pytest.raises(TypeError, match="cannot be pickled.*timeout=null"):
        _in_thread(lambda: mgr(make_batch(["1$"], ["1"])))
    # unbounded on request: runs in the thread itself
    mgr = NaiveRewardManager(CharTokenizer(), 0, lambda **kw: 1.0, timeout=None)
    assert _in_thread(lambda: mgr(make_batch(["1$"], ["1"]))).sum().item() == 1.0


def test_batch_manager_timeout_marks_the_whole_batch():
    mgr = BatchRewardManager(CharTokenizer(), 0, batched_sleeper, timeout=0.3)
    assert mgr.timeout == 0.3 and BatchRewardManager.DEFAULT_TIMEOUT_S == 300.0
    out = mgr(make_batch(["1$", "9$"], ["1", "1"]), return_dict=True)
    assert out["reward_extra_info"]["score_timeout"] == [True, True]
    out = mgr(make_batch(["1$", "2$"], ["1", "1"]), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 1.0]


@pytest.mark.slow
def test_batch_manager_timeout_off_the_main_thread():
    mgr = BatchRewardManager(CharTokenizer(), 0, batched_sleeper, timeout=1.0)
    try:
        t0 = time.monotonic()
        out = _in_thread(lambda: mgr(make_batch(["1$", "9$"], ["1", "1"]), return_dict=True))
        assert out["reward_extra_info"]["score_timeout"] == [True, True]
        assert time.monotonic() - t0 < 25  # not the 30 s of the call
        out = _in_thread(lambda: mgr(make_batch(["1$", "2$"], ["1", "1"]), return_dict=True))
        assert out["reward_tensor"].sum(-1).tolist() == [1.0, 1.0]
    finally:
        mgr.close()


def test_timeout_values_are_checked():
    assert NaiveRewardManager(CharTokenizer(), 0, nan_on_nine).timeout == 30.0
    for bad in (0, -1, "soon", True):
        with pytest.raises(ValueError, match="reward_kwargs.timeout=.*must be a number of seconds > 0"):
            NaiveRewardManager(CharTokenizer(), 0, nan_on_nine, timeout=bad)
    with pytest.raises(ValueError, match="prime manager needs a timeout"):
        PrimeRewardManager(CharTokenizer(), 0, nan_on_nine, timeout=None)


@pytest.mark.slow
def test_prime_timeout_cuts_the_one_slow_call_and_scores_the_other_31():
    # the stuck call swallows every Exception: only killing its process ends it (before: the batch
    # waited for a parent deadline of timeout + 30 s)
    timeout = 2.0
    mgr = PrimeRewardManager(CharTokenizer(), 0, stubborn_on_nine, num_processes=4, timeout=timeout, error_score=-1.0)
    responses = ["9$"] + [f"{i % 8}$" for i in range(31)]
    answers = ["1"] + [str(i % 8) for i in range(31)]
    data = make_batch(responses, answers)
    try:
        out = mgr(data, return_dict=True)  # the first batch also starts the worker processes
        scores = out["reward_tensor"].sum(-1).tolist()
        assert scores == [-1.0] + [1.0] * 31
        assert sum(out["reward_extra_info"]["score_timeout"]) == 1
        assert sum(out["reward_extra_info"]["score_error"]) == 1
        t0 = time.monotonic()
        out = mgr(data, return_dict=True)
        warm = time.monotonic() - t0
        assert out["reward_tensor"].sum(-1).tolist() == [-1.0] + [1.0] * 31
        assert sum(out["reward_extra_info"]["score_timeout"]) == 1
        # about one timeout (5 s measured on an idle machine with timeout=5), not the 30 s of the
        # stuck call nor 32 timeouts; the bound leaves room for a loaded machine
        assert timeout <= warm < 20, warm
        assert mgr._pool.restarts == 2  # one killed worker per batch, replaced
    finally:
        mgr.close()


# ------------------------------------------------------------------ math_verify off the main thread
@pytest.fixture
def fake_math_verify(monkeypatch):
    """A stand-in with math_verify's contract: a timeout other than None needs the main thread."""
    calls = []
    mod = types.ModuleType("math_verify")

    def check(timeout):
        if timeout is not None and threading.current_thread() is not threading.main_thread():
            raise ValueError("Math-Verify doesn't support threaded environment due to usage of signal.alarm()")

    def parse(text, parsing_timeout=5):
        calls.append(("parse", parsing_timeout))
        check(parsing_timeout)
        if "\\weird" in text:
            raise RuntimeError("cannot parse")
        return [text.replace("\\boxed{", "").rstrip("}")]

    def verify(gold, pred, timeout_seconds=5):
        calls.append(("verify", timeout_seconds))
        check(timeout_seconds)
        return gold == pred

    mod.parse, mod.verify = parse, verify
    monkeypatch.setitem(sys.modules, "math_verify", mod)
    return calls


def test_math_verify_is_called_without_signal_timeouts_and_works_in_a_thread(fake_math_verify):
    from verl.utils.reward_score import math as math_score

    assert _in_thread(lambda: math_score.compute_score("so \\boxed{3/4}", "3/4")) == 1.0
    assert fake_math_verify == [("parse", None), ("parse", None), ("verify", None)]
    before = math_score.math_verify_fallbacks()
    # math_verify fails: the normaliser decides (equal strings) and the fallback is counted
    assert _in_thread(lambda: math_score.compute_score("\\boxed{\\weird x}", "\\weird x")) == 1.0
    assert math_score.math_verify_fallbacks() == before + 1


def test_math_verify_fallbacks_are_flagged_per_row(fake_math_verify):
    data = make_batch(["1$", "2$"], ["\\weird1", "2"], data_source="lighteval/MATH")
    # the char tokenizer yields digits only: wrap them in \boxed{} for the math scorer
    from verl.utils.reward_score import default_compute_score

    def boxed(data_source, solution_str, ground_truth, extra_info=None):
        return default_compute_score(data_source, "\\boxed{" + solution_str + "}", ground_truth, extra_info)

    out = NaiveRewardManager(CharTokenizer(), 0, boxed)(data, return_dict=True)
    assert out["reward_extra_info"]["math_verify_fallback"] == [True, False]
    assert out["reward_tensor"].sum(-1).tolist() == [0.0, 1.0]


def test_trainer_counts_errors_timeouts_and_fallbacks():
    from types import SimpleNamespace

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, StepContext

    mgr = NaiveRewardManager(CharTokenizer(), 0, sleeps_on_nine, timeout=0.2)
    fake = SimpleNamespace(use_rm=False, reward_fn=mgr)
    metrics = {}
    RayPPOTrainer.compute_reward(fake, make_batch(["9$", "1$"], ["1", "1"]), StepContext(1, metrics=metrics))
    RayPPOTrainer.compute_reward(fake, make_batch(["9$", "9$"], ["1", "1"]), StepContext(1, metrics=metrics))
    assert metrics["reward/score_errors"] == 3 and metrics["reward/score_timeouts"] == 3
    assert metrics["reward/math_verify_fallbacks"] == 0


def test_filter_groups_metric_no_reward_produces_names_the_existing_ones():
    from types import SimpleNamespace

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, StepContext, select_groups_with_variance

    def with_acc(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": float(solution_str == ground_truth), "acc": solution_str == ground_truth}

    fake = SimpleNamespace(use_rm=False, reward_fn=NaiveRewardManager(CharTokenizer(), 0, with_acc))
    batch = RayPPOTrainer.compute_reward(fake, make_batch(["1$", "2$"], ["1", "1"]), StepContext(1))
    batch.non_tensor_batch["uid"] = np.array(["a", "a"], dtype=object)
    assert select_groups_with_variance(batch, "acc")[1] == 1
    with pytest.raises(ValueError) as e:
        select_groups_with_variance(batch, "accuracy")
    msg = str(e.value)
    assert "filter_groups.metric='accuracy' is not produced by this run's reward" in msg
    assert "'acc'" in msg and "'score_error'" in msg and "'seq_reward'" in msg
    # a batch column that is not a reward metric is not accepted either
    with pytest.raises(ValueError, match="metric='data_source' is not produced"):
        select_groups_with_variance(batch, "data_source")


def test_real_math_verify_decides_off_the_main_thread():
    """With the package installed (extra `math`): its default signal-based timeouts raise in a
    thread; our call disables them, so equivalence is decided there too, without fallbacks."""
    pytest.importorskip("math_verify")
    from verl.utils.reward_score import math as math_score

    before = math_score.math_verify_fallbacks()
    cases = [("\\boxed{\\frac{1}{2}}", "0.5", 1.0), ("\\boxed{x^2+2x}", "x(x+2)", 1.0), ("\\boxed{3}", "4", 0.0)]
    got = _in_thread(lambda: [math_score.compute_score(a, b) for a, b, _ in cases])
    assert got == [want for _, _, want in cases]
    assert math_score.math_verify_fallbacks() == before


class _FailsToLoadInAWorker:
    """Pickles fine here; unpickling it in a worker raises (as a scorer whose module cannot be
    imported there would)."""

    def __call__(self, **kw):
        return 1.0

    def __reduce__(self):
        return (_refuse_to_load, ())


def _refuse_to_load():
    raise KeyError("no such scorer here")


@pytest.mark.slow
def test_a_scorer_that_cannot_load_in_a_worker_is_named():
    mgr = PrimeRewardManager(CharTokenizer(), 0, _FailsToLoadInAWorker(), num_processes=1, timeout=5.0)
    try:
        with pytest.raises(RuntimeError, match=r"could not load .*_FailsToLoadInAWorker.*KeyError"):
            mgr(make_batch(["1$"], ["1"]))
    finally:
        mgr.close()
