"""`TrainerCallback`: hooks on the training loop of `RayPPOTrainer` (`trainer.callbacks`, or the
trainer's `callbacks` argument). Its own module so that config validation (which checks that each
`trainer.callbacks` entry subclasses it) does not import the trainer; `ray_trainer` re-exports it.
Every hook receives the `RayPPOTrainer` as `trainer`."""

from __future__ import annotations

from typing import Any

from verl.protocol import DataProto

__all__ = ["TrainerCallback"]


class TrainerCallback:
    """Observe or adjust the loop at fixed points without copying `fit()`.

    Every method receives the trainer; batch hooks may modify `batch` in place and add entries
    to `metrics`. `state_dict`/`load_state_dict` are saved in and restored from checkpoints.
    """

    def on_fit_start(self, trainer: Any) -> None: ...

    def on_batch_scored(self, trainer: Any, batch: DataProto, metrics: dict) -> None:
        """After generation and reward, before dynamic sampling and log-probs."""

    def on_advantages(self, trainer: Any, batch: DataProto, metrics: dict) -> None:
        """After advantages, before the critic and actor updates."""

    def on_step_end(self, trainer: Any, metrics: dict) -> None:
        """After the step's metrics are complete, before they are logged."""

    def on_validation(self, trainer: Any, metrics: dict) -> None: ...

    def on_fit_end(self, trainer: Any) -> None: ...

    def stop_requested(self) -> bool:
        """True ends the run after the current step (validated and saved as a last step)."""
        return False

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None: ...
