"""The calculator task: rows in the upstream schema with agent_name / tools_kwargs, the scorer of
the final "=<integer>" answer, the multi-turn SFT rows (loss on assistant turns only), the
verl_toy round trip through the tokenizer."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from conftest import load_build_script

from verl.experimental.agent_loop.tool_parser import ToolParser
from verl.tools.calculator_tool import CALCULATOR_SCHEMA, CalculatorTool
from verl.utils.dataset.toy_tasks import CalculatorTask, calculator_rl_row, calculator_sft_row, make_calculator_splits
from verl.utils.reward_score import default_compute_score


def test_rows_and_splits():
    task = CalculatorTask()
    train, test = make_calculator_splits(task, 50, 20, seed=0)
    assert not set(train) & set(test) and len(set(train)) == 50
    assert all(100 <= a <= 999 and 10 <= b <= 99 and a * b >= 10000 for a, b in train + test)
    row = calculator_rl_row(347, 85, "train", 3)
    assert row["prompt"] == [{"role": "user", "content": "347*85"}] and row["agent_name"] == "tool_agent"
    assert row["reward_model"]["ground_truth"] == "29495"
    assert row["extra_info"]["tools_kwargs"] == {"calculator": {"create_kwargs": {"ground_truth": "29495"}}}
    # 3-digit x 2-digit pairs whose product has 5 digits, counted by hand-checkable enumeration
    assert (
        task.number_of_distinct_problems()
        == sum(1 for a in range(100, 1000) for b in range(10, 100) if a * b >= 10000)
        == 66471
    )
    assert CalculatorTask(min_product=0).number_of_distinct_problems() == 900 * 90
    with pytest.raises(ValueError, match="min_product"):
        CalculatorTask(a_digits=1, b_digits=1, min_product=100)
    direct = calculator_sft_row(347, 85, "t", 0, use_tool=False, rng=random.Random(0))["messages"]
    guess = direct[-1]["content"]  # a guess of the right length: never an exact "=" answer
    assert guess.startswith("~") and len(guess) == 6 and guess[1:].isdigit()
    assert default_compute_score("verl_toy/calculator", guess, "29495") == 0.0
    assert calculator_sft_row(347, 85, "t", 0, False, random.Random(0)) == calculator_sft_row(
        347, 85, "t", 0, False, random.Random(0)
    )


@pytest.mark.parametrize(
    "text,score",
    [
        ("<tool_call>calculator: 347*85</tool_call>29495=29495", 1.0),
        ("=29495", 1.0),
        ("=29494", 0.0),
        ("29495", 0.0),  # no "=" answer
        ("=29495 and more", 0.0),
        ("<tool_call>calculator: 347*85</tool_call>29495", 0.0),  # stopped after the observation
    ],
)
def test_scorer(text, score):
    assert default_compute_score("verl_toy/calculator", text, "29495") == score


def test_sft_rows_train_on_assistant_turns_only():
    from verl.utils.dataset.sft_dataset import SFTDataset

    tok = load_build_script().build_calculator_tokenizer()
    rows = [calculator_sft_row(347, 85, "t", 0, use_tool=True), calculator_sft_row(12, 3, "t", 1, use_tool=False)]
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tempfile.mktemp(suffix=".parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    ds = SFTDataset(path, tok, {"max_length": 64, "multiturn": {"enable": True, "messages_key": "messages"}})
    item = ds[0]
    ids = item["input_ids"].tolist()
    # loss_mask[t] = 1 iff token t+1 is trained on
    trained = [ids[t + 1] for t in range(len(ids) - 1) if item["loss_mask"][t] == 1]
    expected = (
        tok("<tool_call>calculator: 347*85</tool_call>", add_special_tokens=False)["input_ids"]
        + [tok.eos_token_id]
        + tok("=29495", add_special_tokens=False)["input_ids"]
        + [tok.eos_token_id]
    )
    assert trained == expected  # the user and the tool message are never trained on
    assert "<|tool|>29495" in tok.decode(ids, skip_special_tokens=False)


def test_verl_toy_format_round_trip_and_tool():
    tok = load_build_script().build_calculator_tokenizer()
    ids = tok(CalculatorTask.tool_call(347, 85), add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<tool_call>") and len(ids) == 2 + len("calculator: 347*85")
    parser = ToolParser.get_tool_parser("verl_toy", tok, [CALCULATOR_SCHEMA])
    _, calls = asyncio.run(parser.extract_tool_calls(ids + [tok.eos_token_id]))
    assert json.loads(calls[0].arguments) == {"expression": "347*85"}
    tool = CalculatorTool({"type": "native"})
    rng = random.Random(0)
    for _ in range(20):
        a, b = CalculatorTask().sample_problem(rng)
        resp, _, m = asyncio.run(tool.execute("i", {"expression": f"{a}*{b}"}))
        assert resp.text == str(a * b) and not m["error"]
    resp, _, m = asyncio.run(tool.execute("i", {}))
    assert m["error"] and "missing required argument" in resp.text


def test_shipped_calculator_build_info_matches_a_fresh_copy_measurement():
    """The warm start's copy skill (answer turn after the tool result) recorded in build_info.json
    is what the shipped weights do now; the policy never calls the tool greedily before RL."""
    from verl.utils.embedded_default import calculator_dir

    calc = calculator_dir()
    info = json.loads(open(f"{calc}/build_info.json").read())
    fresh = load_build_script().evaluate_copy(f"{calc}/model", f"{calc}/data/test.parquet")
    assert fresh == info["eval_test_split"]["copy_after_tool_result"]
    assert info["eval_test_split"]["greedy"]["tool_call_rate"] <= 0.3  # RL has something to learn
    assert info["task"]["tool_rate"] < 0.5  # the teacher calls the tool in a minority of demonstrations
    assert info["sft_stages"][-1]["copy_accuracy"] == fresh["copy_accuracy"]


def test_previous_stages_follow_the_init_chain(tmp_path):
    """A build started from an earlier calculator build records the earlier stages, also when that
    build wrote none (its own stage is rebuilt from its build_args), then its own."""
    build = load_build_script()

    def write(name, **info):
        (tmp_path / name / "model").mkdir(parents=True)
        (tmp_path / name / "build_info.json").write_text(json.dumps(info))
        return str(tmp_path / name / "model")

    calc = {"data_source": "verl_toy/calculator"}
    a = write("a", task=calc, sft_stages=["header line", "1: first stage"])
    b = write(
        "b",
        task=calc,
        build_args={"init_from": a, "sft_steps": 600, "sft_lr": 1e-3, "tool_rate": 0.3, "seed": 0},
        eval_test_split={"copy_after_tool_result": {"copy_accuracy": 0.9}, "greedy": {"accuracy": 0.0}},
    )
    stages = build.previous_stages(b)
    assert stages[0] == "1: first stage" and len(stages) == 2  # the header line is dropped
    assert stages[1]["stage"] == 2 and stages[1]["sft_steps"] == 600 and stages[1]["copy_accuracy"] == 0.9
    assert build.previous_stages(write("c", task={"data_source": "verl_toy/addition"})) == []
    assert build.previous_stages("") == [] and build.previous_stages(str(tmp_path / "none" / "model")) == []
