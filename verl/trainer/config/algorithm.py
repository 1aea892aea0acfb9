"""Algorithm config (`algorithm`): advantage estimator, KL placement and control, normalisation,
dynamic sampling and rollout/learner mismatch correction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig, check_choice, check_range

NORM_LEVELS = ("batch", "group", None)


@dataclass
class KLControlConfig(BaseConfig):
    """Coefficient of KL-in-reward. `fixed`: beta = kl_coef. `adaptive`: beta is multiplied by
    `1 + clip(kl/target_kl - 1, -0.2, 0.2) * n_steps / horizon` after every step."""

    type: str = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1

    def __post_init__(self):
        check_choice("algorithm.kl_ctrl", "type", self.type, ("fixed", "adaptive"))
        check_range("algorithm.kl_ctrl", "kl_coef", self.kl_coef, low=0.0)
        check_range("algorithm.kl_ctrl", "horizon", self.horizon, low=1)
        check_range("algorithm.kl_ctrl", "target_kl", self.target_kl, low=0.0, low_open=True)


@dataclass
class NormConfig(BaseConfig):
    """Mean/std normalisation of a per-response quantity (AReaL style).

    x' = (x - mean) / (std + eps), where the mean is taken over the group (same uid) or the batch
    (or not subtracted when `mean_level` is null), optionally leave-one-out within the group, and
    the std over the group or batch (or not divided when `std_level` is null).
    """

    mean_level: str | None = "group"
    std_level: str | None = "group"
    mean_leave1out: bool = False
    std_unbiased: bool = True
    eps: float = 1e-5

    def __post_init__(self):
        check_choice("algorithm.*_norm", "mean_level", self.mean_level, NORM_LEVELS)
        check_choice("algorithm.*_norm", "std_level", self.std_level, NORM_LEVELS)
        check_range("algorithm.*_norm", "eps", self.eps, low=0.0)


@dataclass
class FilterGroupsConfig(BaseConfig):
    """DAPO dynamic sampling: drop groups whose `metric` is equal for all responses.

    `keep_generating=True`: generate more batches until `data.train_batch_size` groups are kept
    (at most `max_num_gen_batches` generation rounds; 0 = no cap). False: train on what is left.
    """

    enable: bool = False
    metric: str | None = "acc"  # null (upstream's yaml default) = acc
    max_num_gen_batches: int = 0
    keep_generating: bool = True

    def __post_init__(self):
        if self.metric is None:
            self.metric = "acc"
        check_range("algorithm.filter_groups", "max_num_gen_batches", self.max_num_gen_batches, low=0)


@dataclass
class RolloutCorrectionConfig(BaseConfig):
    """Correction for the mismatch between the rollout engine's policy and the learner's
    (`verl/trainer/ppo/rollout_corr_helper.py`). Needs `rollout.calculate_log_probs=True`.

    - `rollout_is`: truncated importance-sampling weights `min(exp(old_logp - rollout_logp), C)`
      at `token` or `sequence` level; null = off. `rollout_is_threshold` is C.
    - `rollout_rs`: rejection (masking) instead of reweighting; null = off. Upstream also takes a
      comma-separated list of rules (`token_k1,seq_max_k2`), with `rollout_rs_threshold` one
      value per rule or one for all, and thresholds written as `"lower_upper"` strings; those
      values are passed through unchanged to `rollout_corr_helper`, which checks them.
    - `rollout_is_batch_normalize`: rescale the IS weights to mean 1 over the batch.
    - `bypass_mode`: use the rollout log-probs as the old log-probs (no old-policy forward pass);
      `loss_type` (`ppo_clip` or `reinforce`) selects the loss of that mode.

    The dataclass default of `rollout_is` is upstream's (`sequence`); the yaml's is null (off),
    as upstream's yaml.
    """

    rollout_is: str | None = "sequence"
    # a float, or upstream's "lower_upper" string (IcePop-style bounds)
    rollout_is_threshold: float | str = 2.0
    rollout_rs: str | None = None
    rollout_rs_threshold: float | str | None = None
    rollout_rs_threshold_lower: float | None = None
    rollout_is_batch_normalize: bool = False
    bypass_mode: bool = False
    loss_type: str = "ppo_clip"

    def __post_init__(self):
        check_choice("algorithm.rollout_correction", "rollout_is", self.rollout_is, (None, "token", "sequence"))
        if not isinstance(self.rollout_is_threshold, str):
            check_range(
                "algorithm.rollout_correction",
                "rollout_is_threshold",
                self.rollout_is_threshold,
                low=0.0,
                low_open=True,
            )
        check_choice("algorithm.rollout_correction", "loss_type", self.loss_type, ("ppo_clip", "reinforce"))

    # -- upstream's presets. decoupled_*: old log-probs recomputed (three policies), IS weights
    # correct the rollout/old gap; bypass_*: the rollout log-probs are the old ones (two policies),
    # loss_type ppo_clip (the ratio corrects) or reinforce (explicit IS weights). "Geo-RS" rejects
    # sequences by their geometric-mean ratio (seq_mean_k1), "K3-RS" by the mean k3 divergence.
    @classmethod
    def disabled(cls) -> RolloutCorrectionConfig:
        return cls(rollout_is=None, rollout_rs=None)

    @classmethod
    def decoupled_token_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        return cls(rollout_is="token", rollout_is_threshold=threshold, rollout_rs=None)

    @classmethod
    def decoupled_seq_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        return cls(rollout_is="sequence", rollout_is_threshold=threshold, rollout_rs=None)

    @classmethod
    def decoupled_token_icepop(cls, threshold: float = 5.0, threshold_lower: float = 0.5) -> RolloutCorrectionConfig:
        """Token IS weights set to 0 outside [threshold_lower, threshold] (the mask is kept)."""
        return cls(rollout_is="token", rollout_is_threshold=f"{threshold_lower}_{threshold}", rollout_rs=None)

    @classmethod
    def decoupled_seq_is_rs(cls, is_threshold: float = 2.0, rs_threshold="0.5_2.0") -> RolloutCorrectionConfig:
        return cls(
            rollout_is="sequence",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_sum_k1",
            rollout_rs_threshold=rs_threshold,
        )

    @classmethod
    def decoupled_geo_rs(cls, rs_threshold="0.999_1.001") -> RolloutCorrectionConfig:
        return cls(rollout_is=None, rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold)

    @classmethod
    def decoupled_geo_rs_seq_tis(cls, is_threshold: float = 2.0, rs_threshold="0.999_1.001") -> RolloutCorrectionConfig:
        return cls._with_rs("sequence", is_threshold, "seq_mean_k1", rs_threshold)

    @classmethod
    def decoupled_geo_rs_token_tis(
        cls, is_threshold: float = 2.0, rs_threshold="0.999_1.001"
    ) -> RolloutCorrectionConfig:
        return cls._with_rs("token", is_threshold, "seq_mean_k1", rs_threshold)

    @classmethod
    def decoupled_k3_rs(cls, rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        return cls(rollout_is=None, rollout_rs="seq_mean_k3", rollout_rs_threshold=rs_threshold)

    @classmethod
    def decoupled_k3_rs_seq_tis(cls, is_threshold: float = 2.0, rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        return cls._with_rs("sequence", is_threshold, "seq_mean_k3", rs_threshold)

    @classmethod
    def decoupled_k3_rs_token_tis(
        cls, is_threshold: float = 2.0, rs_threshold: float = 0.01
    ) -> RolloutCorrectionConfig:
        return cls._with_rs("token", is_threshold, "seq_mean_k3", rs_threshold)

    @classmethod
    def bypass_ppo_clip(cls) -> RolloutCorrectionConfig:
        return cls(rollout_is=None, rollout_rs=None, bypass_mode=True, loss_type="ppo_clip")

    @classmethod
    def bypass_ppo_clip_geo_rs(cls, rs_threshold="0.999_1.001") -> RolloutCorrectionConfig:
        return cls._with_rs(None, 2.0, "seq_mean_k1", rs_threshold, bypass="ppo_clip")

    @classmethod
    def bypass_ppo_clip_k3_rs(cls, rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        return cls._with_rs(None, 2.0, "seq_mean_k3", rs_threshold, bypass="ppo_clip")

    @classmethod
    def bypass_pg_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        return cls(
            rollout_is="sequence",
            rollout_is_threshold=threshold,
            rollout_rs=None,
            bypass_mode=True,
            loss_type="reinforce",
        )

    @classmethod
    def bypass_pg_token_icepop(cls, threshold: float = 5.0, threshold_lower: float = 0.5) -> RolloutCorrectionConfig:
        return cls(
            rollout_is="token",
            rollout_is_threshold=f"{threshold_lower}_{threshold}",
            rollout_rs=None,
            bypass_mode=True,
            loss_type="reinforce",
        )

    @classmethod
    def bypass_pg_geo_rs(cls, rs_threshold="0.999_1.001") -> RolloutCorrectionConfig:
        return cls._with_rs(None, 2.0, "seq_mean_k1", rs_threshold, bypass="reinforce")

    @classmethod
    def bypass_pg_geo_rs_seq_tis(cls, is_threshold: float = 2.0, rs_threshold="0.999_1.001") -> RolloutCorrectionConfig:
        return cls._with_rs("sequence", is_threshold, "seq_mean_k1", rs_threshold, bypass="reinforce")

    @classmethod
    def bypass_pg_geo_rs_token_tis(
        cls, is_threshold: float = 2.0, rs_threshold="0.999_1.001"
    ) -> RolloutCorrectionConfig:
        return cls._with_rs("token", is_threshold, "seq_mean_k1", rs_threshold, bypass="reinforce")

    @classmethod
    def _with_rs(cls, rollout_is, is_threshold, rollout_rs, rs_threshold, bypass: str | None = None):
        extra = {"bypass_mode": True, "loss_type": bypass} if bypass else {}
        return cls(
            rollout_is=rollout_is,
            rollout_is_threshold=is_threshold,
            rollout_rs=rollout_rs,
            rollout_rs_threshold=rs_threshold,
            **extra,
        )


@dataclass
class AlgoConfig(BaseConfig):
    """`algorithm.*`. `adv_estimator` names a function in `core_algos.ADV_ESTIMATOR_REGISTRY`
    (validated by the trainer after user modules are imported)."""

    adv_estimator: str = "gae"
    gamma: float = 1.0
    # GAE lambda: a float, or a registered / dotted-path callable returning a per-trajectory
    # lambda [B] (`vapo_length_adaptive`, `relative_position`), called with `lam_kwargs`
    lam: Any = 1.0
    lam_kwargs: dict = field(default_factory=dict)
    gae_timestep_unit: str = "token"
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    # AReaL-style normalisation: reward_norm acts on per-response scores, adv_norm on advantages
    reward_norm: NormConfig | None = None
    adv_norm: NormConfig | None = None
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    # PF-PPO: reweight (resample) the batch by reward before the update (core_algos'
    # compute_pf_ppo_reweight_data reads pf_ppo: reweight_method pow | max_min | max_random, weight_pow)
    use_pf_ppo: bool = False
    pf_ppo: dict = field(default_factory=lambda: {"reweight_method": "pow", "weight_pow": 2.0})
    # GDPO: the reward extra-info keys whose group-normalised advantages are combined, and their weights
    gdpo_reward_keys: list | None = None
    gdpo_reward_weights: list | None = None

    def __post_init__(self):
        check_choice("algorithm", "gae_timestep_unit", self.gae_timestep_unit, ("token", "turn"))
        check_range("algorithm", "gamma", self.gamma, low=0.0, high=1.0)
        if isinstance(self.lam, (int, float)) and not isinstance(self.lam, bool):
            check_range("algorithm", "lam", self.lam, low=0.0, high=1.0)
        elif not isinstance(self.lam, str):
            raise ValueError(
                f"algorithm.lam={self.lam!r} must be a float in [0, 1] or the name/path of a lambda function"
            )
