"""Critic (value model) config (`critic`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl.base_config import BaseConfig, check_choice, check_range
from verl.workers.config.actor import LOSS_AGG_MODES
from verl.workers.config.engine import FSDPEngineConfig
from verl.workers.config.model import HFModelConfig
from verl.workers.config.optimizer import OptimizerConfig


def _critic_optim() -> OptimizerConfig:
    return OptimizerConfig(lr=1e-5)


@dataclass
class CriticConfig(BaseConfig):
    """Value model V(s_t) trained with the clipped value loss; needed by `gae` (and turn-level GAE).

    `enable: null` = on exactly when the advantage estimator needs a critic.
    """

    # upstream's set: the worker rewrites the batch sizes per rank (worker_common._apply_batch_plan)
    _mutable_fields = BaseConfig._mutable_fields | {
        "ppo_micro_batch_size_per_gpu",
        "ppo_mini_batch_size",
        "ppo_micro_batch_size",
        "engine",
        "model_config",
    }

    enable: bool | None = None
    strategy: str = "fsdp"
    rollout_n: int = 1  # interpolated from actor_rollout_ref.rollout.n
    model: HFModelConfig = field(default_factory=HFModelConfig)
    optim: OptimizerConfig = field(default_factory=_critic_optim)
    # upstream's key (older spellings critic.model.fsdp_config / critic.fsdp_config are aliases)
    fsdp: FSDPEngineConfig = field(default_factory=FSDPEngineConfig)
    ppo_mini_batch_size: int = 256
    # upstream's deprecated global sizes (see ActorConfig.ppo_micro_batch_size)
    ppo_micro_batch_size: int | None = None
    forward_micro_batch_size: int | None = None
    ppo_micro_batch_size_per_gpu: int | None = None
    forward_micro_batch_size_per_gpu: int | None = None
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 32768
    forward_max_token_len_per_gpu: int = 32768
    ppo_epochs: int = 1
    shuffle: bool = False
    data_loader_seed: int = 1
    grad_clip: float = 1.0
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    checkpoint: dict = field(default_factory=lambda: {"save_contents": ["model", "optimizer", "extra"]})
    ulysses_sequence_parallel_size: int = 1
    # follows actor.loss_scale_factor; the value loss here is aggregated by loss_agg_mode alone
    loss_scale_factor: float | None = None

    @property
    def fsdp_config(self) -> FSDPEngineConfig:
        """This project's earlier name of `fsdp` (read-only view)."""
        return self.fsdp

    def __post_init__(self):
        owner = "critic"
        check_choice(owner, "strategy", self.strategy, ("fsdp", "fsdp2"))
        check_choice(owner, "loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        check_range(owner, "ppo_mini_batch_size", self.ppo_mini_batch_size, low=1)
        check_range(owner, "ppo_micro_batch_size_per_gpu", self.ppo_micro_batch_size_per_gpu, low=1, allow_none=True)
        check_range(owner, "ppo_epochs", self.ppo_epochs, low=1)
        check_range(owner, "cliprange_value", self.cliprange_value, low=0.0)


FSDPCriticConfig = CriticConfig


@dataclass
class RewardModelConfig(BaseConfig):
    """Reward scoring: a rule/custom function through a reward manager (default), and optionally a
    sequence-classification reward model (`enable=True`) scored at the last valid token.

    `reward_manager` is a name in the reward-manager registry (naive, batch, dapo, prime) or
    `path.py:ClassName` of a user class. `reward_kwargs` go to the manager's constructor
    (e.g. the DAPO `overlong_buffer_cfg`).
    """

    # null: reward.reward_model.enable (upstream's current key), else False
    enable: bool | None = False
    strategy: str = "fsdp"
    model: HFModelConfig = field(default_factory=HFModelConfig)
    fsdp_config: FSDPEngineConfig = field(default_factory=FSDPEngineConfig)
    micro_batch_size_per_gpu: int | None = None
    max_length: int | None = None
    use_dynamic_bsz: bool = False
    forward_max_token_len_per_gpu: int = 32768
    # null: reward.reward_manager.name (upstream's current key)
    reward_manager: str | None = "naive"
    reward_kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        check_choice("reward_model", "strategy", self.strategy, ("fsdp", "fsdp2"))
