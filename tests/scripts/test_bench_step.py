"""`scripts/bench_step.py` runs end to end (a short default-shape run with the start-up breakdown)
and reports what issue 14 asks: seconds per step with phases, start-up, shutdown, peak memory per
process, and the start-up phases; TRL is skipped (not a dependency)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_step_reports_steps_memory_and_start_up(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "bench_step.py"),
            "--shapes",
            "default",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--rounds",
            "1",
            "--threads",
            "1",
            "--no_trl",
            "--startup",
            "--work_dir",
            str(tmp_path / "work"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "s/step" in proc.stdout and "peak memory sum" in proc.stdout
    results = json.loads(out.read_text())
    run = results["default"]["verl"][0]
    assert 0 < run["step_s"] < 60 and run["startup_s"] > 0 and run["shutdown_s"] >= 0
    assert set(run["phases"]) >= {"gen", "reward", "update_actor", "driver"}
    # the default job keeps its worker in the driver: one process of ours, no Ray daemons
    assert [name.split(":")[0] for name in run["peak_mb"]] == ["driver"]
    startup = results["startup"][0]
    assert "[startup] round 0 (local workers)" in proc.stdout
    assert "ray_init" not in startup  # no Ray was started
    assert startup["total"] > startup["imports"] > 0 and startup["init_workers"] > 0
