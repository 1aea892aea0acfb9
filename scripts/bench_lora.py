#!/usr/bin/env python
"""LoRA against full fine-tuning: resources and learning.

`resources`: for the embedded default model (~1M parameters) and a ~30M-parameter model of the
same architecture (LlamaForCausalLM, random weights, built here), full fine-tuning and LoRA ranks
1/4/16 on every linear layer ("all-linear"), through the real worker (`ActorRolloutRefWorker`,
world size 1, fp32 on CPU):
- trainable parameters and AdamW state bytes (exp_avg + exp_avg_sq, read from the optimizer after
  a step), each also as a fraction of full fine-tuning;
- checkpoint size: the whole actor checkpoint directory: full fine-tuning = dcp/ (weights + optimizer
  shards) + huggingface/ (config, tokenizer); LoRA with `save_lora_only=True` = lora_adapter/ + dcp/
  (optimizer) + huggingface/ (config, tokenizer); the merged export is the size of the full weights;
- peak memory: the process's peak resident set size after model build and 6 update steps, minus
  the RSS before the model was built (each configuration runs in a fresh process);
- step time: median seconds of `update_actor` (steps 2-6) on 16 sequences of 32 tokens (one micro-batch).

`learning`: GRPO on the embedded default (`run_ppo`, hf rollout, one worker) with full
fine-tuning at lr 3e-5 (the shipped default) and LoRA ranks 1/4/16 at a higher lr; validation
(greedy accuracy on the test split) every `--test_freq` steps; median over `--seeds` of the last
validation; a plot of the curves.

Usage:
    python scripts/bench_lora.py resources --out runs/bench_lora/resources.json
    python scripts/bench_lora.py learning --steps 128 --seeds 1,2,3 --out_dir runs/bench_lora
    python scripts/bench_lora.py learning --steps 30 --seeds 1 --ranks 4 --test_freq 10   # reduced
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

SIZES = {
    # the 30M model keeps the embedded default's architecture and tokenizer, scaled up
    "30m": {
        "hidden_size": 512,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 2048,
        "head_dim": 64,
    },
}
VAL_KEY = "val-core/verl_toy/addition/reward/mean@1"


# ---------------------------------------------------------------------------------------------
# resources
# ---------------------------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def build_model_dir(size: str, out_dir: Path) -> str:
    """`embedded`: the shipped model; `30m`: the same architecture scaled up, random N(0, 0.02)."""
    from verl.utils.embedded_default import model_path

    if size == "embedded":
        return str(model_path())
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = model_path()
    config = AutoConfig.from_pretrained(src)
    for key, value in SIZES[size].items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(src).save_pretrained(out_dir)
    return str(out_dir)


def _step_batch(tokenizer, n: int = 16, prompt_len: int = 16, resp_len: int = 16):
    import numpy as np
    import torch

    from verl.protocol import DataProto
    from verl.utils.model import compute_position_id_with_mask

    g = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    ids = torch.randint(0, min(vocab, 256), (n, prompt_len + resp_len), generator=g)
    mask = torch.ones_like(ids)
    resp_mask = torch.ones(n, resp_len, dtype=torch.long)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": compute_position_id_with_mask(mask),
            "responses": ids[:, -resp_len:],
            "response_mask": resp_mask,
            "advantages": torch.randn(n, resp_len, generator=g) * resp_mask,
        },
        non_tensors={"uid": np.array([f"u{i // 4}" for i in range(n)], dtype=object)},
        meta_info={"use_current_as_old_log_prob": True, "temperature": 1.0},
    )


def measure_one(model_dir: str, rank: int, steps: int = 6) -> dict:
    """Resources of one configuration, in this process (call it in a fresh one)."""
    import torch
    from omegaconf import OmegaConf

    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    cfg = OmegaConf.load(REPO_ROOT / "verl" / "trainer" / "config" / "ppo_trainer.yaml")
    overrides = {
        "actor_rollout_ref.model.path": model_dir,
        "actor_rollout_ref.model.lora_rank": rank,
        "actor_rollout_ref.model.lora_alpha": 2 * max(rank, 1),
        "actor_rollout_ref.rollout.n": 4,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
        "actor_rollout_ref.actor.use_dynamic_bsz": False,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 16,
        "data.max_prompt_length": 16,
        "data.max_response_length": 16,
        "actor_rollout_ref.actor.checkpoint.save_lora_only": rank > 0,
    }
    from verl.trainer.config.upstream_keys import apply_embedded_preset, check_upstream_surface

    # the embedded job's settings for the keys not set here; upstream's keys mapped onto ours
    apply_embedded_preset(cfg, [f"{key}=" for key in overrides], always=True)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    cfg = OmegaConf.create(OmegaConf.to_container(check_upstream_surface(cfg), resolve=True))
    rss0 = _rss_bytes()
    worker = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="actor_rollout")
    worker.init_model()
    batch = _step_batch(worker.tokenizer)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        worker.update_actor(batch)
        times.append(time.perf_counter() - start)
    peak = _peak_rss_bytes()
    module = worker.actor_module
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    total = sum(p.numel() for p in module.parameters())
    optim_bytes = sum(
        v.numel() * v.element_size()
        for s in worker.actor_optimizer.state.values()
        for k, v in s.items()
        if torch.is_tensor(v) and k != "step"
    )
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt"
        worker.save_checkpoint(str(ckpt), global_step=1)
        ckpt_bytes = _dir_bytes(ckpt)
    return {
        "rank": rank,
        "trainable_params": trainable,
        "total_params": total,
        "optimizer_state_bytes": optim_bytes,
        "checkpoint_bytes": ckpt_bytes,
        "peak_rss_above_start_bytes": peak - rss0,
        "step_time_s": statistics.median(times[1:] if len(times) > 1 else times),
    }


def resources(args) -> dict:
    results: dict[str, list[dict]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="bench_lora_"))
    try:
        for size in args.models.split(","):
            model_dir = build_model_dir(size, tmp / size)
            rows = []
            for rank in [0] + [int(r) for r in args.ranks.split(",")]:
                proc = subprocess.run(
                    [sys.executable, __file__, "_one", model_dir, str(rank)],
                    capture_output=True,
                    text=True,
                    env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
                    timeout=3600,
                )
                if proc.returncode != 0:
                    raise RuntimeError(f"measuring {size} rank {rank} failed:\n{proc.stderr[-3000:]}")
                rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            full = rows[0]
            for row in rows:
                for key in (
                    "trainable_params",
                    "optimizer_state_bytes",
                    "checkpoint_bytes",
                    "peak_rss_above_start_bytes",
                    "step_time_s",
                ):
                    row[f"{key}_vs_full"] = row[key] / full[key] if full[key] else None
            results[size] = rows
            _print_table(size, rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def _print_table(size: str, rows: list[dict]) -> None:
    print(f"\n{size}: {rows[0]['total_params'] / 1e6:.2f}M parameters")
    print(
        "| config | trainable | % of full | optimizer state | % of full | checkpoint | peak RSS above start | step s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        name = "full" if r["rank"] == 0 else f"LoRA r={r['rank']}"
        print(
            f"| {name} | {r['trainable_params']:,} | {100 * r['trainable_params_vs_full']:.2f}% | "
            f"{r['optimizer_state_bytes'] / 2**20:.2f} MiB | {100 * r['optimizer_state_bytes_vs_full']:.2f}% | "
            f"{r['checkpoint_bytes'] / 2**20:.2f} MiB | {r['peak_rss_above_start_bytes'] / 2**20:.0f} MiB | "
            f"{r['step_time_s']:.3f} |"
        )


# ---------------------------------------------------------------------------------------------
# learning
# ---------------------------------------------------------------------------------------------


def learning_run(rank: int, lr: float, seed: int, steps: int, test_freq: int, run_dir: Path) -> list[tuple[int, float]]:
    """One GRPO run on the embedded default; returns [(step, validation accuracy)]."""
    from verl.trainer.main_ppo import load_default_config, run_ppo

    overrides = [
        "algorithm.adv_estimator=grpo",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={test_freq}",
        "trainer.val_before_train=True",
        f"trainer.seed={seed}",
        f"data.seed={seed}",
        "trainer.logger=[file]",
        f"trainer.log_dir={run_dir}/log",
        f"trainer.default_local_dir={run_dir}/ckpt",
        "trainer.save_freq=-1",
        "trainer.plot=False",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        "trainer.torch_threads_per_worker=1",
    ]
    if rank > 0:
        overrides += [f"actor_rollout_ref.model.lora_rank={rank}", f"actor_rollout_ref.model.lora_alpha={2 * rank}"]
    run_ppo(load_default_config(overrides))
    curve = []
    with open(run_dir / "log" / "metrics.jsonl") as fh:
        for line in fh:
            rec = json.loads(line)
            if VAL_KEY in rec["data"]:
                curve.append((rec["step"], float(rec["data"][VAL_KEY])))
    return curve


def learning(args) -> dict:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    out_dir = Path(args.out_dir)
    configs = [(0, args.full_lr)] + [(int(r), args.lora_lr) for r in args.ranks.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    curves: dict[str, dict[int, list]] = {}
    for rank, lr in configs:
        name = "full" if rank == 0 else f"lora_r{rank}"
        curves[name] = {}
        for seed in seeds:
            start = time.perf_counter()
            curves[name][seed] = learning_run(rank, lr, seed, args.steps, args.test_freq, out_dir / f"{name}_s{seed}")
            print(f"{name} lr={lr} seed={seed}: {curves[name][seed]} ({time.perf_counter() - start:.0f} s)", flush=True)
    summary = {
        name: {"lr": lr, "last_val_median": statistics.median(c[seed][-1][1] for seed in c)}
        for (rank, lr), (name, c) in zip(configs, curves.items(), strict=False)
    }
    full = summary["full"]["last_val_median"]
    for name, row in summary.items():
        row["gap_to_full_points"] = 100 * (row["last_val_median"] - full)
    print(json.dumps(summary, indent=2))
    _plot(curves, out_dir / "lora_curves.png", f"GRPO on the embedded default, {args.steps} steps, seeds {args.seeds}")
    return {
        "curves": {n: {str(s): c for s, c in cs.items()} for n, cs in curves.items()},
        "summary": summary,
        "steps": args.steps,
        "seeds": seeds,
    }


def _plot(curves, png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, per_seed in curves.items():
        steps = [s for s, _ in next(iter(per_seed.values()))]
        med = [statistics.median(c[i][1] for c in per_seed.values()) for i in range(len(steps))]
        ax.plot(steps, med, marker="o", label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("validation accuracy (greedy, median over seeds)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print(f"wrote {png}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_one":
        print(json.dumps(measure_one(sys.argv[2], int(sys.argv[3]))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    res = sub.add_parser("resources")
    res.add_argument("--models", default="embedded,30m")
    res.add_argument("--ranks", default="1,4,16")
    res.add_argument("--out", default=None)
    lea = sub.add_parser("learning")
    lea.add_argument("--ranks", default="1,4,16")
    lea.add_argument("--seeds", default="1,2,3")
    lea.add_argument("--steps", type=int, default=128)
    lea.add_argument("--test_freq", type=int, default=16)
    lea.add_argument("--full_lr", type=float, default=3e-5)
    lea.add_argument("--lora_lr", type=float, default=1e-3)
    lea.add_argument("--out_dir", default="runs/bench_lora")
    args = parser.parse_args()
    result = resources(args) if args.what == "resources" else learning(args)
    out = getattr(args, "out", None) or (Path(args.out_dir) / "learning.json" if args.what == "learning" else None)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
