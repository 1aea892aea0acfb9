"""verl.trainer.replay's comparisons (the end-to-end replays are in tests/e2e/test_e2e_reproducibility.py)."""

import math

import pytest
import torch

from verl.trainer.replay import ReplayResult, compare_metrics, compare_weights, is_timing_metric, main
from verl.utils.checkpoint.integrity import save_plain


def test_compare_metrics_skips_timings_and_reports_the_first_difference_in_name_order():
    logged = {"b/x": 1.0, "a/y": 2.0, "timing_s/gen": 3.0, "perf/mfu": 0.1, "c/nan": math.nan, "agent/decode_s": 1.0}
    same = {"b/x": 1.0, "a/y": 2.0, "timing_s/gen": 9.0, "perf/mfu": 0.2, "c/nan": math.nan, "val/extra": 1.0}
    assert compare_metrics(logged, same) == (3, None)  # timings ignored, nan equals nan, extras ignored
    assert is_timing_metric("agent/tool_latency_s/mean") and not is_timing_metric("agent/tool_calls/mean")
    assert compare_metrics(logged, {**same, "b/x": 1.0000001, "a/y": 2.5}) == (3, ("a/y", 2.0, 2.5))
    assert compare_metrics(logged, {"b/x": 1.0, "c/nan": math.nan}) == (3, ("a/y", 2.0, None))


def test_report_says_match_or_names_the_metric_and_the_gap():
    assert ReplayResult(step=3, compared=5, weights="equal (2 files)").report().endswith("match")
    bad = ReplayResult(step=3, compared=5, difference=("actor/grad_norm", 2.0, 2.5), weights="equal (2 files)")
    report = bad.report()
    assert not bad.match and report.endswith("mismatch")
    assert "actor/grad_norm differs: logged 2.0, replayed 2.5 (difference 0.5, relative 0.2)" in report
    assert not ReplayResult(step=1, weights="differ: actor/optim.pt").match


def _step(tmp_path, name, weight, rng_value):
    actor = tmp_path / name / "actor"
    (actor / "huggingface").mkdir(parents=True)
    from safetensors.torch import save_file

    save_file({"w": weight}, str(actor / "huggingface" / "model.safetensors"))
    save_plain({"state": {0: {"exp_avg": weight * 2}}}, str(actor / "optim.pt"), "optimizer")
    save_plain({"rng": torch.tensor([rng_value])}, str(actor / "extra_state_world_size_1_rank_0.pt"), "extra")
    (actor / "checkpoint_meta.json").write_text(f'{{"written": "{name}"}}')
    return str(tmp_path / name)


def test_compare_weights_compares_model_and_optimizer_tensors_bit_for_bit(tmp_path):
    w = torch.tensor([1.0, 0.0, 3.0])
    a = _step(tmp_path, "a", w, 1)
    b = _step(tmp_path, "b", w.clone(), 2)  # other RNG state and metadata: not compared
    assert compare_weights(a, b) == "equal (2 files)"
    c = _step(tmp_path, "c", torch.tensor([1.0, -0.0, 3.0]), 1)  # -0.0 == 0.0, but not bit for bit
    assert compare_weights(a, c) == "differ: actor/huggingface/model.safetensors"


def test_cli_needs_the_checkpoint_before_the_step(tmp_path, capsys):
    (tmp_path / "global_step_2").mkdir()
    (tmp_path / "global_step_2" / "trainer_state.pt").write_bytes(b"")
    with pytest.raises(
        FileNotFoundError, match="replaying step 4 needs .*global_step_3; the checkpoints here are of steps"
    ):
        main([str(tmp_path), "--step", "4"])
    with pytest.raises(FileNotFoundError, match="no global_step_"):
        main([str(tmp_path / "nothing"), "--step", "2"])
