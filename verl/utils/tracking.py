"""Experiment tracking: one `Tracking.log(metrics, step)` fans out to the configured backends.

Backends (`trainer.logger`):

- `console`: one compact line per step with the metrics that matter most (score, validation,
  losses, KL, lengths, time); meant to be printed under a tqdm progress bar (`tqdm.write`).
- `file`: every metric of every step as one JSON object per line (`{"step": N, "data": {...}}`)
  in `metrics.jsonl` under the run's log directory (or `VERL_FILE_LOGGER_PATH`).
- `tensorboard`: scalars under `<log_dir>/tensorboard` (or `TENSORBOARD_DIR`).
- `wandb`, `mlflow`: when the package is installed (a clear error otherwise).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from typing import Any

OPTIONAL_BACKENDS = {"wandb": "wandb", "mlflow": "mlflow", "tensorboard": "tensorboard"}

# metrics shown on the console line, in this order, with short labels
CONSOLE_KEYS = (
    ("critic/score/mean", "score"),
    ("val-core/", "val"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/kl_loss", "kl_loss"),
    ("actor/entropy", "entropy"),
    ("actor/ppo_kl", "ppo_kl"),
    ("actor/pg_clipfrac", "clipfrac"),
    ("critic/vf_loss", "vf_loss"),
    ("actor/reward_kl_penalty", "kl_pen"),
    ("response_length/mean", "resp_len"),
    ("reward/score_errors", "score_err"),
    ("train/loss", "loss"),  # sft_trainer
    ("val/loss", "val_loss"),
    ("train/grad_norm", "grad_norm"),
    ("train/lr", "lr"),
    ("perf/time_per_step", "s/step"),
)


def check_backends_available(backends: list[str]) -> None:
    """Raise before anything starts if a requested optional backend is not installed."""
    for name in backends:
        module = OPTIONAL_BACKENDS.get(name)
        if module and importlib.util.find_spec(module) is None:
            raise ImportError(
                f"trainer.logger includes {name!r} but the package {module!r} is not installed (pip install {module})"
            )


def to_jsonable(v: Any) -> Any:
    """A JSON-serialisable copy of `v`: tensors/numpy scalars as numbers, sequences and arrays as
    lists, dicts recursively, nan/inf as strings (JSON has none), anything else as its str()."""
    if isinstance(v, dict):
        return {str(k): to_jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)) or (hasattr(v, "tolist") and getattr(v, "ndim", 0) > 0):
        return [to_jsonable(x) for x in (v if isinstance(v, (list, tuple)) else v.tolist())]
    if hasattr(v, "item") and callable(v.item):
        try:
            v = v.item()
        except (ValueError, RuntimeError):
            return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # keep them visible
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return str(v)


def format_console_line(step: int, data: dict[str, Any]) -> str:
    """`step 12 | score 0.41 | val verl_toy/addition 0.50 | ...` with the CONSOLE_KEYS present."""
    parts = [f"step {step}"]
    for key, label in CONSOLE_KEYS:
        if key.endswith("/"):
            for k in sorted(data):
                if k.startswith(key) and "/mean@" in k:
                    name = k[len(key) :]
                    parts.append(f"{label} {name} {_fmt(data[k])}")
        elif key in data:
            parts.append(f"{label} {_fmt(data[key])}")
    if "health/active" in data:  # the health flag: ok, or the signals tripped now (docs/health.md)
        active = sorted(
            k.split("/")[1]
            for k, v in data.items()
            if k.startswith("health/") and k.endswith("/active") and k != "health/active" and v
        )
        parts.append(f"health {','.join(active) if active else 'ok'}")
    return " | ".join(parts)


def _fmt(v: Any) -> str:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return str(v)
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
        return f"{v:.3e}"
    return f"{v:.4g}"


class ConsoleLogger:
    def __init__(self, write=None):
        if write is None:
            from tqdm import tqdm

            write = tqdm.write
        self.write = write

    def log(self, data: dict, step: int) -> None:
        self.write(format_console_line(step, data))

    def finish(self) -> None:
        pass


class FileLogger:
    """Appends `{"step": N, "data": {...}}` lines; a resumed run keeps appending to the same file.

    Each line is flushed when written (a killed process loses no logged step); `sync()` also
    fsyncs it (called before a checkpoint is published, so a power loss cannot lose steps older
    than the checkpoint). A partial last line left by a crash mid-write is cut off on open.
    """

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        _drop_partial_last_line(path)
        self._fh = open(path, "a", encoding="utf-8")

    def log(self, data: dict, step: int) -> None:
        record = {"step": step, "data": {k: to_jsonable(v) for k, v in data.items()}}
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()

    def sync(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def logged_steps(self) -> set[int]:
        """Steps with a record in the file (written by this run or an earlier one)."""
        self.sync()
        steps = set()
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    steps.add(int(json.loads(line)["step"]))
                except (ValueError, KeyError, TypeError):
                    continue
        return steps

    def finish(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def _drop_partial_last_line(path: str) -> None:
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    with open(path, "rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return
        # find the end of the last complete line
        size = fh.tell()
        pos, chunk = size, 4096
        while pos > 0:
            start = max(pos - chunk, 0)
            fh.seek(start)
            block = fh.read(pos - start)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            pos = start
        else:
            keep = 0
        fh.truncate(keep)
    import logging

    logging.getLogger(__name__).warning("%s ended with a partial record (a crash while writing); it was cut off", path)


class TensorboardLogger:
    def __init__(self, log_dir: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=log_dir)

    def log(self, data: dict, step: int) -> None:
        for k, v in data.items():
            try:
                self.writer.add_scalar(k, float(v), step)
            except (TypeError, ValueError):
                continue  # non-scalar entries (strings) stay in the jsonl file
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class _WandbLogger:
    def __init__(self, project: str, experiment: str, config: dict | None):
        import wandb

        self.wandb = wandb
        wandb.init(project=project, name=experiment, config=config)

    def log(self, data: dict, step: int) -> None:
        self.wandb.log(data, step=step)

    def finish(self) -> None:
        self.wandb.finish()


class _MlflowLogger:
    def __init__(self, project: str, experiment: str, config: dict | None):
        import mlflow

        self.mlflow = mlflow
        mlflow.set_experiment(project)
        mlflow.start_run(run_name=experiment)
        if config:
            mlflow.log_params(_flatten(config))

    def log(self, data: dict, step: int) -> None:
        clean = {k.replace("@", "_at_"): float(v) for k, v in data.items() if isinstance(v, (int, float))}
        self.mlflow.log_metrics(clean, step=step)

    def finish(self) -> None:
        self.mlflow.end_run()


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


class Tracking:
    """Upstream-compatible front: `Tracking(project_name, experiment_name, default_backend, config)`.

    `log_dir` is where `file` and `tensorboard` write (default `runs/<project>/<experiment>`).
    """

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        default_backend: str | list[str] = "console",
        config: dict | None = None,
        log_dir: str | None = None,
        console_write=None,
    ):
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        check_backends_available(backends)
        self.log_dir = log_dir or os.path.join("runs", project_name, experiment_name)
        self.loggers: dict[str, Any] = {}
        for name in backends:
            if name == "console":
                self.loggers[name] = ConsoleLogger(console_write)
            elif name == "file":
                path = os.environ.get("VERL_FILE_LOGGER_PATH") or os.path.join(self.log_dir, "metrics.jsonl")
                self.loggers[name] = FileLogger(path)
            elif name == "tensorboard":
                tb_dir = os.environ.get("TENSORBOARD_DIR") or os.path.join(self.log_dir, "tensorboard")
                self.loggers[name] = TensorboardLogger(tb_dir)
            elif name == "wandb":
                self.loggers[name] = _WandbLogger(project_name, experiment_name, config)
            elif name == "mlflow":
                self.loggers[name] = _MlflowLogger(project_name, experiment_name, config)
            else:
                raise ValueError(
                    f"trainer.logger: unknown backend {name!r}; accepted: console, file, tensorboard, wandb, mlflow"
                )

    @property
    def file_path(self) -> str | None:
        fl = self.loggers.get("file")
        return fl.path if fl is not None else None

    def log(self, data: dict, step: int, backend: list[str] | None = None) -> None:
        for name, lg in self.loggers.items():
            if backend is None or name in backend:
                lg.log(data, step)

    def sync(self) -> None:
        """Make every logged line durable (fsync the metrics file)."""
        fl = self.loggers.get("file")
        if fl is not None:
            fl.sync()

    def has_logged_step(self, step: int) -> bool | None:
        """Whether the metrics file has a record of `step`; None without a `file` backend."""
        fl = self.loggers.get("file")
        return None if fl is None else step in fl.logged_steps()

    def finish(self) -> None:
        for lg in self.loggers.values():
            lg.finish()


class ValidationGenerationsLogger:
    """Shows a few validation samples (input, output, score) per validation run.

    Console: printed as lines. File: appended to `val_generations.jsonl` in the log directory.
    Tensorboard: a text summary. (wandb/mlflow receive the same table when active.)
    """

    def __init__(self, log_dir: str | None = None):
        self.log_dir = log_dir

    def log(
        self, loggers: list[str], samples: list[tuple[str, str, float]], step: int, tracking: Tracking | None = None
    ) -> None:
        if not samples:
            return
        if "console" in loggers:
            from tqdm import tqdm

            for inp, out, score in samples:
                tqdm.write(f"[val sample step {step}] input={inp!r} output={out!r} score={score}")
        if "file" in loggers and self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            with open(os.path.join(self.log_dir, "val_generations.jsonl"), "a", encoding="utf-8") as fh:
                for inp, out, score in samples:
                    fh.write(
                        json.dumps({"step": step, "input": inp, "output": out, "score": to_jsonable(score)}) + "\n"
                    )
        if tracking is not None and "tensorboard" in tracking.loggers:
            text = "\n\n".join(f"**input** {i}  \n**output** {o}  \n**score** {s}" for i, o, s in samples)
            tracking.loggers["tensorboard"].writer.add_text("val/generations", text, step)
        if tracking is not None and "wandb" in tracking.loggers:
            wandb = tracking.loggers["wandb"].wandb
            table = wandb.Table(columns=["input", "output", "score"], data=[list(s) for s in samples])
            wandb.log({"val/generations": table}, step=step)
