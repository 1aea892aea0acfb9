"""`scripts/bench_reward_loop.py` runs end to end (tiny: one worker, two steps, a short sleep) and
reports a step time and `timing_s/reward` for each variant it ran."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_reward_loop_prints_a_row_per_variant():
    args = ["--workers", "1", "--steps", "2", "--batch", "2", "--sleep_s", "0.01", "--skip_driver"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_reward_loop.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.split() for line in proc.stdout.splitlines() if line.startswith(("loop-", "async-"))]
    rows = {parts[0]: parts[1:] for parts in lines}
    assert set(rows) == {"loop-1", "async-1"}
    for step_s, reward_s in rows.values():
        assert 0 < float(reward_s) <= float(step_s)
