#!/usr/bin/env python
"""Provoke each failure that the training-health monitor names (docs/health.md) on the embedded
tasks, and check that it is detected within a stated number of steps.

Each scenario is a short `python -m verl.trainer.main_ppo` run with one thing broken on purpose; the
script reads the run's `metrics.jsonl` and prints, per expected signal, the step of its first trip
against the bound. `--false-alarms` runs the shipped recipes instead (default GRPO, agent loop,
LoRA, PPO with a critic) for several seeds and lists every signal that tripped.

    python scripts/health_repro.py                       # every scenario
    python scripts/health_repro.py lr_x100 mismatch      # some of them
    python scripts/health_repro.py --false-alarms --seeds 1 2 3 [--steps N]
    python scripts/health_repro.py --replay runs/verl/default/metrics.jsonl   # today's monitor, a past run

This file is also the reward module of the reward scenarios
(`custom_reward_function.path=scripts/health_repro.py custom_reward_function.name=...`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = str(Path(__file__).resolve())


# ============================================================================ broken rewards
def _correct(solution_str: str, ground_truth) -> float:
    from verl.utils.reward_score.verl_toy import compute_score

    task = "calculator" if "=" in solution_str or "<tool_call>" in solution_str else "addition"
    return float(compute_score(solution_str, ground_truth, task=task))


def length_reward(data_source, solution_str, ground_truth, extra_info=None, **kw):
    """Pays for length: 1 per 8 characters of the response, whatever it says (`acc`: exact match)."""
    return {"score": min(len(solution_str.strip()), 8) / 8.0, "acc": _correct(solution_str, ground_truth)}


def form_reward(data_source, solution_str, ground_truth, extra_info=None, **kw):
    """Pays only for the answer's form: a number whose last digit is even, right or wrong."""
    ans = solution_str.strip()
    ok = bool(re.fullmatch(r"\d+", ans)) and int(ans[-1]) % 2 == 0
    return {"score": float(ok), "acc": _correct(solution_str, ground_truth)}


def direct_answer_reward(data_source, solution_str, ground_truth, extra_info=None, **kw):
    """Calculator task: pays a final answer (after the last `=` or `~`) of the right number of
    digits given without a tool call. A guess passes: the reward does not need the tool (and does
    not pay for it). `acc`: the real exact match."""
    cut = max(solution_str.rfind("="), solution_str.rfind("~"))
    answer = solution_str[cut + 1 :].strip().split("<")[0].strip() if cut >= 0 else ""
    ok = "<tool_call>" not in solution_str and answer.isdigit() and len(answer) == len(str(ground_truth).strip())
    return {"score": float(ok), "acc": _correct(solution_str, ground_truth)}


# ============================================================================ scenarios
@dataclass
class Scenario:
    """A broken run: its overrides, the signals it must trip and the step by which each must."""

    what: str
    overrides: list[str]
    expect: dict[str, int]
    steps: int
    recipe: str | None = None  # recipes/<name>.sh instead of the plain default job
    extra: list[str] = field(default_factory=list)


def _reward(name: str) -> list[str]:
    return [f"custom_reward_function.path={HERE}", f"custom_reward_function.name={name}"]


SCENARIOS = {
    "lr_x100": Scenario(
        "the default job with lr x100 (3e-3): the score falls to 0, every group's rewards are equal, "
        "responses grow to the length cap",
        ["actor_rollout_ref.actor.optim.lr=3e-3"],
        {"dead_signal": 12, "length_clip": 12},
        16,
    ),
    "length_reward": Scenario(
        "a reward that pays for length (1 per 8 characters), lr x10 (3e-4) so that it shows within 20 steps",
        [*_reward("length_reward"), "actor_rollout_ref.actor.optim.lr=3e-4"],
        {"reward_length_corr": 15},
        20,
    ),
    "form_reward": Scenario(
        "a reward that pays only for the answer's form (an even last digit): reward up, accuracy down",
        [*_reward("form_reward"), "trainer.test_freq=5"],
        {"reward_val_divergence": 20},
        25,
    ),
    "tool_shortcut": Scenario(
        "the calculator task (agent loop) with a reward that pays a direct answer of the right length "
        "(a guess passes: the tool is not needed, and not paid)",
        [*_reward("direct_answer_reward"), "trainer.test_freq=5"],
        {"tool_call_collapse": 20},
        25,
        recipe="tool_agent",
    ),
    "mismatch": Scenario(
        "the rollout in bf16 (a separate copy) while the trainer computes in fp32",
        [
            "+actor_rollout_ref.rollout.engine_kwargs.hf.separate_copy=True",
            "+actor_rollout_ref.rollout.engine_kwargs.hf.dtype=bf16",
            # the start-up probe refuses a log-prob gap above 0.1; this run is about that gap
            "+actor_rollout_ref.rollout.engine_kwargs.hf.sync_check_tol=1.0",
        ],
        {"rollout_mismatch": 8},
        10,
    ),
}

RECIPES = {"default": None, "agent_loop": "tool_agent", "lora": "grpo_lora", "ppo_critic": "ppo"}


# ============================================================================ running
def run_job(recipe: str | None, overrides: list[str], out_dir: Path, log) -> tuple[int, float]:
    """One training run writing its metrics to `out_dir`; returns (exit code, seconds)."""
    common = [
        f"trainer.log_dir={out_dir}",
        f"trainer.default_local_dir={out_dir}/ckpt",
        "trainer.save_freq=-1",
        "trainer.logger=[console,file]",
        "trainer.resume_mode=disable",
    ]
    if recipe is None:
        cmd = [sys.executable, "-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=grpo"]
    else:
        cmd = ["bash", str(REPO / "recipes" / f"{recipe}.sh")]
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    t0 = time.monotonic()
    with open(out_dir / "run.log", "w") as fh:
        rc = subprocess.call([*cmd, *common, *overrides], cwd=out_dir, env=env, stdout=fh, stderr=subprocess.STDOUT)
    log(f"  exit {rc} after {time.monotonic() - t0:.0f} s ({out_dir / 'run.log'})")
    return rc, time.monotonic() - t0


