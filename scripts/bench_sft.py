#!/usr/bin/env python
"""SFT step time: `verl.trainer.sft_trainer` against the older `verl.trainer.fsdp_sft_trainer` on the
same data, model and settings (the embedded default's warm-up: its shipped `sft/train.parquet`, its
random init, batch 64, one process).

Each trainer runs `--steps` optimizer steps, `--repeats` times, alternating (the machine is shared:
compare side by side); printed: the median seconds per step of each run (`perf/time_per_step`,
the first `--skip` steps left out), the median over runs, and the largest relative difference of
the per-step losses between the two trainers (they compute the same loss: padding-free rows
against padded rows changes only the rounding).

Usage:
    python scripts/bench_sft.py --steps 30 --repeats 3 --threads 1
    python scripts/bench_sft.py --steps 20 --batch_size 256   # a larger batch
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def _build_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "build_embedded_default", REPO_ROOT / "scripts" / "build_embedded_default.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_once(build, trainer: str, steps: int, batch_size: int, work: Path) -> list[dict]:
    """One warm-up run of `trainer` for `steps` steps; returns its per-step history."""
    args = build.parse_args(["--sft_steps", str(steps), "--sft_batch_size", str(batch_size)])
    args.sft_trainer = trainer
    shipped = REPO_ROOT / "verl" / "assets" / "embedded_default" / "sft"
    paths = {"sft_train": str(shipped / "train.parquet"), "sft_val": str(shipped / "val.parquet")}
    init = work / "init"
    if not init.exists():
        build.save_addition_init(args, work)
    out = work / f"{trainer}_{len(list(work.iterdir()))}"
    _, result = build.run_warmup(init, paths, out, args)
    return result["history"]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip", type=int, default=3, help="first steps left out of the median (warm-up)")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    build = _build_script()
    runs: dict[str, list[float]] = {"fsdp_sft_trainer": [], "sft_trainer": []}
    losses: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_sft_") as tmp:
        for _ in range(args.repeats):
            for trainer in runs:
                hist = run_once(build, trainer, args.steps, args.batch_size, Path(tmp))
                runs[trainer].append(statistics.median(h["perf/time_per_step"] for h in hist[args.skip :]))
                losses[trainer] = [h["train/loss"] for h in hist]
    rel = max(abs(a - b) / abs(b) for a, b in zip(losses["sft_trainer"], losses["fsdp_sft_trainer"], strict=True))
    report = {
        "batch_size": args.batch_size,
        "steps": args.steps,
        "threads": args.threads,
        "seconds_per_step": {k: [round(v, 4) for v in vs] for k, vs in runs.items()},
        "median_seconds_per_step": {k: round(statistics.median(vs), 4) for k, vs in runs.items()},
        "max_relative_loss_difference": rel,
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
