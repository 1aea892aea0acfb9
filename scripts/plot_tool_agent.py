#!/usr/bin/env python
"""Plot the calculator-task learning curves of two runs (tool on, tool disabled) from their
`trainer.log_dir/metrics.jsonl`: greedy validation accuracy and validation tool-call rate against wall-clock minutes.

    python scripts/plot_tool_agent.py RUN_WITH_TOOL/log RUN_NO_TOOL/log docs/images/tool_agent_curve.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ACC = "val-core/verl_toy/calculator/reward/mean@1"
RATE = "val-aux/agent/tool_call_rate"


def series(log_dir: str) -> dict[str, list[tuple[int, float, float]]]:
    """(minutes since the start of training, value) per validation."""
    out = {"acc": [], "rate": []}
    for line in (Path(log_dir) / "metrics.jsonl").read_text().splitlines():
        d = json.loads(line)["data"]
        minutes = float(d.get("perf/elapsed_s", 0.0)) / 60.0
        if ACC in d:
            out["acc"].append((minutes, float(d[ACC])))
        if RATE in d:
            out["rate"].append((minutes, float(d[RATE])))
    return out


def main(argv=None) -> None:
    argv = argv or sys.argv[1:]
    with_tool, no_tool, png = argv
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, path, style in (("tool", with_tool, "-o"), ("tool disabled", no_tool, "--s")):
        s = series(path)
        ax[0].plot(*zip(*s["acc"], strict=False), style, label=name)
        ax[1].plot(*zip(*s["rate"], strict=False), style, label=name)
    ax[0].set(title="greedy validation accuracy", xlabel="minutes", ylim=(-0.02, 1.02))
    ax[1].set(title="validation tool-call rate", xlabel="minutes", ylim=(-0.02, 1.02))
    for a in ax:
        a.grid(alpha=0.3)
        a.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(png)


if __name__ == "__main__":
    main()
