#!/usr/bin/env python
"""Seconds per GRPO step of the trainer (and of TRL's GRPOTrainer on the same work, if installed).

Each run is a fresh process: `python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo` with
the shape's overrides (validation and checkpoints off), or this script's own TRL child. Runs of
all variants are interleaved round by round (A B C A B C ...) and medians are taken, because the
machine is shared and noisy.

Shapes (work identical for every variant):
- `default`: the default job, 32 prompts x 8 samples, <= 8 response tokens (embedded 1M model);
- `long`: 16 prompts x 8 samples, exactly 64 response tokens (EOS ignored / `min_new_tokens`);
- `30m`: the default shape on a ~30M-parameter Llama of the embedded architecture (hidden 512,
  8 layers), random weights, built locally with `scripts/build_embedded_default.py`'s builder into
  `--work_dir` (kept between runs).

Measured per run:
- steady-state seconds per step: median over the steps after `--warmup`, of the wall time between
  two consecutive steps' ends (ours: the trainer's `perf/elapsed_s` of each step, falling back to
  the arrival of each line of metrics.jsonl, seen every 0.1 s; TRL: a callback at each
  `on_step_end`), and for ours the phase split from `timing_s/*` (gen, reward,
  old_log_prob, ref, values, adv, update_actor, update_critic; `driver` is the step minus the
  worker calls gen/old_log_prob/ref/values/update_*, i.e. reward, advantage and all serial driver
  work);
- start-up: launch to the start of the first step (imports, Ray if used, workers, model load); the first
  step's warm-up (its time minus the steady step) separately; shutdown: last step to process exit;
- peak resident memory (RSS, sampled every 0.1 s) of every process of the run's process tree
  (the driver, and with Ray workers Ray's daemons and the worker processes), and their sum.
  The default job runs its worker inside the driver (`trainer.worker_backend=auto` -> local);
  `--variant ray:trainer.worker_backend=ray` measures the same job on Ray workers.

Usage:
    python scripts/bench_step.py                                  # all shapes, ours (+ TRL if installed)
    python scripts/bench_step.py --shapes default --steps 6 --rounds 1 --no_trl   # quick
    python scripts/bench_step.py --shapes default --rounds 1 --no_trl --startup   # + start-up phases
    git archive <old commit> | tar -x -C /tmp/before && python scripts/bench_step.py \\
        --variant before@/tmp/before: --variant after:                         # before/after a change
    python scripts/bench_step.py --shapes default --variant off:actor_rollout_ref.actor.use_prefix_grouper=False \\
        --variant on:actor_rollout_ref.actor.use_prefix_grouper=True --no_trl       # A/B of a switch

TRL is never a dependency of verl: without it (or with `--no_trl`) only our variants run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = REPO_ROOT / "verl" / "assets" / "embedded_default"

SHAPES = {
    # name: prompts per step, samples per prompt, max response tokens, force full length, model
    "default": {"prompts": 32, "n": 8, "response_length": 8, "full_length": False, "model": "embedded"},
    "long": {"prompts": 16, "n": 8, "response_length": 64, "full_length": True, "model": "embedded"},
    "30m": {"prompts": 32, "n": 8, "response_length": 8, "full_length": False, "model": "30m"},
}
MODEL_30M = {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 2, "intermediate_size": 2048}
WORKER_PHASES = ("gen", "old_log_prob", "ref", "values", "update_critic", "update_actor")
PHASES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")


# ------------------------------------------------------------------------------------------------
# models
# ------------------------------------------------------------------------------------------------
def model_path(kind: str, work_dir: Path) -> str:
    """Directory of the shape's model; the 30M one is built (once) from the embedded tokenizer."""
    if kind == "embedded":
        return str(EMBEDDED / "model")
    out = work_dir / "model_30m"
    if (out / "config.json").exists():
        return str(out)
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import build_embedded_default as bed
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(EMBEDDED / "model"))
    model = bed.build_model(tok, max_position_embeddings=256, seed=0, **MODEL_30M)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    n = sum(p.numel() for p in model.parameters())
    print(f"built {out}: {n / 1e6:.1f}M parameters", flush=True)
    return str(out)


