"""Optimizer and learning-rate schedule config (`*.optim`)."""

from __future__ import annotations

from dataclasses import dataclass

from verl.base_config import BaseConfig, check_choice, check_range


@dataclass
class OptimizerConfig(BaseConfig):
    """AdamW with linear warm-up followed by a constant or cosine schedule.

    Warm-up steps are `lr_warmup_steps` when > 0, else `lr_warmup_steps_ratio * total_training_steps`.
    `total_training_steps` is filled in by the trainer (-1 = unknown yet).
    """

    lr: float = 1e-6
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    total_training_steps: int = -1
    weight_decay: float = 0.01
    betas: tuple[float, float] | list[float] = (0.9, 0.999)
    eps: float = 1e-8
    lr_scheduler_type: str = "constant"  # constant | cosine
    min_lr_ratio: float = 0.0  # cosine floor as a fraction of lr
    num_cycles: float = 0.5  # cosine: 0.5 = one half period from lr down to the floor

    def __post_init__(self):
        owner = "optim"
        check_range(owner, "lr", self.lr, low=0.0)
        check_range(owner, "lr_warmup_steps_ratio", self.lr_warmup_steps_ratio, low=0.0, high=1.0)
        check_range(owner, "min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0)
        check_range(owner, "weight_decay", self.weight_decay, low=0.0)
        check_choice(owner, "lr_scheduler_type", self.lr_scheduler_type, ("constant", "cosine"))
        self.betas = tuple(float(b) for b in self.betas)
        if len(self.betas) != 2:
            raise ValueError(f"optim.betas={self.betas!r} must have two entries (beta1, beta2)")
