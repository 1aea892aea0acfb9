"""Training health end to end on the embedded default job (docs/health.md; the full runs of every
scenario and the 3-seed recipe runs are `scripts/health_repro.py`): lr x100 trips `dead_signal`
and `stop` ends the run at that step, saying why; a bf16 rollout beside an fp32 trainer trips
`rollout_mismatch`; the healthy job trips nothing."""

from __future__ import annotations

import json
import logging

import pytest

from verl.trainer.main_ppo import load_default_config, run_ppo

pytestmark = pytest.mark.slow


def _run(tmp_path, *overrides: str) -> list[dict]:
    cfg = load_default_config(
        [
            "algorithm.adv_estimator=grpo",
            f"trainer.log_dir={tmp_path}/log",
            f"trainer.default_local_dir={tmp_path}/ckpt",
            "trainer.logger=[console,file]",
            "trainer.save_freq=-1",
            *overrides,
        ]
    )
    run_ppo(cfg)
    lines = (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _tripped(rows: list[dict]) -> dict[str, int]:
    first: dict[str, int] = {}
    for rec in rows:
        for key, value in rec["data"].items():
            if key.startswith("health/") and key.endswith("/active") and key.count("/") == 2 and value:
                first.setdefault(key.split("/")[1], rec["step"])
    return first


def test_lr_x100_trips_dead_signal_and_stop_ends_the_run(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="verl.trainer.ppo.health_callback"):
        rows = _run(
            tmp_path,
            "actor_rollout_ref.actor.optim.lr=3e-3",
            "trainer.total_training_steps=12",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "trainer.health.actions.dead_signal=stop",
            "trainer.plot=False",
        )
    trips = _tripped(rows)
    # measured: the score is ~0 from step 2-3, so with patience 3 the trip comes by step 6
    assert trips.get("dead_signal", 99) <= 6, trips
    assert rows[-1]["step"] == trips["dead_signal"]  # stopped after the step that tripped
    assert "health: dead_signal at step" in caplog.text and "usual remedies: lower the learning rate" in caplog.text
    report = (tmp_path / "log" / "health.md").read_text()
    assert f"**The run was stopped:** dead_signal tripped at step {trips['dead_signal']} (action stop)" in report


def test_bf16_rollout_beside_fp32_trainer_trips_rollout_mismatch(tmp_path):
    rows = _run(
        tmp_path,
        "+actor_rollout_ref.rollout.engine_kwargs.hf.separate_copy=True",
        "+actor_rollout_ref.rollout.engine_kwargs.hf.dtype=bf16",
        "+actor_rollout_ref.rollout.engine_kwargs.hf.sync_check_tol=1.0",  # the probe would refuse the gap
        "trainer.total_training_steps=8",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.plot=False",
    )
    assert _tripped(rows).get("rollout_mismatch", 99) <= 8


def test_the_healthy_default_job_trips_nothing(tmp_path):
    rows = _run(tmp_path, "trainer.total_training_steps=30", "trainer.plot=True")
    assert _tripped(rows) == {}
    assert rows[-1]["data"]["health/active"] == 0.0
    assert (tmp_path / "log" / "health.png").is_file()
    assert "Signals tripped: 0 of 12" in (tmp_path / "log" / "health.md").read_text()
