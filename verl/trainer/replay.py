"""Replay one training step from a checkpoint and check that it comes out bit for bit the same.

    python -m verl.trainer.replay checkpoints/verl/default --step 5
    python -m verl.trainer.replay checkpoints/verl/default --step 5 --dump step5.pt

`<checkpoint dir>` is the directory that holds the run's `global_step_*` (its
`trainer.default_local_dir`). Step N is re-run from `global_step_<N-1>` (step 1: from the start,
as the run began) with the config recorded in the checkpoint (`run_record.json`), in a scratch
directory (`--work_dir`, default a temporary one, removed afterwards); the run's own directories
are only read. Then:

- metrics: every metric logged for step N except wall-clock figures (`timing_s/*`, `perf/*`,
  `*timing*`, seconds such as `agent/decode_s`: `is_timing_metric`) must be equal, bit for bit.
  The reference is the metrics saved with `global_step_N` when there is one, else the run's
  `metrics.jsonl` (the recorded `trainer.log_dir`). A metric only the replay has is ignored (the
  replayed step is its run's last, and the last step is always validated).
- weights: when `global_step_N` exists, the replay saves its own step N and every model and
  optimizer file of `actor/` and `critic/` must hold the same tensors, bit for bit (the
  scheduler/RNG files `extra_state_*` and json metadata are not compared: validation at the
  replay's last step draws from the workers' generators after the update). Without it, the
  weights are not compared.

It prints `match`, or the first metric that differs (logged vs replayed value and the difference),
and exits 0 on a match, 1 on a difference. `--dump PATH` writes step N's batch with
`torch.save`: `tensors` (prompts, responses, response_mask, token_level_scores,
token_level_rewards, advantages, returns, old_log_probs, ref_log_prob, rollout_log_probs, values,
whichever the step had, [b, ...] CPU tensors), `prompts_text` / `responses_text` (decoded),
`non_tensors` (uid, data_source, ... as lists) and `step`; it loads with
`torch.load(PATH, weights_only=True)`.

The environment the run recorded (torch / transformers / verl versions, torch threads, device,
CPU or GPU model) is compared with this one first; any difference is printed as a warning, since
the arithmetic may then legitimately differ. See docs/reproducibility.md.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field

import torch

from verl.trainer.ppo.checkpoint import RUN_RECORD_FILE, TRAINER_STATE_FILE, list_checkpoints, read_run_record, step_dir
from verl.utils.checkpoint.integrity import load_plain
from verl.utils.reproducibility import environment, environment_differences

__all__ = ["ReplayResult", "replay", "compare_metrics", "compare_weights", "is_timing_metric", "main"]

logger = logging.getLogger(__name__)

UNCOMPARED_PREFIXES = ("timing_s/", "perf/")
BATCH_KEYS = (
    "prompts",
    "responses",
    "response_mask",
    "attention_mask",
    "token_level_scores",
    "token_level_rewards",
    "advantages",
    "returns",
    "old_log_probs",
    "ref_log_prob",
    "rollout_log_probs",
    "values",
)


@dataclass
class ReplayResult:
    """What `replay` found. `difference`: (metric, logged, replayed) of the first metric that
    differs, None when all match; `weights`: "equal (K files)", "differ: <file>" or
    "not compared: <why>"; `warnings`: environment differences."""

    step: int
    compared: int = 0
    difference: tuple[str, object, object] | None = None
    weights: str = "not compared"
    warnings: list[str] = field(default_factory=list)

    @property
    def match(self) -> bool:
        return self.difference is None and not self.weights.startswith("differ")

    def report(self) -> str:
        lines = [f"warning: environment differs from the run's: {w}" for w in self.warnings]
        if self.difference is not None:
            name, logged, replayed = self.difference
            lines.append(
                f"step {self.step}: {name} differs: logged {logged!r}, replayed {replayed!r}{_gap(logged, replayed)}"
            )
        lines.append(f"step {self.step}: {self.compared} metrics compared; weights {self.weights}")
        lines.append("match" if self.match else "mismatch")
        return "\n".join(lines)


def _gap(a, b) -> str:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isfinite(a) and math.isfinite(b):
        rel = abs(a - b) / max(abs(a), abs(b)) if max(abs(a), abs(b)) > 0 else 0.0
        return f" (difference {b - a:.6g}, relative {rel:.3g})"
    return ""


def is_timing_metric(name: str) -> bool:
    """Wall-clock figures, which no two runs share: `timing_s/*`, `perf/*`, names with `timing`,
    and seconds (a path component ending in `_s`: `agent/decode_s`, `agent/tool_latency_s/mean`)."""
    return name.startswith(UNCOMPARED_PREFIXES) or "timing" in name or any(p.endswith("_s") for p in name.split("/"))


def _compared(name: str) -> bool:
    return not is_timing_metric(name)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare_metrics(logged: dict, replayed: dict) -> tuple[int, tuple[str, object, object] | None]:
    """(metrics compared, first difference) over the logged step's metrics, in sorted name order;
    a metric missing from the replay is a difference (its replayed value None)."""
    names = sorted(n for n in logged if _compared(n))
    for name in names:
        if name not in replayed:
            return len(names), (name, logged[name], None)
        if not _same(logged[name], replayed[name]):
            return len(names), (name, logged[name], replayed[name])
    return len(names), None


def _weight_files(step_path: str) -> list[str]:
    """Model and optimizer files of the worker parts of a step directory, relative paths."""
    out = []
    for part in ("actor", "critic"):
        base = os.path.join(step_path, part)
        for dirpath, _, files in os.walk(base):
            for name in files:
                if name.startswith("extra_state") or name.endswith((".json", ".txt", ".md", ".jinja")):
                    continue
                out.append(os.path.relpath(os.path.join(dirpath, name), step_path))
    return sorted(out)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _load(path: str):
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    return load_plain(path)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (NaN payloads and the sign of zero count), for a bitwise comparison."""
    return t.reshape(-1).contiguous().view(torch.uint8) if t.numel() else t.reshape(-1)