# ------------------------------------------------------------------------------------------------
# process-tree monitor
# ------------------------------------------------------------------------------------------------
class TreeMonitor(threading.Thread):
    """Samples RSS of a process and all its descendants; watches a file for new lines."""

    def __init__(self, pid: int, lines_file: Path | None, interval: float = 0.1):
        super().__init__(daemon=True)
        import psutil

        self.psutil = psutil
        self.root = psutil.Process(pid)
        self.lines_file = lines_file
        self.interval = interval
        self.peak: dict[int, tuple[int, str]] = {}
        self.cmdlines: dict[int, str] = {}
        self.line_times: list[float] = []
        self.stop = threading.Event()

    def _proc_name(self, p) -> str:
        try:
            cmd = p.cmdline()
        except Exception:
            cmd = []
        text = " ".join(cmd)
        exe = os.path.basename(cmd[0]) if cmd else ""
        if exe in ("raylet", "gcs_server"):  # the raylet's arguments name default_worker.py
            return exe
        if "verl.trainer.main_ppo" in text:  # our driver (and, with local workers, the worker too)
            return "driver"
        for key in (
            "WorkerDict",
            "IDLE",
            "default_worker",
            "bench_step",
            "gcs_server",
            "dashboard",
            "log_monitor",
            "runtime_env",
            "raylet",
        ):
            if key in text:
                return key
        return os.path.basename(cmd[0]) if cmd else p.name()

    def sample(self):
        try:
            procs = [self.root] + self.root.children(recursive=True)
        except self.psutil.Error:
            return
        for p in procs:
            try:
                rss = p.memory_info().rss
            except self.psutil.Error:
                continue
            old = self.peak.get(p.pid)
            # a process may exec or retitle itself (Ray workers become ray::WorkerDict): keep
            # looking until the name says what it is
            name = old[1] if old is not None and old[1] not in ("python", "python3") else self._proc_name(p)
            try:
                text = " ".join(p.cmdline())
            except self.psutil.Error:
                text = ""
            if old is not None and text and text != self.cmdlines.get(p.pid, text):
                # it exec'd (or retitled): a child sampled between fork and exec showed its
                # parent's pages (the driver's ~250 MB), which the new program never had
                old, name = None, self._proc_name(p)
            self.cmdlines[p.pid] = text or self.cmdlines.get(p.pid, "")
            self.peak[p.pid] = (max(rss, old[0]) if old is not None else rss, name)

    def count_lines(self):
        if self.lines_file is None or not self.lines_file.exists():
            return
        with open(self.lines_file) as fh:
            n = sum(1 for line in fh if line.strip())
        now = time.time()
        while len(self.line_times) < n:
            self.line_times.append(now)

    def run(self):
        while not self.stop.is_set():
            self.sample()
            self.count_lines()
            time.sleep(self.interval)
        self.count_lines()


# ------------------------------------------------------------------------------------------------
# our trainer
# ------------------------------------------------------------------------------------------------
def _hydra_value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    return str(value)


def preset_overrides(skip: set[str]) -> list[str]:
    """The embedded toy job's preset (`upstream_keys.EMBEDDED_PRESET`) as overrides, minus `skip`."""
    sys.path.insert(0, str(REPO_ROOT))
    from verl.trainer.config.upstream_keys import EMBEDDED_PRESET

    return [f"{k}={_hydra_value(v)}" for k, v in EMBEDDED_PRESET.items() if k not in skip and k != "trainer.logger"]


