"""`trainer.v1.*`: upstream's trainer modes and their replay-buffer sampler.

- `trainer_mode`: `sync` (generate, then train, every step), `separate_async` (a rollout with
  workers of its own generates ahead while the trainer trains), `colocate_async` (not available
  here: the colocated rollout shares the actor's processes, so it cannot generate while they train).
- `separate_async.num_warmup_batches`: how many batches generation runs ahead of training (the
  staleness of a trained batch once the pipeline is full); `parameter_sync_step`: optimizer steps
  (mini-batches) per weight sync: `data.train_batch_size` must equal
  `parameter_sync_step x actor.ppo_mini_batch_size` (upstream's rule).
- `sampler.max_off_policy_threshold`: the most model versions a trajectory may span (1 = on-policy,
  staleness 0); `max_off_policy_strategy`: `drop` (a trajectory beyond the bound is evicted) or
  `wait` (generation waits for newer weights instead: nothing is dropped).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig, check_choice, check_range

TRAINER_MODES = ("sync", "colocate_async", "separate_async")
OFF_POLICY_STRATEGIES = ("drop", "wait")


@dataclass
class ColocateAsyncConfig(BaseConfig):
    num_warmup_batches: int = 1


@dataclass
class HybridRolloutSwitchConfig(BaseConfig):
    """Upstream's lending of idle trainer devices to the rollout (not available: see the rules)."""

    enable_switch: bool = False
    switch_threshold_ratio: float = 0.4
    adaptive_switch_threshold: bool = True
    switch_threshold_step_up: float = 0.05
    switch_threshold_step_down: float = 0.03
    switch_threshold_release_steps: int = 2
    switch_cost_window_size: int = 3


@dataclass
class SeparateAsyncConfig(BaseConfig):
    num_warmup_batches: int = 1
    parameter_sync_step: int = 4
    hybrid_rollout: HybridRolloutSwitchConfig = field(default_factory=HybridRolloutSwitchConfig)

    def __post_init__(self):
        owner = "trainer.v1.separate_async"
        check_range(owner, "num_warmup_batches", self.num_warmup_batches, low=0)
        check_range(owner, "parameter_sync_step", self.parameter_sync_step, low=1)


@dataclass
class CustomSamplerConfig(BaseConfig):
    path: str | None = None
    name: str | None = None


@dataclass
class SamplerConfig(BaseConfig):
    max_off_policy_threshold: int = 8
    max_off_policy_strategy: str = "drop"
    sync_refill_failed_groups: bool = False
    custom_sampler: CustomSamplerConfig = field(default_factory=CustomSamplerConfig)
    sampler_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        owner = "trainer.v1.sampler"
        threshold = self.max_off_policy_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold <= 0:
            raise ValueError(f"{owner}.max_off_policy_threshold={threshold!r} must be an integer greater than 0")
        check_choice(owner, "max_off_policy_strategy", self.max_off_policy_strategy, OFF_POLICY_STRATEGIES)


@dataclass
class TrainerV1Config(BaseConfig):
    """`trainer.v1` (see the module docstring)."""

    trainer_mode: str = "sync"
    sync: dict[str, Any] = field(default_factory=dict)
    colocate_async: ColocateAsyncConfig = field(default_factory=ColocateAsyncConfig)
    separate_async: SeparateAsyncConfig = field(default_factory=SeparateAsyncConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)

    def __post_init__(self):
        check_choice("trainer.v1", "trainer_mode", self.trainer_mode, TRAINER_MODES)
