"""`verl.trainer.main_eval`: pass@k by hand, per data-source means, user reward files, the per-call
timeout of the scoring workers."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from verl.trainer.main_eval import evaluate, pass_at_k


def test_pass_at_k_by_hand():
    # 4 responses, 1 correct: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2; pass@4 = 1
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 0, 4) == 0.0
    with pytest.raises(ValueError, match="pass@8 needs at least 8 responses per row, got 4"):
        pass_at_k(4, 1, 8)


def _config(path, **over):
    base = {
        "data": {
            "path": str(path),
            "prompt_key": "prompt",
            "response_key": "responses",
            "data_source_key": "data_source",
            "reward_model_key": "reward_model",
        },
        "custom_reward_function": {"path": None, "name": "compute_score", "reward_kwargs": {}},
        "ray_kwargs": {"ray_init": {"num_cpus": 1}},
        "scoring": {"timeout": 30.0, "error_score": 0.0},
    }
    cfg = OmegaConf.create(base)
    for k, v in over.items():
        OmegaConf.update(cfg, k, v)
    return cfg


def _write(tmp_path, rows, name="gen.parquet"):
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return path


@pytest.mark.slow
def test_scores_per_data_source_with_the_shipped_scorer_and_a_user_file(tmp_path):
    rows = [
        {"data_source": "verl_toy/addition", "responses": ["12", "13"], "reward_model": {"ground_truth": "12"}},
        {"data_source": "verl_toy/addition", "responses": ["7", "7"], "reward_model": {"ground_truth": "8"}},
        {"data_source": "other", "responses": ["abc", "abcd"], "reward_model": {"ground_truth": "abc"}},
    ]
    path = _write(tmp_path, rows)
    user = tmp_path / "my_reward.py"
    user.write_text(
        "import time\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
        "    if solution_str == 'abcd':\n"
        "        time.sleep(30)\n"
        "    return {'score': float(solution_str == ground_truth) + bonus, 'acc': solution_str == ground_truth}\n"
    )
    # the shipped scorer knows verl_toy/addition only: the third row would stop the run (NotImplementedError)
    only_toy = _write(tmp_path, rows[:2], "toy.parquet")
    metrics = evaluate(_config(only_toy))
    assert metrics["test_score/verl_toy/addition"] == pytest.approx(0.25)  # 1 of 4 responses
    assert metrics["test_score/verl_toy/addition/pass@1"] == pytest.approx(0.25)
    assert metrics["test_score/verl_toy/addition/pass@2"] == pytest.approx(0.5)  # (1 + 0) / 2 rows
    # a user file (with reward_kwargs), two workers, and a call that runs past its timeout
    cfg = _config(
        path,
        **{
            "custom_reward_function.path": str(user),
            "custom_reward_function.reward_kwargs": {"bonus": 0.5},
            "ray_kwargs.ray_init.num_cpus": 2,
            "scoring.timeout": 2.0,
        },
    )
    metrics = evaluate(cfg)
    assert metrics["test_score/other"] == pytest.approx((1.5 + 0.0) / 2)  # the timed-out call scores error_score 0
    assert metrics["test_score/other/pass@1"] == pytest.approx(0.5)
    assert metrics["test_score/verl_toy/addition"] == pytest.approx((1.5 + 0.5 + 0.5 + 0.5) / 4)
    assert metrics["test_score/errors"] == 1.0
    strict = _config(path, **{"custom_reward_function.path": str(user), "scoring.timeout": 2.0})
    OmegaConf.update(strict, "scoring.error_score", None)
    with pytest.raises(RuntimeError, match=r"gen\.parquet \(row 2, other\): scoring failed"):
        evaluate(strict)