def first_trips(metrics_path: Path) -> tuple[dict[str, int], int, list[float]]:
    """(signal -> first step its `health/<signal>/active` was 1, last step, health share of each
    step's time: timing_s/health / timing_s/step)."""
    trips: dict[str, int] = {}
    last = 0
    shares = []
    for line in metrics_path.read_text().splitlines():
        rec = json.loads(line)
        step, data = int(rec["step"]), rec["data"]
        last = max(last, step)
        for key, value in data.items():
            if key.startswith("health/") and key.endswith("/active") and value and key.count("/") == 2:
                trips.setdefault(key.split("/")[1], step)
        if data.get("timing_s/step") and "timing_s/health" in data:
            shares.append(float(data["timing_s/health"]) / float(data["timing_s/step"]))
    return trips, last, shares


def replay(metrics_path: Path, log) -> dict[str, int]:
    """Run today's monitor (default `trainer.health`) over a finished run's `metrics.jsonl` (the
    batch statistics are logged there); returns signal -> the step of each first trip."""
    from verl.trainer.config.health import HealthConfig
    from verl.trainer.ppo.health import HealthMonitor

    mon = HealthMonitor(HealthConfig())
    first: dict[str, int] = {}
    for line in metrics_path.read_text().splitlines():
        rec = json.loads(line)
        step, data = int(rec["step"]), rec["data"]
        if any(k.startswith("val-core/") for k in data):
            mon.observe_validation(step, data)
        if step == 0:
            continue
        _, trips = mon.observe(step, data)
        for t in trips:
            first.setdefault(t.signal, t.step)
            log(f"  {t.message()}")
    log(f"{metrics_path}: {mon.step} steps, tripped: {first or 'nothing'}")
    return first


def _median(values: list[float]) -> float:
    vals = sorted(values)
    return vals[len(vals) // 2] if vals else float("nan")


def reproduce(names: list[str], root: Path, log) -> bool:
    """Run the scenarios; print one line per expected signal; True when every one was detected in time."""
    ok = True
    for name in names:
        sc = SCENARIOS[name]
        log(f"{name}: {sc.what}")
        out = root / name
        out.mkdir(parents=True, exist_ok=True)
        overrides = [*sc.overrides, f"trainer.total_training_steps={sc.steps}", *sc.extra]
        rc, _ = run_job(sc.recipe, overrides, out, log)
        path = out / "metrics.jsonl"
        trips, last, shares = first_trips(path) if path.is_file() else ({}, 0, [])
        for signal, bound in sc.expect.items():
            step = trips.get(signal)
            good = rc == 0 and step is not None and step <= bound
            ok &= good
            found = f"step {step}" if step is not None else "never"
            log(f"  {'OK  ' if good else 'FAIL'} {signal}: tripped at {found} (bound: step {bound}; {last} steps run)")
        others = {s: st for s, st in trips.items() if s not in sc.expect}
        log(f"  also tripped: {others or 'nothing'}; health cost: median {_median(shares):.2%} of the step")
    return ok


def false_alarms(labels: list[str], seeds: list[int], steps: int | None, root: Path, log) -> bool:
    """Run each shipped recipe per seed over its whole run (or `steps`); True when nothing tripped."""
    clean = True
    for label in labels:
        recipe = RECIPES[label]
        for seed in seeds:
            out = root / f"{label}_seed{seed}"
            out.mkdir(parents=True, exist_ok=True)
            overrides = [f"trainer.seed={seed}"] + ([f"trainer.total_training_steps={steps}"] if steps else [])
            rc, secs = run_job(recipe, overrides, out, log)
            path = out / "metrics.jsonl"
            trips, last, shares = first_trips(path) if path.is_file() else ({}, 0, [])
            clean &= rc == 0 and not trips
            log(
                f"{label} seed {seed}: exit {rc}, {last} steps in {secs:.0f} s, tripped: {trips or 'nothing'}, "
                f"health cost: median {_median(shares):.2%} of the step"
            )
    return clean


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="*", help=f"some of {sorted(SCENARIOS)} (default: all)")
    ap.add_argument("--false-alarms", action="store_true", help="run the shipped recipes instead")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--recipes", nargs="+", choices=sorted(RECIPES), default=list(RECIPES), help="--false-alarms")
    ap.add_argument("--steps", type=int, default=None, help="--false-alarms: steps per run (default: the recipe's)")
    ap.add_argument("--out", default=None, help="where the runs go (default: a new temporary directory)")
    ap.add_argument("--replay", nargs="+", metavar="METRICS_JSONL", help="re-run the monitor over finished runs")
    args = ap.parse_args(argv)
    if args.replay:
        for path in args.replay:
            replay(Path(path), print)
        return 0
    unknown = [n for n in args.scenarios if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; expected some of {sorted(SCENARIOS)}")
    root = Path(args.out or tempfile.mkdtemp(prefix="health_repro_")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    print(f"runs in {root}", flush=True)

    def log(msg: str) -> None:
        print(msg, flush=True)

    if args.false_alarms:
        ok = false_alarms(args.recipes, args.seeds, args.steps, root, log)
    else:
        ok = reproduce(args.scenarios or list(SCENARIOS), root, log)
    print("all detected as stated" if ok and not args.false_alarms else ("no false alarm" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
