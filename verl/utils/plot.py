"""Training curves as a PNG: training score and validation accuracy against the step.

Reads the jsonl written by the `file` logger (`{"step": N, "data": {...}}` per line), so it can
also be run after the fact: `python -m verl.utils.plot runs/verl/default/metrics.jsonl out.png`.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict

TRAIN_KEY = "critic/score/mean"
VAL_PREFIX = "val-core/"


def read_metrics(path: str) -> list[tuple[int, dict]]:
    """(step, metrics) records of a metrics jsonl; when a step appears twice (a resumed run
    re-logging it) the later record wins."""
    by_step: dict[int, dict] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line:
                rec = json.loads(line)
                by_step.setdefault(int(rec["step"]), {}).update(rec["data"])
    return sorted(by_step.items())


def _as_float(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def plot_training_curves(records: list[tuple[int, dict]] | str, out_png: str, title: str = "") -> str | None:
    """Draw `critic/score/mean` and every `val-core/.../mean@n` series; returns the PNG path,
    or None when there is nothing to draw."""
    if isinstance(records, str):
        records = read_metrics(records)
    train = [(s, _as_float(d.get(TRAIN_KEY))) for s, d in records]
    train = [(s, v) for s, v in train if v is not None]
    val: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for s, d in records:
        for k, v in d.items():
            if k.startswith(VAL_PREFIX) and "/mean@" in k:
                f = _as_float(v)
                if f is not None:
                    val[k[len(VAL_PREFIX) :]].append((s, f))
    if not train and not val:
        return None

    import matplotlib

    matplotlib.use("Agg")  # no display; works in any process
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    if train:
        xs, ys = zip(*train, strict=False)
        ax.plot(xs, ys, label=f"train {TRAIN_KEY}", color="tab:blue", alpha=0.8)
    for name, pts in sorted(val.items()):
        xs, ys = zip(*pts, strict=False)
        ax.plot(xs, ys, marker="o", label=f"validation {name}")
    ax.set_xlabel("step")
    ax.set_ylabel("score / accuracy")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m verl.utils.plot METRICS.jsonl OUT.png")
    print(plot_training_curves(sys.argv[1], sys.argv[2]) or "nothing to plot")
