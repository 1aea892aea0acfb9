"""The calculator task through `run_ppo` (the code path of `python -m verl.trainer.main_ppo`): a
short version of recipes/tool_agent.sh. Greedy validation before and after 12 GRPO steps: the
warm start never calls the tool (accuracy 0), after 12 steps it calls it on (nearly) every
question and answers most of them (the full recipe: 98% at step 12, 100% from step 16, see
docs/agent_loop.md); the agent metrics and the per-sample trace are written."""

from __future__ import annotations

import json
import os

import pytest

from verl.trainer.main_ppo import load_default_config, run_ppo

pytestmark = [pytest.mark.slow, pytest.mark.ray]

STEPS = int(os.environ.get("VERL_TOOL_AGENT_CI_STEPS", "12"))


def _overrides(calc: str, run_dir, extra=()):
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"actor_rollout_ref.model.path={calc}/model",
        f"data.train_files={calc}/data/train.parquet",
        f"data.val_files={calc}/data/test.parquet",
        "data.return_raw_chat=True",
        "data.max_prompt_length=16",
        "data.max_response_length=48",
        "data.train_batch_size=16",
        "data.val_batch_size=128",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.multi_turn.format=verl_toy",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={calc}/tool_config.yaml",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.test_freq={STEPS}",
        "trainer.val_before_train=True",
        "trainer.logger=[file]",
        "trainer.plot=False",
        "trainer.save_freq=-1",
        f"trainer.log_dir={run_dir}/log",
        f"trainer.default_local_dir={run_dir}/ckpt",
        f"trainer.rollout_data_dir={run_dir}/dump",
        *extra,
    ]


def test_calculator_task_learns_to_call_the_tool(ray_session, tmp_path):
    from verl.utils.embedded_default import calculator_dir

    calc = calculator_dir()
    run_ppo(load_default_config(_overrides(calc, tmp_path)))
    metrics: dict[int, dict] = {}
    for line in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        metrics.setdefault(rec["step"], {}).update(rec["data"])
    acc = "val-core/verl_toy/calculator/reward/mean@1"
    rate = "val-aux/agent/tool_call_rate"
    first, last = metrics[0], metrics[STEPS]
    assert first[acc] <= 0.3 and first[rate] <= 0.3
    assert last[rate] >= 0.9, (first[rate], last[rate])
    assert last[acc] >= 0.8, (first[acc], last[acc])
    for key in (
        "num_turns/mean",
        "num_turns/max",
        "agent/tool_calls/mean",
        "agent/tool_error_rate",
        "agent/tool_latency_s/mean",
        "agent/cut_by_length_budget",
    ):
        assert key in metrics[1], key
    row = json.loads((tmp_path / "dump" / "1.jsonl").read_text().splitlines()[0])
    assert "turns" in row["trace"] and "stop" in row["trace"]
