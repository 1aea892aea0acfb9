"""Loggers (console line, jsonl file, tensorboard) and the training-curves PNG."""

import json

import pytest

from verl.utils.plot import plot_training_curves, read_metrics
from verl.utils.tracking import Tracking, format_console_line


def test_console_line_is_compact_and_ordered():
    line = format_console_line(
        7,
        {
            "critic/score/mean": 0.41234,
            "val-core/toy/reward/mean@1": 0.5,
            "val-aux/toy/reward/std@1": 0.1,
            "actor/pg_loss": -0.00012,
            "perf/time_per_step": 3.21,
            "unrelated/key": 1.0,
        },
    )
    assert line == "step 7 | score 0.4123 | val toy/reward/mean@1 0.5 | pg_loss -1.200e-04 | s/step 3.21"


def test_file_logger_writes_jsonl_and_appends_on_resume(tmp_path):
    lines = []
    tr = Tracking("p", "e", ["console", "file"], log_dir=str(tmp_path), console_write=lines.append)
    tr.log({"critic/score/mean": 0.1, "x": float("nan")}, step=1)
    tr.finish()
    tr = Tracking("p", "e", ["file"], log_dir=str(tmp_path))
    tr.log({"critic/score/mean": 0.2}, step=2)
    tr.finish()
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2]
    assert recs[0]["data"]["x"] == "nan"  # kept visible, still valid JSON
    assert lines == ["step 1 | score 0.1"]


def test_tensorboard_logger_writes_events(tmp_path):
    pytest.importorskip("tensorboard")
    tr = Tracking("p", "e", ["tensorboard"], log_dir=str(tmp_path))
    tr.log({"a": 1.0, "s": "text is skipped"}, step=1)
    tr.finish()
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tensorboard").iterdir())


def test_unknown_backend_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown backend 'stdout'"):
        Tracking("p", "e", ["stdout"], log_dir=str(tmp_path))


def test_plot_from_jsonl(tmp_path):
    path = tmp_path / "m.jsonl"
    with open(path, "w") as fh:
        for step in range(1, 6):
            data = {"critic/score/mean": step / 10}
            if step % 2 == 1:
                data["val-core/toy/reward/mean@1"] = step / 5
            fh.write(json.dumps({"step": step, "data": data}) + "\n")
        # a resumed run re-logs step 5: the later record wins
        fh.write(json.dumps({"step": 5, "data": {"critic/score/mean": 0.9}}) + "\n")
    recs = read_metrics(str(path))
    assert [s for s, _ in recs] == [1, 2, 3, 4, 5] and recs[-1][1]["critic/score/mean"] == 0.9
    png = plot_training_curves(str(path), str(tmp_path / "c.png"), title="t")
    data = (tmp_path / "c.png").read_bytes()
    assert png and data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert plot_training_curves([(1, {"other": 1.0})], str(tmp_path / "none.png")) is None


def test_file_logger_knows_its_steps_syncs_and_cuts_a_partial_last_line(tmp_path, monkeypatch):
    import os

    tr = Tracking("p", "e", ["file"], log_dir=str(tmp_path))
    tr.log({"a": 1.0}, step=1)
    tr.log({"a": 2.0}, step=2)
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    tr.sync()
    assert synced  # the line is on disk, not only in the page cache
    assert tr.has_logged_step(2) is True and tr.has_logged_step(3) is False
    tr.finish()
    # a crash mid-write leaves half a record: cut off, so the file stays valid JSON lines
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as fh:
        fh.write('{"step": 3, "data": {"a"')
    tr = Tracking("p", "e", ["file"], log_dir=str(tmp_path))
    tr.log({"a": 3.0}, step=3)
    tr.finish()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    assert (
        Tracking("p", "e", ["console"], log_dir=str(tmp_path), console_write=lambda s: None).has_logged_step(1) is None
    )
