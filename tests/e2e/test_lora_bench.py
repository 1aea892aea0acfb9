"""scripts/bench_lora.py measures what it says on one configuration (a smoke run, in process)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("peft")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_lora.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_lora", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_resource_measurement_of_the_embedded_model():
    bench = _bench()
    path = bench.build_model_dir("embedded", Path("unused"))
    full = bench.measure_one(path, 0, steps=2)
    lora = bench.measure_one(path, 4, steps=2)
    assert full["trainable_params"] == full["total_params"] == 1_017_728  # build_info.json
    # r = 4 on q,k,v,o,gate,up,down of 4 layers, hidden 128, kv 2 x 32 = 64, intermediate 512:
    # sum of r * (in + out) = 4 * (256 + 192 + 192 + 256 + 3 * 640) per layer
    assert lora["trainable_params"] == 4 * 4 * (256 + 192 + 192 + 256 + 3 * 640)
    for row in (full, lora):
        assert row["optimizer_state_bytes"] == 2 * 4 * row["trainable_params"]  # AdamW exp_avg + exp_avg_sq, fp32
        assert row["step_time_s"] > 0 and row["peak_rss_above_start_bytes"] > 0
    assert lora["checkpoint_bytes"] < full["checkpoint_bytes"] / 10
