"""Actor and reference-policy config (`actor_rollout_ref.actor`, `actor_rollout_ref.ref`).

Batch sizes follow upstream verl: `ppo_mini_batch_size` counts *prompts* (the worker multiplies it
by `rollout.n` and divides by the data-parallel size); `*_micro_batch_size_per_gpu` counts
*sequences* per worker; `use_dynamic_bsz` replaces the micro-batch size by a per-worker token
budget `ppo_max_token_len_per_gpu`. See docs/batch_sizes.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig, check_choice, check_range
from verl.trainer.ppo import mode_names
from verl.utils.py_functional import config_get
from verl.workers.config.engine import FSDPEngineConfig
from verl.workers.config.optimizer import OptimizerConfig

# the accepted values are owned by the functions that interpret them
LOSS_AGG_MODES = mode_names.LOSS_AGG_MODES
KL_TYPES = mode_names.KL_PENALTY_TYPES


@dataclass
class PolicyLossConfig(BaseConfig):
    """Knobs of the policy-loss functions (`actor.policy_loss`).

    `loss_mode` selects a function from `core_algos.POLICY_LOSS_REGISTRY` (validated by the
    trainer after user modules are imported, so user-registered names are accepted).
    """

    loss_mode: str = "vanilla"
    # clip_cov: clip the gradient of a random subset of high-covariance tokens
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    # kl_cov: apply a KL penalty on the top-covariance tokens
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    # sapo: soft gate temperature for positive / negative advantages
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    # reinforce / pg: multiply by the stop-gradient ratio (off-policy correction)
    pg_use_ratio: bool = False
    # free-form knobs for user-registered losses (read with core_algos.config_get(cfg.policy_loss.extra, key))
    extra: dict = field(default_factory=dict)
    # dro: beta of the DRO loss (read by core_algos); null = the loss's own default
    dro_beta: float | None = None
    # the run's algorithm.rollout_correction, set by the actor before a loss is called (upstream
    # passes it to bypass-mode losses this way); null outside a run
    rollout_correction: Any = None

    def __post_init__(self):
        check_range("actor.policy_loss", "tau_pos", self.tau_pos, low=0.0, low_open=True)
        check_range("actor.policy_loss", "tau_neg", self.tau_neg, low=0.0, low_open=True)
        check_range("actor.policy_loss", "clip_cov_ratio", self.clip_cov_ratio, low=0.0, high=1.0)
        check_range("actor.policy_loss", "kl_cov_ratio", self.kl_cov_ratio, low=0.0, high=1.0)
        # the weight of DRO's quadratic penalty: zero or negative rewards moving away from the old policy
        check_range("actor.policy_loss", "dro_beta", self.dro_beta, low=0.0, low_open=True, allow_none=True)


@dataclass
class ActorConfig(BaseConfig):
    """The policy being trained. Loss = policy loss - entropy_coeff * entropy + kl_loss_coef * KL."""

    # upstream's set: the worker rewrites the batch sizes per rank (worker_common._apply_batch_plan)
    _mutable_fields = BaseConfig._mutable_fields | {
        "ppo_mini_batch_size",
        "ppo_micro_batch_size",
        "ppo_micro_batch_size_per_gpu",
        "ppo_infer_micro_batch_size_per_gpu",
        "engine",
        "model_config",
    }

    strategy: str = "fsdp"
    # responses per prompt (interpolated from actor_rollout_ref.rollout.n)
    rollout_n: int = 1
    ppo_mini_batch_size: int = 32
    # upstream's deprecated global micro-batch size: divided by the data-parallel size into
    # ppo_micro_batch_size_per_gpu when that is null
    ppo_micro_batch_size: int | None = None
    ppo_micro_batch_size_per_gpu: int | None = None
    use_dynamic_bsz: bool = True
    ppo_max_token_len_per_gpu: int = 16384
    ppo_epochs: int = 1
    shuffle: bool = False
    data_loader_seed: int = 1
    # PPO clip: ratio in [1 - clip_ratio_low, 1 + clip_ratio_high]; dual clip at clip_ratio_c (> 1)
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None  # null = clip_ratio
    clip_ratio_high: float | None = None  # null = clip_ratio
    clip_ratio_c: float = 3.0
    # sapo soft-gate temperatures (upstream's place; policy_loss.tau_pos/tau_neg win when they are
    # not at their default); after construction both places hold the value the loss uses
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    loss_agg_mode: str = "token-mean"
    # constant divisor of seq-mean-token-sum-norm; null = rollout.response_length
    loss_scale_factor: float | None = None
    entropy_coeff: float = 0.0
    entropy_from_logits_with_chunking: bool = False
    # run each distinct prompt once per micro-batch and share it (its KV cache) with the rows that
    # repeat it (rollout.n samples): same log-probs and gradients, fewer tokens; used where exact
    # (a causal LM with a KV cache, model.use_remove_padding, no gradient checkpointing)
    use_prefix_grouper: bool = True
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    grad_clip: float = 1.0
    # lr 3e-5 suits the embedded 1M-parameter model; 7B-class models use ~1e-6
    optim: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=3e-5))
    fsdp_config: FSDPEngineConfig = field(default_factory=FSDPEngineConfig)
    checkpoint: dict = field(default_factory=lambda: {"save_contents": ["model", "optimizer", "extra"]})
    # ignored in this implementation (upstream Ulysses); must stay 1
    ulysses_sequence_parallel_size: int = 1
    # upstream fields held for code written against upstream's ActorConfig; see the "here"
    # column of docs/config_reference.md for what each does in this project
    use_torch_compile: bool = True
    calculate_entropy: bool = False
    calculate_sum_pi_squared: bool = False
    use_fused_kernels: bool = False
    profiler: dict = field(default_factory=dict)
    # upstream's engine config and model config objects (set by its workers); null here
    engine: Any = None
    model_config: Any = None
    # the loss denominators of the micro-batch being computed (keys: `core_algos.GLOBAL_BATCH_INFO_KEYS`),
    # written by the engine before each loss call and passed on by every loss as
    # `agg_loss(..., **config.global_batch_info)` (upstream main); state of this config only
    global_batch_info: dict = field(default_factory=dict)
    # sequences per micro-batch of the actor's log-prob pass; null = rollout.log_prob_micro_batch_size_per_gpu
    ppo_infer_micro_batch_size_per_gpu: int | None = None
    # token budget of a dynamic micro-batch of that pass; null = rollout.log_prob_max_token_len_per_gpu
    ppo_infer_max_token_len_per_gpu: int | None = None
    # refused when true: no vision tower to freeze (text models)
    freeze_vision_tower: bool = False
    # refused when qat.enable is true: no quantization-aware training
    qat: dict = field(default_factory=lambda: {"enable": False})

    # the training backends this class describes (McoreActorConfig: megatron)
    _STRATEGIES = ("fsdp", "fsdp2")

    def __post_init__(self):
        owner = "actor_rollout_ref.actor"
        check_choice(owner, "strategy", self.strategy, self._STRATEGIES)
        if self.freeze_vision_tower:
            raise ValueError(
                f"{owner}.freeze_vision_tower=True is not available: this verl trains text models (no vision "
                "tower to freeze); leave it false"
            )
        qat = self.qat or {}
        if (qat.get("enable") if hasattr(qat, "get") else getattr(qat, "enable", False)) is True:
            raise ValueError(
                f"{owner}.qat.enable=True is not available: quantization-aware training is not implemented "
                "(available: bf16/fp32 training); leave it false"
            )
        check_range(
            owner,
            "ppo_infer_micro_batch_size_per_gpu",
            self.ppo_infer_micro_batch_size_per_gpu,
            low=1,
            allow_none=True,
        )
        check_range(
            owner, "ppo_infer_max_token_len_per_gpu", self.ppo_infer_max_token_len_per_gpu, low=1, allow_none=True
        )
        if not self.use_dynamic_bsz and None not in (self.ppo_micro_batch_size, self.ppo_micro_batch_size_per_gpu):
            raise ValueError(
                f"[actor] You have set both '{owner}.ppo_micro_batch_size'={self.ppo_micro_batch_size} AND "
                f"'{owner}.ppo_micro_batch_size_per_gpu'={self.ppo_micro_batch_size_per_gpu}: remove the deprecated "
                "ppo_micro_batch_size (only one of them would be used)"
            )
        if self.loss_agg_mode not in LOSS_AGG_MODES:  # upstream's first words
            raise ValueError(
                f"Invalid loss_agg_mode: {owner}.loss_agg_mode={self.loss_agg_mode!r}; "
                f"expected one of {list(LOSS_AGG_MODES)}"
            )
        check_choice(owner, "kl_loss_type", self.kl_loss_type, KL_TYPES)
        check_range(owner, "ppo_mini_batch_size", self.ppo_mini_batch_size, low=1)
        check_range(owner, "ppo_micro_batch_size_per_gpu", self.ppo_micro_batch_size_per_gpu, low=1, allow_none=True)
        check_range(owner, "ppo_max_token_len_per_gpu", self.ppo_max_token_len_per_gpu, low=1)
        check_range(owner, "ppo_epochs", self.ppo_epochs, low=1)
        check_range(owner, "clip_ratio", self.clip_ratio, low=0.0, low_open=True)
        if self.clip_ratio_low is None:
            self.clip_ratio_low = self.clip_ratio
        if self.clip_ratio_high is None:
            self.clip_ratio_high = self.clip_ratio
        # above 1 is allowed: e.g. CISPO's clip_ratio_low=10 (no lower clip in effect)
        check_range(owner, "clip_ratio_low", self.clip_ratio_low, low=0.0)
        check_range(owner, "clip_ratio_high", self.clip_ratio_high, low=0.0)
        if not self.clip_ratio_c > 1.0:
            raise ValueError(f"{owner}.clip_ratio_c={self.clip_ratio_c} must be > 1 (dual-clip lower bound)")
        check_range(owner, "loss_scale_factor", self.loss_scale_factor, low=0.0, low_open=True, allow_none=True)
        check_range(owner, "entropy_coeff", self.entropy_coeff, low=0.0)
        check_range(owner, "kl_loss_coef", self.kl_loss_coef, low=0.0)
        self._unify_sapo_temperatures()
        if self.ulysses_sequence_parallel_size != 1:
            raise ValueError(
                f"{owner}.ulysses_sequence_parallel_size={self.ulysses_sequence_parallel_size}: "
                "sequence parallelism is not implemented; use 1"
            )

    def _unify_sapo_temperatures(self) -> None:
        """`tau_pos` / `tau_neg` live at upstream's place (this config) and at ours
        (`policy_loss`); the one that is not at its default wins, and both are set to it, so the
        loss, upstream code reading `config.tau_pos` and a raw upstream yaml section agree."""
        defaults = PolicyLossConfig()
        for key in ("tau_pos", "tau_neg"):
            top, nested, default = getattr(self, key), config_get(self.policy_loss, key), getattr(defaults, key)
            value = nested if nested is not None and nested != default else top
            check_range("actor_rollout_ref.actor", key, value, low=0.0, low_open=True)
            setattr(self, key, value)
            if nested != value:
                if isinstance(self.policy_loss, PolicyLossConfig):
                    self.policy_loss = dataclasses.replace(self.policy_loss, **{key: value})
                else:
                    self.policy_loss[key] = value

    def validate(self, n_gpus: int, train_batch_size: int, model_config: dict | None = None) -> None:
        """Upstream's run-time checks of the batch sizes against the job (fixed-size micro-batches
        only): a train batch of at least one mini-batch, and the deprecated global
        `ppo_micro_batch_size` dividing the mini-batch and covering every worker. (The trainer's
        own checks, `verl.trainer.ppo.utils.validate_config`, run these and more.)"""
        del model_config  # upstream reads use_remove_padding for sequence parallelism, refused here
        if self.use_dynamic_bsz:
            return
        owner = "actor_rollout_ref.actor"
        if train_batch_size < self.ppo_mini_batch_size:
            raise ValueError(
                f"data.train_batch_size ({train_batch_size}) must be >= {owner}.ppo_mini_batch_size "
                f"({self.ppo_mini_batch_size})"
            )
        mbs = self.ppo_micro_batch_size
        if mbs is not None:
            if self.ppo_mini_batch_size % mbs != 0:
                raise ValueError(
                    f"{owner}.ppo_mini_batch_size ({self.ppo_mini_batch_size}) must be divisible by "
                    f"{owner}.ppo_micro_batch_size ({mbs})"
                )
            if mbs * self.ulysses_sequence_parallel_size < n_gpus:
                raise ValueError(
                    f"{owner}.ppo_micro_batch_size ({mbs}) * ulysses_sequence_parallel_size "
                    f"({self.ulysses_sequence_parallel_size}) must be >= n_gpus ({n_gpus})"
                )


# Upstream name of the FSDP flavour of the actor config.
FSDPActorConfig = ActorConfig


@dataclass
class RefConfig(BaseConfig):
    """The frozen reference policy used for KL (in reward or in loss)."""

    strategy: str = "fsdp"
    # upstream's deprecated global size (see ActorConfig.ppo_micro_batch_size)
    log_prob_micro_batch_size: int | None = None
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = 16384
    fsdp_config: FSDPEngineConfig = field(default_factory=FSDPEngineConfig)
    ulysses_sequence_parallel_size: int = 1
    entropy_from_logits_with_chunking: bool = False

    def __post_init__(self):
        owner = "actor_rollout_ref.ref"
        check_choice(owner, "strategy", self.strategy, ("fsdp", "fsdp2"))
        check_range(
            owner, "log_prob_micro_batch_size_per_gpu", self.log_prob_micro_batch_size_per_gpu, low=1, allow_none=True
        )
        check_range(owner, "log_prob_max_token_len_per_gpu", self.log_prob_max_token_len_per_gpu, low=1)
