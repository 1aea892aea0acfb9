"""Reward managers: score placement, errors counted (never silent), EOS trick, DAPO overlong
penalty, batch scorer, prime process pool with timeout, user classes from a file."""

import textwrap
import time

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.workers.reward_manager import (
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    PrimeRewardManager,
    get_reward_manager_cls,
)

PAD, EOS = 0, 1


class CharTokenizer:
    """ids 2..11 are the digits 0..9; 0 = pad, 1 = eos (special, skipped when decoding)."""

    eos_token_id = EOS
    pad_token_id = PAD

    def encode(self, s):
        return [int(c) + 2 for c in s]

    def batch_decode(self, seqs, skip_special_tokens=True):
        return ["".join(str(t - 2) for t in s if t >= 2 or not skip_special_tokens) for s in seqs]


def make_batch(responses, answers, prompt="12", resp_width=6, data_source="toy"):
    """Prompt left-padded to width 4, responses right-padded to `resp_width` (eos appended
    when the response string ends with '$')."""
    tok = CharTokenizer()
    p_ids = tok.encode(prompt)
    prompts, resps, attn, rmask = [], [], [], []
    for r in responses:
        ids = tok.encode(r.rstrip("$")) + ([EOS] if r.endswith("$") else [])
        ids = ids[:resp_width]
        prompts.append([PAD] * (4 - len(p_ids)) + p_ids)
        resps.append(ids + [PAD] * (resp_width - len(ids)))
        pm = [0] * (4 - len(p_ids)) + [1] * len(p_ids)
        rm = [1] * len(ids) + [0] * (resp_width - len(ids))
        attn.append(pm + rm)
        rmask.append(rm)
    n = len(responses)
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor(prompts),
            "responses": torch.tensor(resps),
            "attention_mask": torch.tensor(attn),
            "response_mask": torch.tensor(rmask),
        },
        non_tensors={
            "data_source": np.array([data_source] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": a} for a in answers], dtype=object),
            "extra_info": np.array([{"i": i} for i in range(n)], dtype=object),
        },
    )


