"""The complete extension files of docs/extending.md, run through the trainer as the docs say
(one step on the embedded default each), with checks that the user code really decided the result.

The custom policy loss is covered by tests/test_algo_custom_loss_example.py (import + numbers) and
recipes/custom_loss.sh in tests/test_recipes.py (end to end).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl.trainer.main_ppo import load_default_config, run_ppo
from verl.utils.reward_score import default_compute_score

pytestmark = [pytest.mark.slow, pytest.mark.ray]

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def one_step(run_dir: Path, *overrides: str) -> tuple[dict, list[dict]]:
    cfg = load_default_config(
        [
            "trainer.total_training_steps=1",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "trainer.logger=[file]",
            "trainer.plot=False",
            "trainer.torch_threads_per_worker=2",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            f"trainer.log_dir={run_dir}/log",
            f"trainer.default_local_dir={run_dir}/ckpt",
            f"trainer.rollout_data_dir={run_dir}/rollouts",
            *overrides,
        ]
    )
    run_ppo(cfg)
    metrics: dict = {}
    for line in (run_dir / "log" / "metrics.jsonl").read_text().splitlines():
        metrics.update(json.loads(line)["data"])
    rollouts = [json.loads(line) for line in (run_dir / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert len(rollouts) == 4 * 8
    return metrics, rollouts


def load_example(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"docs_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_custom_reward_function(tmp_path, ray_session):
    _, rollouts = one_step(
        tmp_path,
        "algorithm.adv_estimator=grpo",
        f"custom_reward_function.path={EXAMPLES / 'custom_reward.py'}",
        "custom_reward_function.name=compute_score",
        "+custom_reward_function.reward_kwargs.partial_credit=0.1",
    )
    fn = load_example("custom_reward").compute_score
    for row in rollouts:  # every training score is the user's function of the decoded response
        expected = fn("verl_toy/addition", row["output"], row["ground_truth"], partial_credit=0.1)["score"]
        assert row["score"] == pytest.approx(expected, abs=1e-6), row


def test_custom_reward_manager(tmp_path, ray_session):
    _, rollouts = one_step(
        tmp_path,
        "algorithm.adv_estimator=grpo",
        f"trainer.external_modules=[{EXAMPLES / 'custom_reward_manager.py'}]",
        "reward_model.reward_manager=length_penalized",
        "+reward_model.reward_kwargs.length_penalty=0.01",
    )
    for row in rollouts:  # shipped score minus 0.01 per response token (text bytes, plus EOS if any)
        base = default_compute_score("verl_toy/addition", row["output"], row["ground_truth"])
        base = base["score"] if isinstance(base, dict) else base
        n_tokens = round((base - row["score"]) / 0.01)
        assert row["score"] == pytest.approx(base - 0.01 * n_tokens, abs=1e-6)
        assert len(row["output"].encode()) <= n_tokens <= len(row["output"].encode()) + 1, row


def test_custom_advantage_estimator(tmp_path, ray_session):
    metrics, rollouts = one_step(
        tmp_path,
        f"trainer.external_modules=[{EXAMPLES / 'custom_adv_estimator.py'}]",
        "algorithm.adv_estimator=grpo_median",
    )
    # rewards are 0/1, so r - median(group) is -1, 0 or 1; GRPO's (r - mean)/std never is all three
    for key in ("critic/advantages/max", "critic/advantages/min"):
        assert metrics[key] in (-1.0, 0.0, 1.0), (key, metrics[key])
    groups: dict[str, list[float]] = {}
    for row in rollouts:
        groups.setdefault(row["input"], []).append(row["score"])
    mixed = any(0 < sum(s) < len(s) for s in groups.values())
    # a group with both right and wrong answers gives someone a non-zero advantage, else all are 0
    assert (max(abs(metrics["critic/advantages/max"]), abs(metrics["critic/advantages/min"])) == 1.0) == mixed


def test_weighted_reward_components(tmp_path, ray_session):
    path = EXAMPLES / "reward_components.py"
    metrics, rollouts = one_step(
        tmp_path,
        "algorithm.adv_estimator=grpo",
        f"reward.components=[{{name: correct, path: {path}, function: correct, weight: 1.0}}, "
        f"{{name: brevity, path: {path}, function: brevity, weight: 0.2, reward_kwargs: {{limit: 4}}}}]",
    )
    import asyncio

    example = load_example("reward_components")
    correct, brevity = [], []
    for row in rollouts:  # every training score is the weighted sum of the two functions
        c = example.correct("verl_toy/addition", row["output"], row["ground_truth"])
        b = asyncio.run(example.brevity("verl_toy/addition", row["output"], row["ground_truth"], limit=4))
        assert row["score"] == pytest.approx(c + 0.2 * b, abs=1e-6), row
        correct.append(c)
        brevity.append(b)
    assert metrics["reward/correct/mean"] == pytest.approx(sum(correct) / len(correct))
    assert metrics["reward/brevity/mean"] == pytest.approx(sum(brevity) / len(brevity))