def _equal(a, b) -> bool:
    """Same structure, same tensors (dtype, shape, every bit), same plain values."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (
            torch.is_tensor(a)
            and torch.is_tensor(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(_bits(a), _bits(b))
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return _same(a, b)


def _same_file(a: str, b: str) -> bool:
    """Equal contents: tensors compared bit for bit for `.pt` / `.safetensors` (torch.save's bytes
    also depend on how tensors share storage, which a resumed run may lay out differently), other
    files byte for byte."""
    if a.endswith((".pt", ".safetensors")):
        return _equal(_load(a), _load(b))
    return _sha256(a) == _sha256(b)


def _same_dcp(a: str, b: str) -> bool:
    """Two DCP shard directories hold the same tensors (every key, every bit), whatever world size
    or file layout wrote them."""
    from verl.utils.checkpoint.dcp_shards import iter_full_tensors, tensor_keys

    if sorted(tensor_keys(a)) != sorted(tensor_keys(b)):
        return False
    pairs = zip(iter_full_tensors(a, prefix=""), iter_full_tensors(b, prefix=""), strict=True)
    return all(ka == kb and _equal(ta, tb) for (ka, ta), (kb, tb) in pairs)


def compare_weights(saved_step: str, replayed_step: str) -> str:
    """ "equal (K files)" or "differ: <first differing or missing file>" (see the module docstring);
    a DCP shard directory (`dcp/`) is compared as a whole, tensor by tensor."""
    saved, replayed = _weight_files(saved_step), set(_weight_files(replayed_step))
    dcp_dirs = sorted({os.path.dirname(rel) for rel in saved if os.path.basename(os.path.dirname(rel)) == "dcp"})
    for rel in dcp_dirs:
        if not os.path.isdir(os.path.join(replayed_step, rel)):
            return f"differ: {rel} is missing from the replay"
        if not _same_dcp(os.path.join(saved_step, rel), os.path.join(replayed_step, rel)):
            return f"differ: {rel}"
    for rel in saved:
        if os.path.dirname(rel) in dcp_dirs:
            continue
        if rel not in replayed:
            return f"differ: {rel} is missing from the replay"
        if not _same_file(os.path.join(saved_step, rel), os.path.join(replayed_step, rel)):
            return f"differ: {rel}"
    return f"equal ({len(saved)} files)"


def _record(root: str, step: int) -> dict:
    """The run record of the checkpoint before `step` (or, for step 1, of any checkpoint)."""
    steps = [s for s, _ in list_checkpoints(root)]
    if not steps:
        raise FileNotFoundError(f"no global_step_* checkpoint in {root} (pass the run's trainer.default_local_dir)")
    if step > 1 and step - 1 not in steps:
        raise FileNotFoundError(
            f"replaying step {step} needs {step_dir(root, step - 1)}; the checkpoints here are of steps {steps}"
        )
    source = step_dir(root, step - 1 if step > 1 else steps[0])
    record = read_run_record(source)
    if record is None:
        raise FileNotFoundError(
            f"{source} has no {RUN_RECORD_FILE} (written by an older verl): replay needs the config it records"
        )
    return record


def _logged_metrics(root: str, step: int, config: dict) -> dict:
    """Step `step`'s metrics: saved with `global_step_<step>`, else from the run's metrics.jsonl."""
    path = step_dir(root, step)
    if os.path.exists(os.path.join(path, TRAINER_STATE_FILE)):
        return dict(load_plain(os.path.join(path, TRAINER_STATE_FILE)).get("step_metrics", {}))
    log = os.path.join(config["trainer"]["log_dir"], "metrics.jsonl")
    found = _metrics_of_step(log, step) if os.path.exists(log) else {}
    if not found:
        raise FileNotFoundError(f"no metrics of step {step}: neither {path} nor a record of it in {log}")
    return found


def _metrics_of_step(path: str, step: int) -> dict:
    out: dict = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec.get("step") == step:
                out.update(rec.get("data", {}))
    return out


def _replay_config(record: dict, root: str, step: int, work: str):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(record["config"])
    tr = cfg.trainer
    if step > 1:
        tr.resume_mode, tr.resume_from_path = "resume_path", step_dir(root, step - 1)
    else:
        tr.resume_mode, tr.resume_from_path = "disable", None
    tr.default_local_dir = os.path.join(work, "ckpt")
    tr.log_dir = os.path.join(work, "log")
    tr.logger = ["file"]
    tr.plot = False
    tr.rollout_data_dir = tr.validation_data_dir = None
    tr.max_actor_ckpt_to_keep = tr.max_critic_ckpt_to_keep = None
    return cfg


def _capture_batch(trainer, step: int, out: dict) -> None:
    """Make `trainer` stop after `step` and keep that step's batch (trained, with advantages and
    log-probs) in `out["batch"]` with its decoded text."""
    trainer.stop_after_step = step
    end_of_step = trainer._end_of_step

    @functools.wraps(end_of_step)
    def capture(batch, ctx):
        if ctx.step == step and batch is not None:
            out["batch"] = _batch_dump(trainer, batch, step)
        return end_of_step(batch, ctx)

    trainer._end_of_step = capture


def _batch_dump(trainer, batch, step: int) -> dict:
    tensors = {k: batch.batch[k].detach().cpu().clone() for k in BATCH_KEYS if k in batch.batch.keys()}
    non_tensors = {
        k: [v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for v in vals.tolist()]
        for k, vals in batch.non_tensor_batch.items()
    }
    mask = batch.batch["response_mask"].bool() if "response_mask" in batch.batch.keys() else None
    width = batch.batch["responses"].shape[-1]
    prompt_mask = batch.batch["attention_mask"][:, :-width].bool()
    tok = trainer.tokenizer
    prompts = [
        tok.decode(p[m].tolist(), skip_special_tokens=True)
        for p, m in zip(batch.batch["prompts"], prompt_mask, strict=True)
    ]
    responses = [
        tok.decode(r[m].tolist() if mask is not None else r.tolist(), skip_special_tokens=True)
        for r, m in zip(batch.batch["responses"], mask if mask is not None else batch.batch["responses"], strict=True)
    ]
    return {
        "step": step,
        "tensors": tensors,
        "non_tensors": non_tensors,
        "prompts_text": prompts,
        "responses_text": responses,
    }


def replay(checkpoint_dir: str, step: int, dump: str | None = None, work_dir: str | None = None) -> ReplayResult:
    """Re-run step `step` of the run checkpointed in `checkpoint_dir` and compare (module docstring)."""
    from verl.trainer.main_ppo import TaskRunner, run_ppo

    if step < 1:
        raise ValueError(f"--step must be >= 1, got {step}")
    root = os.path.abspath(checkpoint_dir)
    record = _record(root, step)
    logged = _logged_metrics(root, step, record["config"])
    result = ReplayResult(step=step)
    recorded_env = record.get("environment", {})
    # threads and device come from the recorded config (the replay runs it); the rest is this machine
    current = environment(threads=recorded_env.get("torch_threads"), device=recorded_env.get("device"))
    result.warnings = environment_differences(recorded_env, current)
    for warning in result.warnings:
        logger.warning("environment differs from the run's: %s", warning)
    work = work_dir or tempfile.mkdtemp(prefix=f"verl_replay_step{step}_")
    captured: dict = {}
    try:
        cfg = _replay_config(record, root, step, work)
        run_ppo(
            cfg,
            task_runner_class=functools.partial(TaskRunner, trainer_hook=lambda t: _capture_batch(t, step, captured)),
        )
        replayed = _metrics_of_step(os.path.join(work, "log", "metrics.jsonl"), step)
        result.compared, result.difference = compare_metrics(logged, replayed)
        saved_step = step_dir(root, step)
        if not os.path.isdir(saved_step):
            result.weights = f"not compared: the run has no checkpoint of step {step}"
        elif not os.path.isdir(step_dir(os.path.join(work, "ckpt"), step)):
            result.weights = "not compared: the replay saved no checkpoint (trainer.save_freq <= 0)"
        else:
            result.weights = compare_weights(saved_step, step_dir(os.path.join(work, "ckpt"), step))
        if dump is not None:
            if "batch" not in captured:
                raise RuntimeError(f"step {step} trained no batch (skipped step): nothing to dump")
            torch.save(captured["batch"], dump)
    finally:
        if work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl.trainer.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkpoint_dir", help="the directory holding the run's global_step_* (trainer.default_local_dir)"
    )
    parser.add_argument("--step", type=int, required=True, help="the step to replay (from the checkpoint of step-1)")
    parser.add_argument(
        "--dump", default=None, help="write the step's batch here (torch.save; see the module docstring)"
    )
    parser.add_argument(
        "--work_dir", default=None, help="scratch directory of the replay (kept); default: a temporary one"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    result = replay(args.checkpoint_dir, args.step, dump=args.dump, work_dir=args.work_dir)
    print(result.report())
    if args.dump:
        print(f"step {args.step}'s batch written to {args.dump}")
    return 0 if result.match else 1


if __name__ == "__main__":
    sys.exit(main())
