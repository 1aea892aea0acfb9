"""`trainer.health.*`: the training-health monitor (ours; upstream has none). See docs/health.md."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl.base_config import BaseConfig, check_choice, check_range

# every signal of verl/trainer/ppo/health.py, in the order of the report
HEALTH_SIGNALS = (
    "entropy_collapse",
    "degenerate_output",
    "length_growth",
    "length_clip",
    "reward_val_divergence",
    "reward_length_corr",
    "tool_call_collapse",
    "rollout_mismatch",
    "kl_spike",
    "grad_norm_spike",
    "nonfinite",
    "dead_signal",
)
HEALTH_ACTIONS = ("warn", "stop", "save_and_stop")


@dataclass
class HealthConfig(BaseConfig):
    """Named warnings about the known ways an RL run fails, while it runs (docs/health.md).

    - `enable`: compute the `health/*` metrics, warn once per episode of a condition, write
      `health.md` (and, with `trainer.plot`, `health.png`) into `trainer.log_dir` at the end.
    - `action`: what a tripped signal does: `warn` (a one-line warning), `stop` (also end the run
      after this step, validated and saved as a last step), `save_and_stop` (also save a checkpoint
      of this step, whatever `save_freq` says).
    - `actions`: per-signal overrides of `action`, e.g. `{rollout_mismatch: stop}`.
    - `patience`: consecutive steps a gradual condition must hold before it trips (spikes and
      non-finite skips trip at once; validation-based signals count validations).
    - `clear_after`: consecutive healthy steps that end an episode (the next one warns again).
    - `warmup_steps`: steps whose mean is a signal's starting value (entropy, length, tool rate).
    - `window`: steps averaged for a signal's current value and for the reward trend.
    - `solved_score_ratio`: a batch whose mean score is at least this share of the best score seen
      counts as solved: entropy collapse and equal-reward groups at that score are not alarms.
    - `entropy_ratio_min` / `identical_share_max`: entropy below this share of its start, or a
      share of responses equal to an earlier one of their group above `identical_share_max`, while
      the score stalled (and is not solved), is an entropy collapse.
    - `reward_stall_delta`: the score gained over the last `window` steps at most this is a stall.
    - `ngram_size`: n of the repeated n-gram rate.
    - `repeat_ngram_max` / `single_char_share_max`: degenerate output thresholds (repeated n-gram
      rate; share of responses of one repeated token or character).
    - `degenerate_min_tokens`: responses shorter than this are not judged for one-token/character
      repetition or identity (short answers are legitimately identical).
    - `length_growth_max`: mean response length over its start above this ratio trips.
    - `clip_ratio_max`: share of responses cut at `max_response_length` above this trips.
    - `reward_length_corr_max` / `length_rise_min`: Pearson correlation of score and length above
      this, while the mean length is above `length_rise_min` times its start, trips.
    - `val_window`: validations back that the train/validation trend compares.
    - `train_rise_min` / `val_stall_delta`: train score up by at least `train_rise_min` while the
      validation accuracy changed by at most `val_stall_delta` trips.
    - `tool_rate_drop_ratio` / `reward_hold_tolerance`: tool-call rate below this share of its
      start while the score is within `reward_hold_tolerance` of its start (or above) trips.
    - `mismatch_kl_max`: rollout/trainer mismatch (`rollout_mismatch/kl_k3`, median over
      `window` steps) above this trips.
    - `spike_factor` / `spike_history`: a KL-loss or grad-norm value above `spike_factor` times the
      median of the previous `spike_history` magnitudes trips (from the 11th value: the first ten are
      the run settling, e.g. a KL growing from 0).
    - `kl_spike_min`: KL values (magnitude) below this never count as a spike.
    - `dead_group_share_max`: share of groups whose rewards are all equal (below the solved score)
      above this trips.
    """

    enable: bool = True
    action: str = "warn"
    actions: dict[str, str] = field(default_factory=dict)
    patience: int = 3
    clear_after: int = 5
    warmup_steps: int = 3
    window: int = 5
    solved_score_ratio: float = 0.9
    entropy_ratio_min: float = 0.2
    reward_stall_delta: float = 0.01
    ngram_size: int = 4
    repeat_ngram_max: float = 0.5
    single_char_share_max: float = 0.2
    identical_share_max: float = 0.5
    degenerate_min_tokens: int = 8
    length_growth_max: float = 2.0
    clip_ratio_max: float = 0.2
    reward_length_corr_max: float = 0.8
    length_rise_min: float = 1.1
    val_window: int = 2
    train_rise_min: float = 0.05
    val_stall_delta: float = 0.0
    tool_rate_drop_ratio: float = 0.5
    reward_hold_tolerance: float = 0.05
    mismatch_kl_max: float = 1e-5
    spike_factor: float = 5.0
    spike_history: int = 5
    kl_spike_min: float = 0.01
    dead_group_share_max: float = 0.8

    def __post_init__(self):
        owner = "trainer.health"
        check_choice(owner, "action", self.action, HEALTH_ACTIONS)
        self.actions = dict(self.actions or {})
        for name, act in self.actions.items():
            check_choice(owner, "actions key", name, HEALTH_SIGNALS)
            check_choice(owner, f"actions.{name}", act, HEALTH_ACTIONS)
        for key in ("patience", "clear_after", "warmup_steps", "window", "val_window", "spike_history"):
            check_range(owner, key, getattr(self, key), low=1)
        check_range(owner, "ngram_size", self.ngram_size, low=2)
        check_range(owner, "degenerate_min_tokens", self.degenerate_min_tokens, low=1)
        for key in (
            "solved_score_ratio",
            "entropy_ratio_min",
            "repeat_ngram_max",
            "single_char_share_max",
            "identical_share_max",
            "clip_ratio_max",
            "tool_rate_drop_ratio",
            "dead_group_share_max",
        ):
            check_range(owner, key, getattr(self, key), low=0.0, high=1.0)
        check_range(owner, "reward_length_corr_max", self.reward_length_corr_max, low=-1.0, high=1.0)
        for key in ("length_growth_max", "length_rise_min", "spike_factor"):
            check_range(owner, key, getattr(self, key), low=1.0)
        for key in ("reward_hold_tolerance", "mismatch_kl_max", "kl_spike_min", "train_rise_min"):
            check_range(owner, key, getattr(self, key), low=0.0)
