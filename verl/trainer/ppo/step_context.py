"""`StepContext`: what one training step's phases share (the step, whether it is the last one,
the metrics and phase timings collected so far)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from codetiming import Timer


def is_due(freq: int | None, step: int, is_last: bool) -> bool:
    """A cadence (`trainer.test_freq`, `trainer.save_freq`): every `freq` steps and at the last
    step; never when `freq` is None or <= 0."""
    return freq is not None and freq > 0 and (is_last or step % freq == 0)


@contextmanager
def phase_timer(name: str, timing: dict[str, float]) -> Iterator[None]:
    """Time a phase into `timing[name]` (seconds); repeated phases within a step (several
    generation rounds) add up."""
    with Timer(name=name, logger=None) as t:
        yield
    timing[name] = timing.get(name, 0.0) + t.last


@dataclass
class StepContext:
    """Passed to every phase of `RayPPOTrainer.fit`'s step.

    `step`: the global step being trained (1-based); `is_last`: the run ends after it (it is
    validated and saved); `metrics`: the step's metrics, phases add to them; `timing`: seconds per
    phase, logged as `timing_s/<phase>`.
    """

    step: int
    is_last: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)

    def timer(self, name: str):
        """`with ctx.timer("gen"): ...` adds the block's seconds to `timing["gen"]`."""
        return phase_timer(name, self.timing)
