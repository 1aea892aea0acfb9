"""Bit-identical runs at 2 torch threads (docs/reproducibility.md): the default job twice, a run
killed with SIGKILL right after its save at an epoch boundary and resumed, PPO with a critic,
LoRA, the agent-loop recipe and two data-parallel workers; and `verl.trainer.replay`.

The jobs are the embedded default's shape (32 prompts x 8 samples): at that size the backward of
the prefix grouper's repeated-row gathers runs on both threads, which is what made runs differ
before torch's deterministic algorithms were switched on (`trainer.deterministic`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl.trainer.replay import compare_weights, is_timing_metric, replay
from verl.utils import embedded_default
from verl.utils.checkpoint.integrity import write_manifest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STEPS = 6
KILL_AT_STEP = 4  # 64 prompts, 32 per step: an epoch is 2 steps, so step 4 ends epoch 2

KILL_CALLBACK = '''
import os
import signal

from verl.trainer.ppo.ray_trainer import TrainerCallback


class KillAfterSave(TrainerCallback):
    """SIGKILL the run right after the checkpoint of step $VERL_TEST_KILL_AT_STEP is published
    (before that step's log line is written)."""

    def on_fit_start(self, trainer):
        step = int(os.environ.get("VERL_TEST_KILL_AT_STEP", "0"))
        save = trainer.checkpointer.save

        def save_then_die(metrics=None):
            path = save(metrics)
            if trainer.global_steps == step:
                os.kill(os.getpid(), signal.SIGKILL)
            return path

        trainer.checkpointer.save = save_then_die
'''


def comparable(step_metrics: dict) -> dict:
    return {k: v for k, v in step_metrics.items() if not is_timing_metric(k)}


def read_metrics(log_dir: Path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for line in (log_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out.setdefault(rec["step"], {}).update(rec["data"])
    return out


def differences(a: dict[int, dict], b: dict[int, dict]) -> list[str]:
    out = [f"steps {sorted(a)} vs {sorted(b)}"] if sorted(a) != sorted(b) else []
    for step in sorted(set(a) & set(b)):
        x, y = comparable(a[step]), comparable(b[step])
        out += [
            f"step {step} {k}: {x.get(k)!r} vs {y.get(k)!r}" for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)
        ]
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The default job on 64 of its prompts (3 epochs of 2 steps), 2 torch threads, a checkpoint
    every step, with the kill callback (inactive unless $VERL_TEST_KILL_AT_STEP is set)."""
    root = tmp_path_factory.mktemp("repro")
    train = root / "train.parquet"
    pq.write_table(pq.read_table(embedded_default.train_files()).slice(0, 64), train)
    callback = root / "kill_after_save.py"
    callback.write_text(KILL_CALLBACK)
    return root, [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={train}",
        "trainer.total_epochs=3",
        "trainer.torch_threads_per_worker=2",
        "trainer.save_freq=1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.logger=[file]",
        "trainer.plot=False",
        f"trainer.callbacks=[{callback}:KillAfterSave]",
    ]


def cli(run_dir: Path, overrides: list[str], env_extra: dict | None = None, script: list[str] | None = None):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env_extra or {}))
    env.pop("RAY_ADDRESS", None)
    cmd = script or [sys.executable, "-m", "verl.trainer.main_ppo"]
    args = [
        *overrides,
        f"trainer.log_dir={run_dir}/log",
        f"trainer.default_local_dir={run_dir}/ckpt",
        f"hydra.run.dir={run_dir}/hydra",
    ]
    return subprocess.run(
        [*cmd, *args],
        capture_output=True,
        text=True,
        env=dict(env, PYTHON=sys.executable),
        cwd=str(run_dir.parent),
        timeout=900,
    )


@pytest.fixture(scope="module")
def straight(job):
    root, overrides = job
    run_dir = root / "a"
    proc = cli(run_dir, overrides)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir


def test_default_job_twice_is_bit_identical(job, straight):
    root, overrides = job
    again = root / "b"
    proc = cli(again, overrides)
    assert proc.returncode == 0, proc.stderr[-4000:]
    a, b = read_metrics(straight / "log"), read_metrics(again / "log")
    assert sorted(a) == list(range(1, STEPS + 1))
    assert differences(a, b) == []
    last = f"global_step_{STEPS}"
    assert compare_weights(str(straight / "ckpt" / last), str(again / "ckpt" / last)).startswith("equal")


def test_kill_9_right_after_a_save_at_an_epoch_boundary_resumes_bit_for_bit(job, straight):
    root, overrides = job
    run_dir = root / "killed"
    proc = cli(run_dir, overrides, {"VERL_TEST_KILL_AT_STEP": str(KILL_AT_STEP)})
    assert proc.returncode == -9, proc.stderr[-4000:]
    assert (run_dir / "ckpt" / f"global_step_{KILL_AT_STEP}").is_dir()
    assert max(read_metrics(run_dir / "log")) == KILL_AT_STEP - 1  # killed before step 4's log line
    proc = cli(run_dir, overrides)  # the same command again: resume_mode=auto
    assert proc.returncode == 0, proc.stderr[-4000:]
    resumed = read_metrics(run_dir / "log")
    assert resumed[KILL_AT_STEP + 1]["training/epoch"] == 2
    assert differences(read_metrics(straight / "log"), resumed) == []
    last = f"global_step_{STEPS}"
    assert compare_weights(str(straight / "ckpt" / last), str(run_dir / "ckpt" / last)).startswith("equal")


def test_replay_of_a_step_matches_its_metrics_and_weights(straight, tmp_path):
    dump = tmp_path / "step5.pt"
    result = replay(str(straight / "ckpt"), 5, dump=str(dump))
    assert result.match, result.report()
    assert result.compared > 30 and result.weights.startswith("equal")
    assert result.warnings == []
    import torch

    batch = torch.load(dump, weights_only=True)
    assert batch["step"] == 5
    assert {"prompts", "responses", "advantages", "token_level_rewards"} <= set(batch["tensors"])
    assert len(batch["prompts_text"]) == batch["tensors"]["responses"].shape[0] == 256


def test_replay_reports_the_first_metric_that_differs(straight, tmp_path):
    # GRPO's advantage normalisation switched off in the record of step 5's starting point: the
    # replayed step 5 differs from the logged one, and the report names the first metric and the
    # weights
    ckpt = tmp_path / "ckpt"
    shutil.copytree(straight / "ckpt", ckpt)
    record_path = ckpt / "global_step_4" / "run_record.json"
    record = json.loads(record_path.read_text())
    assert record["config"]["algorithm"]["norm_adv_by_std_in_grpo"] is True
    record["config"]["algorithm"]["norm_adv_by_std_in_grpo"] = False
    record["environment"]["torch"] = "0.0.0"  # provoked: replay warns about it
    record_path.write_text(json.dumps(record))
    write_manifest(str(ckpt / "global_step_4"))  # the checkpoint verifies again (changed on purpose)
    result = replay(str(ckpt), 5)
    assert not result.match
    name, logged, replayed = result.difference
    assert logged != replayed and name in read_metrics(straight / "log")[5]
    assert result.weights.startswith("differ: actor/")
    assert any(w.startswith("torch: '0.0.0'") for w in result.warnings)
    report = result.report()
    assert f"step 5: {name} differs: logged {logged!r}, replayed {replayed!r}" in report
    assert report.startswith("warning: environment differs") and report.endswith("mismatch")


def test_replay_cli_prints_match(straight):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "verl.trainer.replay", str(straight / "ckpt"), "--step", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("match") and "weights equal" in proc.stdout


SHORT = [
    "trainer.total_training_steps=3",
    "trainer.torch_threads_per_worker=2",
    "trainer.save_freq=3",
    "trainer.test_freq=-1",
    "trainer.val_before_train=False",
    "trainer.logger=[file]",
    "trainer.plot=False",
]


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.adv_estimator=gae"],
        [
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.actor.use_kl_loss=True",
        ],
        ["algorithm.adv_estimator=grpo", "trainer.n_gpus_per_node=2", "trainer.cpus_per_worker=1"],
    ],
    ids=["ppo_critic", "lora", "two_workers"],
)
def test_other_trainer_paths_are_bit_identical(tmp_path, overrides):
    runs = []
    for name in ("a", "b"):
        proc = cli(tmp_path / name, [*overrides, *SHORT])
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append(tmp_path / name)
    a, b = (read_metrics(r / "log") for r in runs)
    assert sorted(a) == [1, 2, 3] and differences(a, b) == []
    assert compare_weights(*(str(r / "ckpt" / "global_step_3") for r in runs)).startswith("equal")


def test_agent_loop_recipe_is_bit_identical(tmp_path):
    script = ["bash", str(REPO / "recipes" / "tool_agent.sh")]
    runs = []
    for name in ("a", "b"):
        proc = cli(tmp_path / name, ["trainer.total_training_steps=2", *SHORT[1:]], script=script)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append(tmp_path / name)
    a, b = (read_metrics(r / "log") for r in runs)
    assert sorted(a) == [1, 2] and differences(a, b) == []
    assert "num_turns/mean" in a[1]
