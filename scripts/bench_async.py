#!/usr/bin/env python
"""Seconds per step of one-step-off training against the synchronous trainer (docs/async.md).

Each run is a fresh process on the embedded default (32 prompts x 8 samples, <= 8 response
tokens; validation and checkpoints off), with `--steps` steps:

- `sync_local`: `python -m verl.trainer.main_ppo` (the default: one worker inside the driver);
- `sync_ray`: the same on one Ray worker process (`trainer.worker_backend=ray`);
- `one_step_off`: `python -m verl.experimental.one_step_off_policy.main_ppo` (one actor process,
  one rollout process; generation of batch t+1 overlaps step t).

Runs are interleaved round by round and medians taken (the machine is shared and noisy). Per run:
the median of the wall time between consecutive steps' ends (`perf/elapsed_s`) over the steps
after `--warmup`, and the medians of `timing_s/gen` (for one-step-off: the wait for the batch),
`timing_s/update_actor` and `timing_s/update_weights`.

Usage:
    python scripts/bench_async.py                       # 8 steps, 2 rounds, threads per worker 1
    python scripts/bench_async.py --steps 12 --rounds 3 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# a private Ray per run (`address=local`), even where another Ray runs on this machine
PRIVATE_RAY = "ray_kwargs.ray_init.address=local"
VARIANTS = {
    "sync_local": ("verl.trainer.main_ppo", ["trainer.worker_backend=local"]),
    "sync_ray": ("verl.trainer.main_ppo", ["trainer.worker_backend=ray", PRIVATE_RAY]),
    "one_step_off": ("verl.experimental.one_step_off_policy.main_ppo", [PRIVATE_RAY]),
}
PHASES = ("gen", "update_actor", "update_weights")


def run_once(name: str, steps: int, threads: int, work: Path) -> list[dict]:
    """One run of a variant; returns its metrics, one dict per step."""
    module, extra = VARIANTS[name]
    out = work / name
    cmd = [
        sys.executable,
        "-m",
        module,
        "algorithm.adv_estimator=grpo",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[file]",
        "trainer.plot=False",
        f"trainer.torch_threads_per_worker={threads}",
        f"trainer.log_dir={out}/log",
        f"trainer.default_local_dir={out}/ckpt",
        "trainer.resume_mode=disable",
        f"hydra.run.dir={out}/hydra",
        *extra,
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    by_step: dict[int, dict] = {}
    for line in (out / "log" / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        by_step.setdefault(rec["step"], {}).update(rec["data"])
    return [by_step[s] for s in sorted(by_step) if s > 0]


def summarize(steps: list[dict], warmup: int) -> dict[str, float]:
    ends = [m["perf/elapsed_s"] for m in steps]
    step_times = [b - a for a, b in zip(ends, ends[1:], strict=False)][warmup:]
    out = {"step_s": statistics.median(step_times)}
    for phase in PHASES:
        values = [m.get(f"timing_s/{phase}") for m in steps[warmup + 1 :]]
        values = [v for v in values if v is not None]
        out[phase] = statistics.median(values) if values else float("nan")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="step intervals left out at the start")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="trainer.torch_threads_per_worker")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args()
    results: dict[str, list[dict]] = {v: [] for v in args.variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in args.variants:
                work = Path(tmp) / f"round{r}"
                results[name].append(summarize(run_once(name, args.steps, args.threads, work), args.warmup))
                print(f"round {r + 1} {name}: {results[name][-1]}", flush=True)
    print(f"\nmedians over {args.rounds} round(s), steps {args.warmup + 2}..{args.steps}, threads {args.threads}")
    print(f"{'variant':<14} {'s/step':>8} " + " ".join(f"{p:>14}" for p in PHASES))
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{name:<14} {med['step_s']:>8.3f} " + " ".join(f"{med[p]:>14.3f}" for p in PHASES))


if __name__ == "__main__":
    main()