def exact(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str == ground_truth else 0.0


def test_naive_places_score_on_last_valid_token():
    data = make_batch(["3$", "45$", "7"], ["3", "44", "7"])
    out = NaiveRewardManager(CharTokenizer(), 0, exact)(data, return_dict=True)
    r = out["reward_tensor"]
    assert r.shape == (3, 6) and r.dtype == torch.float32
    assert r[0].tolist() == [0, 1.0, 0, 0, 0, 0]  # "3" + eos: last valid token is eos at index 1
    assert r[1].sum() == 0  # wrong answer
    assert r[2].tolist() == [1.0, 0, 0, 0, 0, 0]
    assert out["reward_extra_info"]["truncated"] == [False, False, True]
    assert out["reward_extra_info"]["score_error"] == [False, False, False]


def test_dict_scores_keep_extra_columns():
    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 2.0, "acc": solution_str == ground_truth, "idx": extra_info["i"]}

    out = NaiveRewardManager(CharTokenizer(), 0, scorer)(make_batch(["3$", "4$"], ["3", "3"]), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [2.0, 2.0]
    assert out["reward_extra_info"]["acc"] == [True, False]
    assert out["reward_extra_info"]["idx"] == [0, 1]


def test_dict_without_score_names_the_row():
    mgr = NaiveRewardManager(CharTokenizer(), 0, lambda **kw: {"acc": 1})
    with pytest.raises(ValueError, match="without 'score' for row 0"):
        mgr(make_batch(["3$"], ["3"]))


def test_scorer_errors_are_counted_and_scored_with_error_score(caplog):
    def flaky(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "9":
            raise ZeroDivisionError("boom")
        return 1.0

    mgr = NaiveRewardManager(CharTokenizer(), 0, flaky, error_score=-0.5)
    with caplog.at_level("WARNING"):
        out = mgr(make_batch(["9$", "1$", "9$"], ["1", "1", "1"]), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [-0.5, 1.0, -0.5]
    assert out["reward_extra_info"]["score_error"] == [True, False, True]
    assert "ZeroDivisionError: boom" in caplog.text and "row 0" in caplog.text


def test_scorer_error_reraises_when_error_score_is_none():
    mgr = NaiveRewardManager(CharTokenizer(), 0, lambda **kw: 1 / 0, error_score=None)
    with pytest.raises(RuntimeError, match="row 0 .*data_source='toy'.*ZeroDivisionError"):
        mgr(make_batch(["1$"], ["1"]))


def test_eos_trick_replaces_score_of_truncated_responses():
    mgr = NaiveRewardManager(CharTokenizer(), 0, exact, truncation_penalty=-1.0)
    data = make_batch(["123456", "12$", "123456"], ["123456", "12", "0"])
    scores = mgr(data).sum(-1).tolist()
    assert scores == [-1.0, 1.0, -1.0]  # a correct but truncated answer is penalised too


def test_rm_scores_are_returned_unchanged():
    data = make_batch(["1$"], ["1"])
    data.batch["rm_scores"] = torch.full((1, 6), 0.25)
    assert torch.equal(NaiveRewardManager(CharTokenizer(), 0, exact)(data), data.batch["rm_scores"])


def test_dapo_manager_adds_overlong_penalty_and_logs_it():
    cfg = {"enable": True, "len": 4, "penalty_factor": 1.0, "log": True}
    mgr = DAPORewardManager(CharTokenizer(), 0, exact, max_resp_len=6, overlong_buffer_cfg=cfg)
    # lengths 2 (safe), 4 (1 token over safe=2 -> -0.5), 6 (-1)
    data = make_batch(["1$", "111$", "111111"], ["1", "111", "0"])
    out = mgr(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx([1.0, 0.5, -1.0])
    assert out["reward_extra_info"]["overlong_reward"] == pytest.approx([0.0, -0.5, -1.0])
    assert out["reward_extra_info"]["overlong"] == [False, True, True]


def test_dapo_manager_rejects_bad_overlong_config():
    with pytest.raises(ValueError, match="unknown key.*'length'"):
        DAPORewardManager(CharTokenizer(), 0, exact, max_resp_len=6, overlong_buffer_cfg={"length": 3})
    with pytest.raises(ValueError, match=r"len=8 must be in \(0, max_resp_len=6\]"):
        DAPORewardManager(CharTokenizer(), 0, exact, max_resp_len=6, overlong_buffer_cfg={"enable": True, "len": 8})


def test_batch_manager_calls_once_and_counts_a_failing_batch():
    calls = []

    def batched(data_sources, solution_strs, ground_truths, extra_infos, bonus=0.0):
        calls.append(len(solution_strs))
        return [float(s == g) + bonus for s, g in zip(solution_strs, ground_truths, strict=False)]

    mgr = BatchRewardManager(CharTokenizer(), 0, batched, bonus=0.5)
    out = mgr(make_batch(["1$", "2$"], ["1", "1"]))
    assert calls == [2] and out.sum(-1).tolist() == [1.5, 0.5]

    def broken(**kw):
        raise ValueError("judge down")

    out = BatchRewardManager(CharTokenizer(), 0, broken, error_score=0.0)(
        make_batch(["1$", "2$"], ["1", "1"]), return_dict=True
    )
    assert out["reward_extra_info"]["score_error"] == [True, True]


@pytest.mark.slow
def test_prime_manager_parallel_with_timeout_and_errors():
    from scorers_for_pools import slow_or_failing

    mgr = PrimeRewardManager(CharTokenizer(), 0, slow_or_failing, num_processes=2, timeout=3.0, error_score=-1.0)
    try:
        assert mgr(make_batch(["1$"], ["1"])).sum().item() == 1.0  # starts the worker processes
        t0 = time.monotonic()
        out = mgr(make_batch(["1$", "9$", "8$", "2$"], ["1", "9", "8", "1"]), return_dict=True)
        elapsed = time.monotonic() - t0
        assert out["reward_tensor"].sum(-1).tolist() == [1.0, -1.0, -1.0, 0.0]
        assert out["reward_extra_info"]["score_error"] == [False, True, True, False]
        assert out["reward_extra_info"]["score_timeout"] == [False, True, False, False]
        assert elapsed < 20, elapsed  # the 30 s call was cut by the timeout
        # the killed worker was replaced; the next batch works
        out = mgr(make_batch(["1$"], ["1"]))
        assert out.sum().item() == 1.0
    finally:
        mgr.close()


def test_user_manager_class_from_file(tmp_path):
    f = tmp_path / "my_rm.py"
    f.write_text(
        textwrap.dedent(
            """
        from verl.workers.reward_manager import NaiveRewardManager

        class ConstantRM(NaiveRewardManager):
            def score_items(self, items):
                return [0.75 for _ in items]
        """
        )
    )
    cls = get_reward_manager_cls(f"{f}:ConstantRM")
    assert cls(CharTokenizer(), 0, exact)(make_batch(["1$"], ["2"])).sum().item() == 0.75
    with pytest.raises(ValueError, match=r"^Unknown reward manager: \S+\. .*not a registered reward manager.*'naive'"):
        get_reward_manager_cls("nope")
    with pytest.raises(AttributeError, match="defines no 'Missing'"):
        get_reward_manager_cls(f"{f}:Missing")


def test_unknown_data_source_stops_the_run():
    def no_scorer(data_source, solution_str, ground_truth, extra_info=None):
        raise NotImplementedError(f"no reward function for data_source={data_source!r}")

    with pytest.raises(NotImplementedError, match="data_source='toy'"):
        NaiveRewardManager(CharTokenizer(), 0, no_scorer)(make_batch(["1$"], ["1"]))


def test_register_refuses_a_second_class_under_a_taken_name():
    from verl.workers.reward_manager import REWARD_MANAGER_REGISTRY, register

    def make(module):
        return type("SameName", (NaiveRewardManager,), {"__module__": module})

    first = register("test_taken_name")(make("user_module_a"))
    try:
        assert register("test_taken_name")(make("user_module_a")) is not None  # the same module reloaded
        with pytest.raises(ValueError, match=r"'test_taken_name' is already registered to user_module_a\.SameName"):
            register("test_taken_name")(make("user_module_b"))
    finally:
        REWARD_MANAGER_REGISTRY.pop("test_taken_name", None)
    assert first.__module__ == "user_module_a"
