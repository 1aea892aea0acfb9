"""The health monitor on the training loop: a `TrainerCallback` that `RayPPOTrainer` adds when
`trainer.health.enable` (docs/health.md).

- `on_batch_scored` (the first generation round of a step: what the policy does, before dynamic
  sampling drops groups): the batch statistics of `health.batch_stats`;
- `on_validation`: the validation accuracy;
- `on_step_end`: `HealthMonitor.observe`, the `health/*` metrics, one warning per tripped signal,
  and the signal's action (`stop` / `save_and_stop` end the run after this step);
- `on_fit_end`: `health.md` / `health.png` in `trainer.log_dir`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from verl.trainer.config.health import HealthConfig
from verl.trainer.ppo.callbacks import TrainerCallback
from verl.trainer.ppo.health import HealthMonitor, Trip, batch_stats
from verl.trainer.ppo.health_report import write_report

logger = logging.getLogger(__name__)


def char_table(tokenizer) -> torch.Tensor | None:
    """[V] int64: the code point of each token that decodes to one character repeated (e.g. "!!"),
    else -1; None without a tokenizer."""
    if tokenizer is None:
        return None
    size = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(size)])
    return torch.tensor([ord(t[0]) if t and len(set(t)) == 1 else -1 for t in texts], dtype=torch.long)


class HealthCallback(TrainerCallback):
    """See the module docstring. `stop_requested()` tells the loop to make this step the last."""

    def __init__(self, cfg: HealthConfig, tokenizer=None):
        self.cfg = cfg
        self.monitor = HealthMonitor(cfg)
        self.tokenizer = tokenizer
        self._chars: torch.Tensor | None = None
        self._special: torch.Tensor | None = None
        self._batch: dict[str, float] = {}
        self._cost_s = 0.0
        self._best_score = 0.0
        self.stop_reason: str | None = None

    def on_fit_start(self, trainer) -> None:
        self._chars = char_table(self.tokenizer)
        ids = getattr(self.tokenizer, "all_special_ids", None) or []
        self._special = torch.tensor(sorted(set(ids)), dtype=torch.long) if ids else None

    def on_batch_scored(self, trainer, batch, metrics: dict) -> None:
        if self._batch:  # later dynamic-sampling rounds of the same step
            return
        t0 = time.perf_counter()
        data = batch.batch
        self._batch = batch_stats(
            data["responses"],
            data["response_mask"],
            data["token_level_scores"].sum(-1),
            batch.non_tensor_batch["uid"],
            self.cfg,
            best_score=self._best_score,
            log_probs=data["rollout_log_probs"] if "rollout_log_probs" in data.keys() else None,
            char_of_token=self._chars,
            special_ids=self._special,
        )
        self._best_score = self._batch["health/best_score"]
        self._cost_s += time.perf_counter() - t0

    def on_validation(self, trainer, metrics: dict) -> None:
        self.monitor.observe_validation(trainer.global_steps, metrics)

    def on_step_end(self, trainer, metrics: dict) -> None:
        t0 = time.perf_counter()
        metrics.update(self._batch)
        self._batch = {}
        values, trips = self.monitor.observe(trainer.global_steps, metrics)
        metrics.update(values)
        for trip in trips:
            self._act(trainer, trip, metrics)
        metrics["timing_s/health"] = self._cost_s + time.perf_counter() - t0
        self._cost_s = 0.0

    def _act(self, trainer, trip: Trip, metrics: dict) -> None:
        logger.warning("%s [trainer.health action: %s]", trip.message(), trip.action)
        if trip.action == "warn" or self.stop_reason is not None:
            return
        self.stop_reason = f"{trip.signal} tripped at step {trip.step} (action {trip.action}): {trip.evidence}"
        if trip.action == "save_and_stop" and trainer.checkpointer.saved_step != trainer.global_steps:
            path = trainer._save_checkpoint(metrics)
            self.stop_reason += f"; checkpoint saved to {path}"
        logger.warning("health: ending the run after step %d: %s", trip.step, self.stop_reason)

    def stop_requested(self) -> bool:
        return self.stop_reason is not None

    def on_fit_end(self, trainer) -> None:
        tr = trainer.cfg.trainer
        md, png = write_report(
            self.monitor, tr.log_dir, tr.plot, self.stop_reason, title=f"{tr.project_name}/{tr.experiment_name}"
        )
        active = self.monitor.active()
        logger.info("health report: %s%s", md, f" (active at the end: {', '.join(active)})" if active else "")

    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor.state_dict(), "best_score": self._best_score}

    def load_state_dict(self, state: dict) -> None:
        self.monitor.load_state_dict(state.get("monitor", {}))
        self._best_score = float(state.get("best_score", 0.0))
