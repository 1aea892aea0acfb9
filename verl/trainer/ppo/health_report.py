"""The end-of-run health report: `health.md` (a table per signal, every warning) and `health.png`
(each signal's value over the run, its threshold, its tripped episodes shaded)."""

from __future__ import annotations

import math
import os

from verl.trainer.config.health import HEALTH_SIGNALS
from verl.trainer.ppo.health import REMEDIES, HealthMonitor, action_of, thresholds


def _episodes_text(monitor: HealthMonitor, name: str) -> str:
    eps = monitor.states[name].episodes
    if not eps:
        return "-"
    return ", ".join(f"{a}-{b}" if b is not None else f"{a}-" for a, b in eps)


def write_markdown(monitor: HealthMonitor, path: str, stop_reason: str | None, png: str | None) -> str:
    """Write `health.md` to `path`; returns the path."""
    thr = thresholds(monitor.cfg)
    n_tripped = sum(bool(monitor.states[n].episodes) for n in HEALTH_SIGNALS)
    lines = [
        "# Training health",
        "",
        f"Steps observed: {monitor.step}. Signals tripped: {n_tripped} of {len(HEALTH_SIGNALS)}. "
        "What each signal means: docs/health.md.",
        "",
    ]
    if stop_reason:
        lines += [f"**The run was stopped:** {stop_reason}", ""]
    lines += ["| signal | tripped (steps) | last value | trips when | action |", "| --- | --- | --- | --- | --- |"]
    for name in HEALTH_SIGNALS:
        hist = monitor.history[name]
        last = f"{hist[-1][1]:.4g} (step {hist[-1][0]})" if hist else "no data"
        t, side = thr[name]
        when = "see docs" if t is None else f"{side} {t:g}"
        lines.append(f"| {name} | {_episodes_text(monitor, name)} | {last} | {when} | {action_of(monitor.cfg, name)} |")
    lines += ["", "## Warnings", ""]
    lines += [f"- {t.message()}" for t in monitor.trips] or ["None."]
    if png:
        lines += ["", f"![health signals over the run]({os.path.basename(png)})"]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def plot_health(monitor: HealthMonitor, path: str, title: str = "") -> str | None:
    """Draw every signal's value per step (threshold dashed, tripped episodes shaded) to `path`;
    None when no signal has a value."""
    if not any(monitor.history.values()):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 4
    rows = math.ceil(len(HEALTH_SIGNALS) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), squeeze=False)
    thr = thresholds(monitor.cfg)
    for ax, name in zip(axes.flat, HEALTH_SIGNALS, strict=False):
        hist = monitor.history[name]
        if hist:
            xs, ys = zip(*hist, strict=False)
            ax.plot(xs, ys, color="tab:blue", marker="." if len(xs) < 30 else None)
        t, _ = thr[name]
        if t is not None:
            ax.axhline(t, color="tab:red", linestyle="--", linewidth=1)
        for start, end in monitor.states[name].episodes:
            ax.axvspan(start, end if end is not None else monitor.step, color="tab:red", alpha=0.15)
            ax.axvline(start, color="tab:red", linewidth=1)
        ax.set_title(name + (" (tripped)" if monitor.states[name].episodes else ""), fontsize="small")
        ax.tick_params(labelsize="x-small")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(HEALTH_SIGNALS) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_report(monitor: HealthMonitor, log_dir: str, plot: bool, stop_reason: str | None = None, title: str = ""):
    """`health.md` (and with `plot`, `health.png`) in `log_dir`; returns (md path, png path or None)."""
    os.makedirs(log_dir, exist_ok=True)
    png = plot_health(monitor, os.path.join(log_dir, "health.png"), title) if plot else None
    md = write_markdown(monitor, os.path.join(log_dir, "health.md"), stop_reason, png)
    return md, png


__all__ = ["REMEDIES", "plot_health", "write_markdown", "write_report"]
