"""Optimizer and learning-rate schedule config (`*.optim`)."""

from __future__ import annotations

from dataclasses import dataclass

from verl.base_config import BaseConfig, check_choice, check_range

__all__ = ["FSDPOptimizerConfig", "McoreOptimizerConfig", "OptimizerConfig", "LR_SCHEDULER_TYPES"]

LR_SCHEDULER_TYPES = ("constant", "cosine")


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
        check_range(owner, "min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0, allow_none=True)
        check_range(owner, "weight_decay", self.weight_decay, low=0.0)
        check_choice(owner, "lr_scheduler_type", self.lr_scheduler_type, LR_SCHEDULER_TYPES)
        self.betas = tuple(float(b) for b in self.betas)
        if len(self.betas) != 2:
            raise ValueError(f"optim.betas={self.betas!r} must have two entries (beta1, beta2)")


@dataclass
class FSDPOptimizerConfig(OptimizerConfig):
    """Upstream's optimizer config of the FSDP engine (`optim/fsdp.yaml`).

    The extra fields name what this project builds; other values are refused, naming the key:
    `optimizer` AdamW from `optimizer_impl` torch.optim; `clip_grad` must stay 1.0 (gradients are
    clipped by the role's `grad_clip`: `actor_rollout_ref.actor.grad_clip`, `critic.grad_clip`);
    `zero_indexed_step` must stay True (the schedule's first step is step 0);
    `override_optimizer_config` must stay null. `warmup_style` is upstream's old name of
    `lr_scheduler_type` (it wins when set). `min_lr_ratio` null means a floor of 0.
    """

    optimizer: str = "AdamW"
    optimizer_impl: str = "torch.optim"
    lr: float = 1e-3
    clip_grad: float = 1.0
    min_lr_ratio: float | None = None
    zero_indexed_step: bool = True
    warmup_style: str | None = None
    override_optimizer_config: dict | None = None

    def __post_init__(self):
        if self.warmup_style is not None:
            check_choice("optim", "warmup_style", self.warmup_style, LR_SCHEDULER_TYPES)
            self.lr_scheduler_type = self.warmup_style
        super().__post_init__()
        check_choice("optim", "optimizer", self.optimizer, ("AdamW",))
        check_choice("optim", "optimizer_impl", self.optimizer_impl, ("torch.optim",))
        if self.clip_grad != 1.0:
            raise ValueError(
                f"optim.clip_grad={self.clip_grad} is not read here: gradients are clipped by the role's grad_clip "
                "(actor_rollout_ref.actor.grad_clip / critic.grad_clip); leave optim.clip_grad at 1.0"
            )
        if self.zero_indexed_step is not True:
            raise ValueError("optim.zero_indexed_step=False is not available: the lr schedule starts at step 0")
        if self.override_optimizer_config is not None:
            raise ValueError(
                f"optim.override_optimizer_config={self.override_optimizer_config!r} is not available "
                "(available: the AdamW keys of optim: lr, betas, eps, weight_decay)"
            )


@dataclass
class McoreOptimizerConfig(OptimizerConfig):
    """Megatron-LM optimizer and schedule (`*.optim` of a Megatron run), with the Muon fields of
    Megatron-Core's OptimizerConfig at their defaults."""

    optimizer: str = "adam"
    clip_grad: float = 1.0
    lr_warmup_init: float = 0.0
    lr_decay_steps: int | None = None
    lr_decay_style: str = "linear"
    min_lr: float = 0.0
    weight_decay_incr_style: str = "constant"
    lr_wsd_decay_style: str = "exponential"
    lr_wsd_decay_steps: int | None = None
    use_checkpoint_opt_param_scheduler: bool = False
    override_optimizer_config: dict | None = None
    use_layer_wise_distributed_optimizer: bool = False
    muon_momentum: float = 0.95
    muon_nesterov: bool = False
    muon_split_qkv: bool = True
    muon_scale_mode: str = "spectral"
    muon_coefficient_type: str = "quintic"
    muon_num_ns_steps: int = 5
    muon_tp_mode: str = "blockwise"
    muon_fp32_matmul_prec: str = "medium"
    muon_extra_scale_factor: float = 1.0
    muon_scalar_optimizer: str = "adam"

    def __post_init__(self):
        super().__post_init__()
        check_range("optim", "clip_grad", self.clip_grad, low=0.0)
        check_range("optim", "muon_num_ns_steps", self.muon_num_ns_steps, low=1)
