#!/usr/bin/env python
"""Step time and `timing_s/reward` of GRPO on the embedded default with a slow reward: a scoring
function that sleeps `--sleep_s` (default 0.2 s) per sample, then scores with the shipped rule.

Variants, each a separate training run of `--steps` steps on the Ray backend (the first step is
dropped as warm-up, the median of the others is printed):

- `driver`: the driver-side naive manager (`verl.workers.reward_manager`, what the trainer used
  before the reward loop): one sample after another in the driver;
- `loop-N`: the reward loop with N reward workers (Ray actors), sync scoring function (each worker
  runs its samples in its event loop's thread pool: min(32, CPUs + 4) threads);
- `async-1`: the reward loop, one worker, the same function written with `asyncio.sleep`.

    python scripts/bench_reward_loop.py --workers 1 2 4 --steps 3 --batch 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

SCORER = """
import asyncio
import time

from verl.utils.reward_score import default_compute_score


def slow_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep({sleep})
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)


async def slow_score_async(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep({sleep})
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="reward worker counts")
    p.add_argument("--steps", type=int, default=3, help="training steps per run (the first is dropped)")
    p.add_argument("--batch", type=int, default=8, help="prompts per step (x rollout.n = 8 samples each)")
    p.add_argument("--sleep_s", type=float, default=0.2, help="seconds the reward sleeps per sample")
    p.add_argument("--skip_driver", action="store_true", help="skip the driver-side baseline")
    p.add_argument("--skip_async", action="store_true", help="skip the async variant")
    return p.parse_args(argv)


def run_variant(name: str, reward_overrides: list[str], args, work: Path) -> dict:
    """One training run; the median step time and `timing_s/reward` of the steps after the first."""
    from verl.trainer.main_ppo import load_default_config, run_ppo

    run_dir = work / name
    cfg = load_default_config(
        [
            "algorithm.adv_estimator=grpo",
            f"trainer.total_training_steps={args.steps}",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.logger=[file]",
            "trainer.plot=False",
            "trainer.worker_backend=ray",
            f"trainer.log_dir={run_dir}/log",
            f"trainer.default_local_dir={run_dir}/ckpt",
            f"data.train_batch_size={args.batch}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch}",
            *reward_overrides,
        ]
    )
    t0 = time.time()
    run_ppo(cfg)
    wall = time.time() - t0
    rows = [json.loads(line)["data"] for line in (run_dir / "log" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "timing_s/reward" in r][1:]
    return {
        "variant": name,
        "step_s": statistics.median(r["timing_s/step"] for r in rows),
        "reward_s": statistics.median(r["timing_s/reward"] for r in rows),
        "samples": args.batch * 8,
        "run_wall_s": wall,
    }


def variants(args, scorer: Path) -> list[tuple[str, list[str]]]:
    fn = [f"reward.custom_reward_function.path={scorer}", "reward.custom_reward_function.name=slow_score"]
    out = []
    if not args.skip_driver:
        driver = [
            "reward.reward_manager.source=importlib",
            "reward.reward_manager.module.path=verl.workers.reward_manager.naive",
            "reward.reward_manager.name=NaiveRewardManager",
        ]
        out.append(("driver", fn + driver))
    out += [(f"loop-{n}", fn + [f"reward.num_workers={n}"]) for n in args.workers]
    if not args.skip_async:
        fn_async = [fn[0], "reward.custom_reward_function.name=slow_score_async", "reward.num_workers=1"]
        out.append(("async-1", fn_async))
    return out


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    import os

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    work = Path(tempfile.mkdtemp(prefix="bench_reward_loop_"))
    scorer = work / "slow_scorer.py"
    scorer.write_text(SCORER.format(sleep=args.sleep_s))
    results = [run_variant(name, overrides, args, work) for name, overrides in variants(args, scorer)]
    n = args.batch * 8
    print(f"\n{n} samples per step, reward sleeps {args.sleep_s} s per sample ({n * args.sleep_s:.1f} s in sequence)")
    print(f"{'variant':10s} {'step_s':>8s} {'timing_s/reward':>16s}")
    for r in results:
        print(f"{r['variant']:10s} {r['step_s']:8.2f} {r['reward_s']:16.2f}")
    return results


if __name__ == "__main__":
    main()
