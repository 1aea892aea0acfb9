"""`CheckpointConfig` (upstream's `verl.trainer.config.CheckpointConfig`): what a role's checkpoint
holds. The checkpoint managers (`verl.utils.checkpoint`) take it, or the same keys as a mapping
(the `*.checkpoint` sections of ppo_trainer.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl.base_config import BaseConfig

__all__ = ["CheckpointConfig", "CHECKPOINT_CONTENTS"]

CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")


@dataclass
class CheckpointConfig(BaseConfig):
    """- `save_contents` / `load_contents`: subsets of model, optimizer, extra (RNG, scheduler,
      step), hf_model (a Hugging Face export); `load_contents` null = `save_contents`.
    - `save_lora_only`: a LoRA model writes only its adapter (`lora_adapter/`, peft format), no
      merged export unless `hf_model` is listed; no effect without LoRA.
    - `async_save` (FSDP here; upstream: Megatron only): shards are written by a background thread
      while training goes on; the checkpoint is published only once complete (docs/checkpoints.md).
    - `strict`: no effect; checkpoints here always load strictly (every weight must match).
    """

    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    load_contents: list[str] | None = None
    async_save: bool = False
    strict: bool = True
    save_lora_only: bool = False

    def __post_init__(self):
        if self.load_contents is None:
            self.load_contents = list(self.save_contents)
        for key in ("save_contents", "load_contents"):
            bad = sorted(set(getattr(self, key)) - set(CHECKPOINT_CONTENTS))
            if bad:
                raise ValueError(f"checkpoint.{key} has unknown entries {bad}; accepted: {list(CHECKPOINT_CONTENTS)}")
