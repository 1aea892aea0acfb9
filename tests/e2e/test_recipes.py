"""Every shell recipe in recipes/ runs one training step on the embedded default (CPU), applies
the overrides that define its algorithm, and shows that algorithm's own metrics.

The recipes run as a user runs them (`bash recipes/<name>.sh <overrides>`); their drivers join the
session's Ray instance instead of starting one each (that alone would cost ~5 s per recipe).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.ray]

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
LOSS = "actor_rollout_ref.actor.policy_loss.loss_mode"

# recipe -> (config values the recipe must set, metrics its step must report)
EXPECTED: dict[str, tuple[dict, list[str]]] = {
    "ppo": (
        {
            "algorithm.adv_estimator": "gae",
            "algorithm.use_kl_in_reward": True,
            "algorithm.kl_ctrl.type": "adaptive",
            "actor_rollout_ref.rollout.n": 1,
        },
        ["critic/vf_loss", "critic/vf_explained_var", "actor/reward_kl_penalty"],
    ),
    "grpo": (
        {
            "algorithm.adv_estimator": "grpo",
            "actor_rollout_ref.actor.use_kl_loss": True,
            "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
        },
        ["actor/kl_loss"],
    ),
    "drgrpo": (
        {
            "algorithm.adv_estimator": "grpo",
            "algorithm.norm_adv_by_std_in_grpo": False,
            "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm",
        },
        [],
    ),
    "liteppo": (
        {
            "algorithm.adv_estimator": "norm",
            "algorithm.adv_norm.mean_level": "group",
            "algorithm.adv_norm.std_level": "batch",
        },
        [],
    ),
    "rloo": ({"algorithm.adv_estimator": "rloo", "algorithm.use_kl_in_reward": True}, ["actor/reward_kl_penalty"]),
    "reinforce_plus_plus": ({"algorithm.adv_estimator": "reinforce_plus_plus"}, ["actor/reward_kl_penalty"]),
    "remax": ({"algorithm.adv_estimator": "remax"}, ["timing_s/gen_max"]),
    "dapo": (
        {
            "algorithm.filter_groups.enable": True,
            "reward.reward_manager.name": "dapo",
            "actor_rollout_ref.actor.clip_ratio_high": 0.28,
            "actor_rollout_ref.actor.use_kl_loss": False,
        },
        ["filter_groups/kept_groups", "filter_groups/num_gen_batches"],
    ),
    "gspo": ({LOSS: "gspo", "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean"}, []),
    "sapo": ({LOSS: "sapo"}, ["actor/sapo_gate_mean"]),
    "cispo": ({LOSS: "cispo"}, []),
    "icepop": ({"algorithm.rollout_correction.rollout_rs": "icepop"}, ["rollout_corr/rollout_rs_masked_fraction"]),
    "kpop": ({"algorithm.rollout_correction.rollout_rs": "kpop"}, ["rollout_corr/rollout_rs_masked_fraction"]),
    "tis": ({"algorithm.rollout_correction.rollout_is": "token"}, ["rollout_corr/rollout_is_mean"]),
    "custom_loss": ({LOSS: "truncated_pg"}, []),
    "grpo_lora": (
        {
            "algorithm.adv_estimator": "grpo",
            "actor_rollout_ref.model.lora_rank": 8,
            "actor_rollout_ref.actor.use_kl_loss": True,
        },
        ["actor/kl_loss", "timing_s/ref"],
    ),
    "tool_agent": (
        {
            "actor_rollout_ref.rollout.multi_turn.enable": True,
            "data.return_raw_chat": True,
            "actor_rollout_ref.rollout.agent.default_agent_loop": "tool_agent",
        },
        ["num_turns/mean", "agent/tool_calls/mean", "agent/tool_error_rate", "agent/cut_by_length_budget"],
    ),
    "one_step_off": (
        {
            "algorithm.adv_estimator": "grpo",
            "actor_rollout_ref.hybrid_engine": False,
            "rollout.nnodes": 1,
            "algorithm.rollout_correction.bypass_mode": True,
        },
        [
            "training/off_policy/trajectory_staleness/mean",
            "timing_s/update_weights",
            "rollout/weight_sync_max_logp_diff",
        ],
    ),
}

FAST = [
    "trainer.total_training_steps=1",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
    "trainer.logger=[file]",
    "trainer.plot=False",
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "trainer.torch_threads_per_worker=2",
]


def _get(cfg: dict, dotted: str):
    for part in dotted.split("."):
        cfg = cfg[part]
    return cfg


# recipes that chain several entry points (tested on their own below)
PIPELINES = {"sft_rl_eval"}


def test_every_recipe_is_covered():
    shipped = {p.stem for p in RECIPES.glob("*.sh")} - PIPELINES
    assert shipped == set(EXPECTED), (
        f"recipes without a test entry: {shipped - set(EXPECTED)}; stale entries: {set(EXPECTED) - shipped}"
    )


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recipe_runs_one_step(name, tmp_path, ray_session):
    run_dir = tmp_path / name
    env = dict(os.environ, PYTHON=sys.executable, RAY_ADDRESS=ray_session.get_runtime_context().gcs_address)
    cmd = [
        "bash",
        str(RECIPES / f"{name}.sh"),
        *FAST,
        f"trainer.log_dir={run_dir}/log",
        f"trainer.default_local_dir={run_dir}/ckpt",
        f"hydra.run.dir={run_dir}/hydra",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{name}.sh failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"

    config = yaml.safe_load((run_dir / "hydra" / ".hydra" / "config.yaml").read_text())
    want_config, want_metrics = EXPECTED[name]
    for key, value in want_config.items():
        assert _get(config, key) == value, f"{name}.sh: {key}={_get(config, key)!r}, expected {value!r}"

    metrics: dict = {}
    for line in (run_dir / "log" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["step"] == 1:
            metrics.update(record["data"])
    assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["actor/grad_norm"])
    missing = [m for m in want_metrics if m not in metrics]
    assert not missing, f"{name}.sh did not report {missing}"


@pytest.mark.slow
def test_sft_rl_eval_recipe_evaluation_equals_the_last_validation(tmp_path):
    """recipes/sft_rl_eval.sh (briefly: SFT from the shipped warm-up for 5 steps, 1 RL step):
    main_generation_server + main_eval on the test split give the RL run's last validation accuracy
    (greedy), and every response equals the validation's response to the same prompt."""
    out = tmp_path / "pipe"
    env = {
        **os.environ,
        "OUT": str(out),
        "SFT_STEPS": "5",
        "RL_STEPS": "1",
        "SFT_INIT": str(REPO / "verl" / "assets" / "embedded_default" / "model"),
        "SFT_ARGS": "optim.lr=1e-5",
        "VERL_FILE_LOGGER_PATH": str(tmp_path / "metrics.jsonl"),
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
    }
    env.pop("RAY_ADDRESS", None)  # the recipe's RL run is a one-worker job: no Ray needed
    proc = subprocess.run(
        ["bash", str(RECIPES / "sft_rl_eval.sh"), f"trainer.validation_data_dir={tmp_path / 'val'}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    evaluation = json.loads((out / "eval.json").read_text().strip().splitlines()[-1])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    val = [
        r["data"]["val-core/verl_toy/addition/reward/mean@1"]
        for r in records
        if "val-core/verl_toy/addition/reward/mean@1" in r["data"]
    ]
    assert val and evaluation["test_score/verl_toy/addition"] == pytest.approx(val[-1], abs=1e-6)
    assert evaluation["test_score/verl_toy/addition"] > 0  # the comparison is not 0 == 0
    import pyarrow.parquet as pq

    generated = {
        row["prompt"][0]["content"]: row["responses"][0] for row in pq.read_table(out / "gen_test.parquet").to_pylist()
    }
    validated = [json.loads(line) for line in (tmp_path / "val" / "1.jsonl").read_text().splitlines()]
    assert len(validated) == len(generated) and all(generated[v["input"]] == v["output"] for v in validated)