def ours_overrides(shape: dict, model: str, steps: int, run_dir: Path, threads: int | None) -> list[str]:
    out = [
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.model.path={model}",
        f"data.train_batch_size={shape['prompts']}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={shape['prompts']}",
        f"actor_rollout_ref.rollout.n={shape['n']}",
        f"data.max_response_length={shape['response_length']}",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.save_freq=-1",
        "trainer.logger=[file]",
        f"trainer.log_dir={run_dir}/log",
        f"trainer.default_local_dir={run_dir}/ckpt",
    ]
    if shape["full_length"]:
        out.append("actor_rollout_ref.rollout.ignore_eos=True")
    if shape["model"] != "embedded":
        # the toy preset applies only to the models shipped in verl/assets: the same settings,
        # spelled out, for a model built elsewhere (the 30m one)
        out += preset_overrides({o.split("=", 1)[0] for o in out})
    if threads:
        out.append(f"trainer.torch_threads_per_worker={threads}")
    return out


def run_ours(shape, model, steps, run_dir: Path, threads, extra: list[str], repo: str | None = None) -> dict:
    metrics_file = run_dir / "log" / "metrics.jsonl"
    if repo and model.startswith(str(EMBEDDED)):
        # the other checkout's own copy: the embedded preset applies to the models it ships
        model = str(Path(repo) / EMBEDDED.relative_to(REPO_ROOT)) + model[len(str(EMBEDDED)) :]
    cmd = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        *ours_overrides(shape, model, steps, run_dir, threads),
        *extra,
    ]
    env = dict(os.environ, PYTHONPATH=str(repo or REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    log = open(run_dir / "stdout.log", "w")
    proc = subprocess.Popen(cmd, cwd=str(run_dir), env=env, stdout=log, stderr=subprocess.STDOUT)
    mon = TreeMonitor(proc.pid, metrics_file)
    mon.start()
    rc = proc.wait()
    t_exit = time.time()
    mon.stop.set()
    mon.join()
    log.close()
    if rc != 0:
        tail = (run_dir / "stdout.log").read_text()[-3000:]
        raise RuntimeError(f"our trainer exited with {rc}; see {run_dir}/stdout.log:\n{tail}")
    records = {}
    for line in metrics_file.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            records.setdefault(rec["step"], {}).update(rec["data"])
    steps_sorted = sorted(records)
    timings = [records[s] for s in steps_sorted]
    return {"t0": t0, "t_exit": t_exit, "line_times": mon.line_times, "timings": timings, "peak": mon.peak}


# ------------------------------------------------------------------------------------------------
# TRL
# ------------------------------------------------------------------------------------------------
def trl_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("trl") is not None


def trl_dataset(tok):
    """The embedded training prompts as a `datasets.Dataset` of prompt text, ground truth and data source."""
    import datasets
    import pandas as pd

    df = pd.read_parquet(EMBEDDED / "data" / "train.parquet")
    # the same prompt text our dataset builds (chat template + generation prompt), as plain text
    prompts = [tok.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True) for p in df["prompt"]]
    return datasets.Dataset.from_dict(
        {
            "prompt": prompts,
            "ground_truth": [r["ground_truth"] for r in df["reward_model"]],
            "data_source": list(df["data_source"]),
        }
    )


def grpo_config(args, shape: dict):
    """TRL's GRPOConfig doing the shape's work with our default job's settings; settings this TRL
    version does not have are printed and left at TRL's defaults."""
    import dataclasses

    from trl import GRPOConfig

    n_rows = shape["prompts"] * shape["n"]
    wanted = {
        "output_dir": args.run_dir,
        "per_device_train_batch_size": n_rows,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 1,
        "num_generations": shape["n"],
        "num_iterations": 1,
        "max_completion_length": shape["response_length"],
        "temperature": 1.0,
        "top_p": 1.0,
        "learning_rate": 3e-5,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.01,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_epsilon": 1e-8,
        "max_grad_norm": 1.0,
        "beta": 0.0,
        "epsilon": 0.2,
        "loss_type": "dapo",  # token-mean over the batch, as actor.loss_agg_mode=token-mean
        "scale_rewards": "group",
        "max_steps": args.steps,
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "seed": 1,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
        "log_completions": False,
        "shuffle_dataset": False,
        "generation_kwargs": {"min_new_tokens": shape["response_length"]} if shape["full_length"] else None,
    }
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    dropped = sorted(k for k in wanted if k not in fields)
    if dropped:
        print(f"bench_step: GRPOConfig has no {dropped}; left at TRL's defaults", flush=True)
    return GRPOConfig(**{k: v for k, v in wanted.items() if k in fields and v is not None})


def trl_child(args) -> None:
    """Runs inside a fresh process: TRL's GRPOTrainer on the shape's work."""
    import torch

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    sys.path.insert(0, str(REPO_ROOT))
    from verl.utils.reward_score import default_compute_score

    shape = SHAPES[args.shape]
    tok = AutoTokenizer.from_pretrained(args.model)
    tok.padding_side = "left"
    ds = trl_dataset(tok)

    def reward(prompts, completions, ground_truth, data_source, **kw):
        return [
            float(default_compute_score(d, c, g))
            for c, g, d in zip(completions, ground_truth, data_source, strict=False)
        ]

    config = grpo_config(args, shape)
    stamps = []

    begins = []

    class Stamp(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            begins.append(time.time())

        def on_step_end(self, a, state, control, **kw):
            stamps.append(time.time())

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=config, train_dataset=ds, processing_class=tok, callbacks=[Stamp()]
    )
    trainer.train()
    Path(args.stamps).write_text(json.dumps({"ends": stamps, "first_begin": begins[0] if begins else None}))


def _child_command(mode: str, shape_name: str, model, steps, run_dir: Path, stamps: Path, threads) -> list[str]:
    """This script re-run as a child process in `mode` (`--_trl_child` / `--_startup_child`)."""
    cmd = [sys.executable, __file__, mode, "--shape", shape_name, "--model", str(model), "--steps", str(steps)]
    cmd += ["--run_dir", str(run_dir), "--stamps", str(stamps)]
    if threads:
        cmd += ["--threads", str(threads)]
    return cmd


def run_trl(shape_name, model, steps, run_dir: Path, threads) -> dict:
    stamps = run_dir / "stamps.json"
    cmd = _child_command("--_trl_child", shape_name, model, steps, run_dir, stamps, threads)
    t0 = time.time()
    log = open(run_dir / "stdout.log", "w")
    proc = subprocess.Popen(cmd, cwd=str(run_dir), stdout=log, stderr=subprocess.STDOUT)
    mon = TreeMonitor(proc.pid, None)
    mon.start()
    rc = proc.wait()
    t_exit = time.time()
    mon.stop.set()
    mon.join()
    log.close()
    if rc != 0:
        tail = (run_dir / "stdout.log").read_text()[-3000:]
        raise RuntimeError(f"TRL child exited with {rc}; see {run_dir}/stdout.log:\n{tail}")
    st = json.loads(stamps.read_text())
    first_step = st["ends"][0] - st["first_begin"] if st["ends"] and st["first_begin"] else None
    return {
        "t0": t0,
        "t_exit": t_exit,
        "line_times": st["ends"],
        "timings": None,
        "peak": mon.peak,
        "first_step_s": first_step,
    }


# ------------------------------------------------------------------------------------------------
# start-up breakdown
# ------------------------------------------------------------------------------------------------
def startup_child(args) -> None:
    """Runs inside a fresh process: the default job (`--steps` steps) with timers around the
    start-up phases; writes them as JSON to `--stamps`."""
    import psutil

    t_proc = psutil.Process().create_time()  # includes the interpreter's own start
    marks: dict[str, float] = {"python_start": time.time() - t_proc}
    t = time.time()
    sys.path.insert(0, str(REPO_ROOT))
    import verl.trainer.main_ppo as main_ppo
    from verl.trainer.ppo import ray_trainer, worker_groups
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    marks["imports"] = time.time() - t
    me = psutil.Process()
    rss_mb: dict[str, float] = {"imports": me.memory_info().rss / 2**20}  # the driver's RSS after each phase

    def timed(obj, name, key, once=False):
        orig = getattr(obj, name)

        def wrapper(*a, **kw):
            t0 = time.time()
            try:
                return orig(*a, **kw)
            finally:
                if not (once and key in marks):
                    marks[key] = marks.get(key, 0.0) + time.time() - t0
                    rss_mb.setdefault(key, me.memory_info().rss / 2**20)

        setattr(obj, name, wrapper)

    # the trainer's own steps, whatever the worker backend (a local job starts no Ray: 0 s there)
    timed(main_ppo, "_init_ray", "ray_init")
    timed(ray_trainer, "spawn_worker_groups", "worker_processes")
    timed(RayPPOTrainer, "init_workers", "init_workers")
    timed(RayPPOTrainer, "train_step", "first_train_step", once=True)
    timed(RayPPOTrainer, "collect_batch", "first_collect", once=True)
    timed(main_ppo, "_shutdown_ray", "ray_shutdown")
    resolve = worker_groups.resolve_worker_backend
    backend: list[str] = []
    worker_groups.resolve_worker_backend = lambda v: backend.append(resolve(v)) or backend[-1]
    shape = SHAPES[args.shape]
    run_dir = Path(args.run_dir)
    cfg = main_ppo.load_default_config(ours_overrides(shape, args.model, args.steps, run_dir, args.threads))
    t = time.time()
    main_ppo.run_ppo(cfg)
    marks["run_ppo"] = time.time() - t
    marks["model_load_and_init"] = marks.get("init_workers", 0.0) - marks.get("worker_processes", 0.0)
    import threading as _th

    alive = [t.name for t in _th.enumerate() if t is not _th.main_thread() and not t.daemon]
    if alive:  # the interpreter waits for these at exit
        print(f"bench_step: non-daemon threads alive after run_ppo: {alive}", flush=True)
    import resource

    rss_mb["peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    marks["driver_rss_mb"] = {k: round(v) for k, v in rss_mb.items()}
    marks["worker_backend"] = backend[-1] if backend else "?"
    marks["python_exit_at"] = time.time()
    Path(args.stamps).write_text(json.dumps(marks))
    exit_now = getattr(main_ppo, "exit_now", None)  # the exit of `python -m verl.trainer.main_ppo`
    if exit_now is not None and os.environ.get("BENCH_NORMAL_EXIT") != "1":
        exit_now(0)


def run_startup(model, steps, run_dir: Path, threads) -> dict:
    stamps = run_dir / "startup.json"
    cmd = _child_command("--_startup_child", "default", model, steps, run_dir, stamps, threads)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    with open(run_dir / "stdout.log", "w") as log:
        rc = subprocess.call(cmd, cwd=str(run_dir), env=env, stdout=log, stderr=subprocess.STDOUT)
    t_exit = time.time()
    if rc != 0:
        raise RuntimeError(f"start-up child exited with {rc}; see {run_dir}/stdout.log")
    marks = json.loads(stamps.read_text())
    marks["interpreter_exit"] = t_exit - marks.pop("python_exit_at")
    marks["total"] = t_exit - t0
    return marks


# ------------------------------------------------------------------------------------------------
# summary
# ------------------------------------------------------------------------------------------------
def summarize(res: dict, warmup: int) -> dict:
    times = res["line_times"]
    walls = [b - a for a, b in zip(times, times[1:], strict=False)]  # wall of step 2..N
    elapsed = [t.get("perf/elapsed_s") for t in res.get("timings") or []]
    if len(elapsed) == len(times) and None not in elapsed:
        # ours: the trainer's own clock at the end of each step (the file monitor sees a new line
        # only every 0.1 s, too coarse for 0.1-0.2 s steps)
        walls = [b - a for a, b in zip(elapsed, elapsed[1:], strict=False)]
    steady = walls[max(0, warmup - 1) :] or walls
    step_s = statistics.median(steady) if steady else float("nan")
    first_end = times[0] if times else res["t_exit"]
    # the first step's own duration: ours from its timing_s/step, TRL's from on_step_begin
    first_step = res.get("first_step_s")
    if first_step is None and res["timings"]:
        first_step = res["timings"][0].get("timing_s/step")
    if first_step is None:
        first_step = step_s
    out = {
        "step_s": step_s,
        "startup_s": first_end - res["t0"] - first_step,  # launch to the start of the first step
        "first_step_extra_s": first_step - step_s,  # warm-up of the first step
        "shutdown_s": res["t_exit"] - (times[-1] if times else res["t_exit"]),
        "total_s": res["t_exit"] - res["t0"],
        "peak_mb": {f"{name}:{pid}": rss / 2**20 for pid, (rss, name) in res["peak"].items()},
    }
    out["peak_sum_mb"] = sum(out["peak_mb"].values())
    if res["timings"]:
        tail = res["timings"][warmup:] or res["timings"]
        phases = {}
        for ph in PHASES + ("step",):
            vals = [t.get(f"timing_s/{ph}", 0.0) for t in tail]
            phases[ph] = statistics.median(vals)
        drv = [t.get("timing_s/step", 0.0) - sum(t.get(f"timing_s/{p}", 0.0) for p in WORKER_PHASES) for t in tail]
        phases["driver"] = statistics.median(drv)
        out["phases"] = phases
    return out


def load_str() -> str:
    try:
        one, five, fifteen = os.getloadavg()
        return f"load {one:.2f} {five:.2f} {fifteen:.2f}"
    except OSError:
        return "load ?"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="default,long,30m", help=f"comma list of {sorted(SHAPES)}")
    p.add_argument("--steps", type=int, default=10, help="training steps per run")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the steady state")
    p.add_argument("--rounds", type=int, default=2, help="interleaved runs per variant")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (ours: trainer.torch_threads_per_worker; TRL: the process)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME[@DIR]:KEY=VAL,KEY=VAL",
        help="one of our variants with extra overrides, optionally from another verl checkout DIR "
        "(repeatable); default: one variant 'verl' (this checkout, no overrides)",
    )
    p.add_argument("--no_trl", action="store_true", help="skip TRL even if installed")
    p.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "verl_bench_step"))
    p.add_argument("--json", default=None, help="write all results here")
    # internal: the TRL child
    p.add_argument("--startup", action="store_true", help="also break the default job's start-up down into phases")
    p.add_argument("--_trl_child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--_startup_child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--run_dir", help=argparse.SUPPRESS)
    p.add_argument("--stamps", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def parse_variants(specs: list[str]) -> tuple[list[tuple[str, list[str]]], dict[str, str | None]]:
    """`--variant NAME[@DIR]:KEY=VAL,...` values as ([(name, overrides)], {name: checkout dir or None});
    no value: the one variant 'verl' (this checkout, no overrides)."""
    variants: list[tuple[str, list[str]]] = []
    repos: dict[str, str | None] = {}
    for v in specs:
        name, _, ov = v.partition(":")
        name, _, repo = name.partition("@")  # NAME@DIR: another checkout of verl (e.g. the code before a change)
        repos[name] = repo or None
        variants.append((name, [o for o in ov.split(",") if o]))
    if not variants:
        variants = [("verl", [])]
    return variants, repos


def run_shape_rounds(args, shape_name: str, names: list[str], variants, repos, work: Path) -> dict[str, list[dict]]:
    """`--rounds` interleaved runs of every variant (and TRL when in `names`) on one shape; prints a
    line per run and returns each variant's summaries."""
    shape = SHAPES[shape_name]
    model = model_path(shape["model"], work)
    results: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names:
            run_dir = Path(tempfile.mkdtemp(prefix=f"{shape_name}_{name}_", dir=work))
            load = load_str()
            if name == "trl":
                raw = run_trl(shape_name, model, args.steps, run_dir, args.threads)
            else:
                extra = dict(variants)[name]
                raw = run_ours(shape, model, args.steps, run_dir, args.threads, extra, repos.get(name))
            s = summarize(raw, args.warmup)
            s["load"] = load
            results[name].append(s)
            print(
                f"[{shape_name}] round {r} {name}: {s['step_s']:.3f} s/step, start-up {s['startup_s']:.1f} s, "
                f"shutdown {s['shutdown_s']:.1f} s, peak sum {s['peak_sum_mb']:.0f} MB ({load})",
                flush=True,
            )
    return results


def print_shape_table(args, shape_name: str, names: list[str], variants, results: dict, use_trl: bool) -> None:
    """The medians table of one shape: step time, start-up, shutdown and memory per variant, our phase
    times, the last run's peak RSS per process, and each variant's step-time ratio to TRL."""
    shape = SHAPES[shape_name]
    print(
        f"\n== {shape_name}: {shape['prompts']} prompts x {shape['n']}, <= {shape['response_length']} tokens"
        f"{' (full length)' if shape['full_length'] else ''}, model {shape['model']}; "
        f"medians of {args.rounds} run(s), "
        f"steps {args.warmup + 1}..{args.steps}"
    )
    med = {}
    for name in names:
        rs = results[name]
        m = {
            k: statistics.median(x[k] for x in rs)
            for k in ("step_s", "startup_s", "first_step_extra_s", "shutdown_s", "total_s", "peak_sum_mb")
        }
        med[name] = m
        line = (
            f"  {name:>10}: {m['step_s']:.3f} s/step | start-up {m['startup_s']:.1f} s"
            f" + first-step warm-up {m['first_step_extra_s']:.1f} s | shutdown {m['shutdown_s']:.1f} s"
            f" | peak memory sum {m['peak_sum_mb']:.0f} MB"
        )
        print(line)
        if rs[0].get("phases"):
            ph = {k: statistics.median(x["phases"][k] for x in rs) for k in rs[0]["phases"]}
            print(
                "              phases (s): "
                + ", ".join(f"{k} {v:.3f}" for k, v in ph.items() if v > 0 or k == "driver")
            )
        procs = rs[-1]["peak_mb"]
        top = sorted(procs.items(), key=lambda kv: -kv[1])
        print("              peak RSS (MB, last run): " + ", ".join(f"{k} {v:.0f}" for k, v in top))
    if use_trl:
        for name, _ in variants:
            print(f"  ratio {name}/trl step time: {med[name]['step_s'] / med['trl']['step_s']:.2f}")


def run_startup_rounds(args, work: Path) -> list[dict]:
    """`--startup`: `--rounds` runs of the default job (2 steps) timed by start-up phase; prints each
    run and the medians."""
    runs = []
    for r in range(args.rounds):
        run_dir = Path(tempfile.mkdtemp(prefix="startup_", dir=work))
        load = load_str()
        runs.append(run_startup(model_path("embedded", work), 2, run_dir, args.threads))
        rss = runs[-1].pop("driver_rss_mb", {})
        backend = runs[-1].pop("worker_backend", "?")
        print(
            f"[startup] round {r} ({backend} workers): "
            + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items())
            + f" ({load})",
            flush=True,
        )
        print("          driver RSS (MB) after: " + ", ".join(f"{k} {v}" for k, v in rss.items()), flush=True)
    med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
    print(
        "\n== start-up of the default job (2 steps), seconds, medians: "
        + ", ".join(f"{k} {v:.2f}" for k, v in med.items())
    )
    return runs


def main(argv=None):
    args = parse_args(argv)
    if args._trl_child:
        return trl_child(args)
    if args._startup_child:
        return startup_child(args)

    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    for s in shapes:
        if s not in SHAPES:
            raise SystemExit(f"--shapes: unknown shape {s!r}; known: {sorted(SHAPES)}")
    variants, repos = parse_variants(args.variant)
    use_trl = not args.no_trl and trl_available()
    if not args.no_trl and not use_trl:
        print("TRL is not installed: running our variants only", flush=True)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    all_results: dict = {}
    for shape_name in shapes:
        names = [n for n, _ in variants] + (["trl"] if use_trl else [])
        results = run_shape_rounds(args, shape_name, names, variants, repos, work)
        all_results[shape_name] = results
        print_shape_table(args, shape_name, names, variants, results, use_trl)
    if args.startup:
        all_results["startup"] = run_startup_rounds(args, work)
    if args.json:
        Path(args.json).write_text(json.dumps(all_results, indent=1, default=str))
    return all_results


if __name__ == "__main__":
    main()
