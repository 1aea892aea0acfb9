"""End to end (Ray, tiny model): a kill between a checkpoint and its log line, and a damaged
newest checkpoint, both survived by the next run (issue 15)."""

import json
import logging
import os

import pytest
from test_e2e_ppo import assets, run  # noqa: F401 - the module-scoped fixture is reused

pytestmark = [pytest.mark.slow, pytest.mark.ray]

COMMON = (
    "algorithm.adv_estimator=grpo",
    "trainer.test_freq=-1",
    "trainer.val_before_train=False",
    "trainer.save_freq=2",
    "trainer.total_epochs=3",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
)


def _steps_in_log(run_dir) -> list[int]:
    with open(os.path.join(run_dir, "log", "metrics.jsonl")) as fh:
        return [json.loads(line)["step"] for line in fh]


def test_saved_step_metrics_survive_a_kill_and_a_damaged_checkpoint_falls_back(ray_session, assets, tmp_path, caplog):  # noqa: F811
    run_dir = tmp_path / "r"
    run(assets, run_dir, *COMMON, "trainer.total_training_steps=2")
    log = os.path.join(run_dir, "log", "metrics.jsonl")
    # the state a SIGKILL right after the save of step 2 leaves: the checkpoint is published, the
    # step's log line was never written
    lines = open(log).read().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    open(log, "w").write(lines[0] + "\n")
    with caplog.at_level(logging.WARNING):
        _, metrics = run(assets, run_dir, *COMMON, "trainer.total_training_steps=4")
    assert _steps_in_log(run_dir) == [1, 2, 3, 4]  # step 2 re-logged from the checkpoint
    assert "actor/pg_loss" in metrics[2] and "the metrics of step 2 were not in the log" in caplog.text

    # the newest checkpoint (step 4) is damaged: auto-resume warns and continues from step 2
    victim = os.path.join(run_dir, "ckpt", "global_step_4", "actor", "dcp", "__0_0.distcp")
    data = open(victim, "rb").read()
    open(victim, "wb").write(data[: len(data) // 2])
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        run(assets, run_dir, *COMMON, "trainer.total_training_steps=4")
    assert f"{victim} is truncated" in caplog.text and "falling back" in caplog.text
    assert _steps_in_log(run_dir) == [1, 2, 3, 4, 3, 4]  # steps 3 and 4 trained again from step 2
    # resuming a damaged checkpoint by path fails, naming the file (step 4 was saved again: damage it again)
    data = open(victim, "rb").read()
    open(victim, "wb").write(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"global_step_4/actor/dcp/__0_0\.distcp is truncated"):
        run(
            assets,
            run_dir,
            *COMMON,
            "trainer.total_training_steps=4",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={os.path.join(run_dir, 'ckpt', 'global_step_4')}",
        )
