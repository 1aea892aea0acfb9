"""The algorithm core: advantage estimators, policy losses, loss aggregation, KL and value loss.

Everything here is a pure torch function of explicit tensors (no distributed calls, no workers, no
Hydra). Shapes use B = responses in the batch, L = padded response length; `response_mask` [B, L]
is 1 on the generated tokens that count. `index` is the numpy array of prompt ids (`uid`, object
dtype) that defines the groups; groups are never assumed to be contiguous or of equal size. The
spec of every formula is `ALGORITHMS.md`; the user-facing summary is `docs/algorithms.md`.

Extension points (user files can register their own functions without editing this package):

- `@register_policy_loss(name)`: `fn(old_log_prob, log_prob, advantages, response_mask,
  loss_agg_mode="token-mean", config=None, rollout_is_weights=None) -> (pg_loss, metrics)`,
  selected by `actor_rollout_ref.actor.policy_loss.loss_mode`.
- `@register_adv_est(name)`: `fn(token_level_rewards, response_mask, index=None, config=None,
  **kwargs) -> (advantages, returns)`, selected by `algorithm.adv_estimator`.

Micro-batching: `agg_loss` computes the exact share of the mini-batch loss for a micro-batch when
it knows the mini-batch-global denominators; the actor provides them with the
`global_batch_info(...)` context manager (see its docstring and docs/algorithms.md).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import logging
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import torch

import verl.utils.torch_functional as verl_F
from verl.utils.py_functional import config_get

logger = logging.getLogger(__name__)

__all__ = [
    # registries
    "POLICY_LOSS_REGISTRY",
    "register_policy_loss",
    "get_policy_loss_fn",
    "ADV_ESTIMATOR_REGISTRY",
    "AdvantageEstimator",
    "register_adv_est",
    "get_adv_estimator_fn",
    "AdvEstimatorTraits",
    "ADV_ESTIMATOR_TRAITS",
    "get_adv_estimator_traits",
    "adv_estimators_with",
    "unpack_policy_loss_output",
    "config_get",
    # aggregation and micro-batching
    "agg_loss",
    "global_batch_info",
    "get_global_batch_info",
    "GlobalBatchInfoView",
    "global_batch_info_view",
    "BatchLossStats",
    "compute_batch_loss_stats",
    "merge_batch_loss_stats",
    "make_global_batch_info",
    "compute_group_num_tokens",
    # KL
    "kl_penalty",
    "kl_penalty_forward",
    "compute_rewards",
    "FixedKLController",
    "AdaptiveKLController",
    "get_kl_controller",
    # losses
    "compute_policy_loss",
    "compute_policy_loss_vanilla",
    "compute_policy_loss_gspo",
    "compute_policy_loss_sapo",
    "compute_policy_loss_cispo",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_gpg",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_pg",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dro",
    "compute_policy_loss_up",
    "compute_policy_loss_bypass_mode",
    "PolicyLossFn",
    "compute_entropy_loss",
    "compute_value_loss",
    # advantages
    "normalize_by_config",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_process_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_norm_outcome_advantage",
    "compute_gdpo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_pf_ppo_reweight_data",
    "step_rewards_to_go",
    # GAE lambda
    "GAELambdaContext",
    "GAE_LAMBDA_FN_REGISTRY",
    "register_gae_lambda_fn",
    "resolve_gae_lambda",
    "vapo_length_adaptive",
    "relative_position",
    # rewards
    "compute_overlong_penalty",
]


# =============================================================================================
# Config access
# =============================================================================================


def _loss_knob(config: Any, key: str, default: Any) -> Any:
    """A policy-loss knob: `config.policy_loss.<key>` (actor config layout), else `config.<key>`
    (flat dict written by hand), else `default`."""
    sub = config_get(config, "policy_loss", None)
    value = config_get(sub, key, None)
    if value is None:
        value = config_get(config, key, None)
    return default if value is None else value


def _clip_params(config: Any) -> tuple[float, float, float]:
    """(clip_ratio_low, clip_ratio_high, clip_ratio_c) with the upstream fallbacks."""
    clip_ratio = float(config_get(config, "clip_ratio", 0.2))
    low = float(config_get(config, "clip_ratio_low", clip_ratio))
    high = float(config_get(config, "clip_ratio_high", clip_ratio))
    clip_c = float(config_get(config, "clip_ratio_c", 3.0))
    if not clip_c > 1.0:
        raise ValueError(f"clip_ratio_c={clip_c} must be > 1 (dual-clip lower bound, default 3.0)")
    return low, high, clip_c


# =============================================================================================
# Registries
# =============================================================================================


def _same_function(a: Callable, b: Callable) -> bool:
    # re-importing one user file (e.g. once by path in each process, or after a reload) creates a
    # new function object for the same definition: treat same module + qualified name as equal
    return a is b or (
        getattr(a, "__module__", None) == getattr(b, "__module__", None)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
    )


POLICY_LOSS_REGISTRY: dict[str, Callable] = {}

# type of a policy loss: (old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
# rollout_is_weights) -> (pg_loss, metrics)
PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, Any]]]


def _qualname(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register a policy-loss function under `name` (`policy_loss.loss_mode`).

    As upstream, a later registration under a taken name replaces the earlier one (so a user
    file can override a built-in loss); a warning names both functions. Registering the same
    definition again (a re-import) replaces it silently.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_policy_loss: name must be a non-empty string, got {name!r}")

    def decorator(fn: Callable) -> Callable:
        current = POLICY_LOSS_REGISTRY.get(name)
        if current is not None and not _same_function(current, fn):
            logger.warning("policy loss %r: %s replaces the registered %s", name, _qualname(fn), _qualname(current))
        POLICY_LOSS_REGISTRY[name] = fn
        return fn

    return decorator


def get_policy_loss_fn(name: str) -> Callable:
    """The policy loss registered as `name`; ValueError listing the registered names otherwise."""
    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(
            f"Unsupported loss mode: {name}. Supported modes are: {sorted(POLICY_LOSS_REGISTRY)}. "
            "Register your own with @register_policy_loss(name) in a module the trainer imports."
        )
    return POLICY_LOSS_REGISTRY[name]


def unpack_policy_loss_output(output: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """Normalise a policy-loss return value to `(pg_loss, metrics)`.

    Accepts the current form `(pg_loss, metrics_dict)` and the legacy upstream 4-tuple
    `(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)` so that older user losses keep working.
    Legacy tensor metrics are converted to python floats.
    """
    if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], Mapping):
        return output[0], dict(output[1])
    if isinstance(output, tuple) and len(output) == 4:
        pg_loss, clipfrac, ppo_kl, clipfrac_lower = output
        return pg_loss, {
            "actor/pg_clipfrac": _to_float(clipfrac),
            "actor/ppo_kl": _to_float(ppo_kl),
            "actor/pg_clipfrac_lower": _to_float(clipfrac_lower),
        }
    raise TypeError(
        "a policy loss must return (pg_loss, metrics: dict) or the legacy "
        f"(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower); got {type(output).__name__}"
        + (f" of length {len(output)}" if isinstance(output, tuple) else "")
    )


class AdvantageEstimator(str, Enum):
    """Names of the built-in advantage estimators (`algorithm.adv_estimator`). User estimators
    registered by string are equally valid; this enum only guards against typos in code."""

    GAE = "gae"
    GRPO = "grpo"
    GRPO_VECTORIZED = "grpo_vectorized"
    GRPO_PASSK = "grpo_passk"
    GRPO_PROCESS = "grpo_process"
    RLOO = "rloo"
    RLOO_VECTORIZED = "rloo_vectorized"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    OPO = "opo"
    GPG = "gpg"
    NORM = "norm"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"
    GDPO = "gdpo"


ADV_ESTIMATOR_REGISTRY: dict[str, Callable] = {}


@dataclass(frozen=True)
class AdvEstimatorTraits:
    """What an advantage estimator asks of the trainer, declared at registration.

    - `needs_groups`: the baseline comes from the other responses to the same prompt, so
      `actor_rollout_ref.rollout.n` must be >= 2 (checked by `validate_config`).
    - `needs_critic`: the estimator reads `values`; `need_critic(config)` turns the critic on.
    - `needs_greedy_baseline`: the trainer generates one greedy response per prompt and puts its
      reward in the batch as `reward_baselines` [B] (ReMax); sampling must be on.
    - `needs_old_log_probs`: the estimator reads `old_log_probs` on the driver, so the trainer never
      skips the old-log-prob pass.
    """

    needs_groups: bool = False
    needs_critic: bool = False
    needs_greedy_baseline: bool = False
    needs_old_log_probs: bool = False


# name -> traits, kept apart from ADV_ESTIMATOR_REGISTRY so that the registry's values stay the
# bare functions (upstream code and tests compare and rebind them)
ADV_ESTIMATOR_TRAITS: dict[str, AdvEstimatorTraits] = {}


def _enum_name(name_or_enum: str | Enum) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def register_adv_est(
    name_or_enum: str | AdvantageEstimator,
    *,
    needs_groups: bool = False,
    needs_critic: bool = False,
    needs_greedy_baseline: bool = False,
    needs_old_log_probs: bool = False,
) -> Callable[[Callable], Callable]:
    """Decorator: register an advantage estimator under a name or `AdvantageEstimator` member,
    with the traits the trainer checks and serves (see `AdvEstimatorTraits`; all False by default,
    which is how an upstream-style `@register_adv_est("mine")` behaves).

    As upstream, a different function under a taken name raises ValueError (estimators are not
    overridden by accident); the same definition again (a re-import) replaces it silently. The
    registry is looked up as a module global when the decorator runs, so code that rebinds
    `core_algos.ADV_ESTIMATOR_REGISTRY` registers into the new dict.
    """
    name = _enum_name(name_or_enum)
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_adv_est: name must be a non-empty string or enum, got {name_or_enum!r}")
    traits = AdvEstimatorTraits(
        needs_groups=bool(needs_groups),
        needs_critic=bool(needs_critic),
        needs_greedy_baseline=bool(needs_greedy_baseline),
        needs_old_log_probs=bool(needs_old_log_probs),
    )

    def decorator(fn: Callable) -> Callable:
        current = ADV_ESTIMATOR_REGISTRY.get(name)
        if current is not None and not _same_function(current, fn):
            raise ValueError(
                f"Adv estimator {name} has already been registered: {_qualname(current)} vs {_qualname(fn)}"
            )
        ADV_ESTIMATOR_REGISTRY[name] = fn
        ADV_ESTIMATOR_TRAITS[name] = traits
        return fn

    return decorator


def get_adv_estimator_traits(name_or_enum: str | AdvantageEstimator) -> AdvEstimatorTraits:
    """The traits declared for the estimator; all False for a name registered without traits
    (or put into `ADV_ESTIMATOR_REGISTRY` by hand)."""
    return ADV_ESTIMATOR_TRAITS.get(_enum_name(name_or_enum), AdvEstimatorTraits())


def adv_estimators_with(trait: str) -> frozenset[str]:
    """Names of the registered estimators that declare `trait` (a field of `AdvEstimatorTraits`)."""
    if trait not in AdvEstimatorTraits.__dataclass_fields__:
        raise ValueError(f"unknown estimator trait {trait!r}; known: {list(AdvEstimatorTraits.__dataclass_fields__)}")
    return frozenset(n for n in ADV_ESTIMATOR_REGISTRY if getattr(get_adv_estimator_traits(n), trait))


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> Callable:
    """The estimator registered under the name; ValueError listing the registered ones otherwise."""
    name = _enum_name(name_or_enum)
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(
            f"Unknown advantage estimator simply: {name}. Registered estimators: {sorted(ADV_ESTIMATOR_REGISTRY)}. "
            "Register your own with @register_adv_est(name) in a module the trainer imports."
        )
    return ADV_ESTIMATOR_REGISTRY[name]


def _to_float(value: Any) -> float:
    if torch.is_tensor(value):
        return float(value.detach().float().item())
    return float(value)


# =============================================================================================
# KL estimators and controllers
# =============================================================================================

_KL_BASE = {
    "kl": "k1",
    "k1": "k1",
    "abs": "abs",
    "mse": "k2",
    "k2": "k2",
    "low_var_kl": "k3",
    "k3": "k3",
    "full": "full",
}
KL_PENALTY_TYPES = tuple(_KL_BASE) + tuple(f"{k}+" for k in _KL_BASE if k != "full")


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Value (and natural gradient) of a per-token KL estimator, with `l = logprob - ref_logprob`.

    - `kl`/`k1`: l (unbiased, can be negative)
    - `abs`: |l|
    - `mse`/`k2`: l^2 / 2 (biased, low variance)
    - `low_var_kl`/`k3`: exp(-l) - 1 + l (unbiased, >= 0); l clamped to [-20, 20] and the result to
      [-10, 10] for numerical safety
    - `full`: exact KL over the vocabulary; `logprob` and `ref_logprob` are then [B, L, V]
      log-distributions and the result is sum_v p (log p - log q).
    Returns [B, L].
    """
    kind = _KL_BASE.get(kl_penalty)
    if kind is None:
        raise ValueError(f"kl_penalty={kl_penalty!r} is not supported; expected one of {list(KL_PENALTY_TYPES)}")
    if kind == "full":
        if logprob.dim() != 3 or ref_logprob.shape != logprob.shape:
            raise ValueError(
                "kl_penalty='full' needs full log-distributions [B, L, V] for both policies; got "
                f"{tuple(logprob.shape)} and {tuple(ref_logprob.shape)}"
            )
        return (logprob.exp() * (logprob - ref_logprob)).sum(dim=-1)
    diff = logprob - ref_logprob
    if kind == "k1":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "k2":
        return 0.5 * diff.square()
    # k3: with r = log(q/p) = -diff: e^r - r - 1
    neg = torch.clamp(-diff, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(neg) - neg - 1.0, min=-10.0, max=10.0)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate [B, L] (see `kl_penalty_forward` for the estimators).

    A trailing `+` (e.g. `low_var_kl+`) gives the straight-through variant: the value of the named
    estimator with the gradient of k2 (`l`, the unbiased gradient of KL), computed as
    `k2 + sg(value - k2)`.
    """
    if isinstance(kl_penalty, str) and kl_penalty.endswith("+"):
        base = kl_penalty[:-1]
        if _KL_BASE.get(base) in (None, "full"):
            raise ValueError(f"kl_penalty={kl_penalty!r} is not supported; expected one of {list(KL_PENALTY_TYPES)}")
        value = kl_penalty_forward(logprob, ref_logprob, base)
        k2 = kl_penalty_forward(logprob, ref_logprob, "k2")
        return k2 + (value - k2).detach()
    return kl_penalty_forward(logprob, ref_logprob, kl_penalty)


def compute_rewards(token_level_scores, old_log_prob, ref_log_prob, kl_ratio):
    """Upstream helper: `scores - kl_ratio * (old_log_prob - ref_log_prob)` (k1 KL in reward)."""
    return token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio


class FixedKLController:
    """Constant KL coefficient `value` (`algorithm.kl_ctrl.type=fixed`)."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (the coefficient is fixed)."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019).

    After each step: `e = clip(current_kl / target_kl - 1, -0.2, 0.2)`,
    `value *= 1 + e * n_steps / horizon`.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if not target_kl > 0:
            raise ValueError(f"AdaptiveKLController: target_kl={target_kl} must be > 0")
        if not horizon > 0:
            raise ValueError(f"AdaptiveKLController: horizon={horizon} must be > 0")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = float(np.clip(float(current_kl) / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + error * float(n_steps) / self.horizon


def get_kl_controller(kl_ctrl: Any):
    """Build the controller described by `algorithm.kl_ctrl` (dataclass, dict or DictConfig)."""
    kind = config_get(kl_ctrl, "type", "fixed")
    coef = config_get(kl_ctrl, "kl_coef", 0.001)
    if kind == "fixed":
        return FixedKLController(kl_coef=coef)
    if kind == "adaptive":
        return AdaptiveKLController(
            init_kl_coef=coef,
            target_kl=config_get(kl_ctrl, "target_kl", 0.1),
            horizon=config_get(kl_ctrl, "horizon", 10000),
        )
    raise ValueError(f"algorithm.kl_ctrl.type={kind!r} is not supported; expected one of ['fixed', 'adaptive']")


# =============================================================================================
# Loss aggregation and exact micro-batching
# =============================================================================================

LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "prompt-mean",
)
GLOBAL_BATCH_INFO_KEYS = (
    "dp_size",
    "batch_num_tokens",
    "global_batch_size",
    "loss_scale_factor",
    "group_num_tokens",
    "global_num_groups",
)
# values written outside any `global_batch_info` context (upstream-style code that fills
# `config.global_batch_info[...]` itself); every context starts from them
_BASE_GLOBAL_BATCH_INFO: dict = {}
_GLOBAL_BATCH_INFO: contextvars.ContextVar[dict] = contextvars.ContextVar(
    "verl_global_batch_info", default=_BASE_GLOBAL_BATCH_INFO
)


@contextlib.contextmanager
def global_batch_info(**info: Any) -> Iterator[dict]:
    """Context in which `agg_loss` calls without explicit global kwargs use these values.

    Keys (all optional; see `agg_loss` for their meaning): `dp_size`, `batch_num_tokens`,
    `global_batch_size`, `loss_scale_factor`, `group_num_tokens` ([b] for the rows of the current
    micro-batch), `global_num_groups`. Contexts nest: an inner context overrides the keys it sets
    (a value of None removes the key). This is how upstream-style user losses that call
    `agg_loss(loss_mat, mask, loss_agg_mode)` become micro-batch exact without changes.

    Actor recipe (per mini-batch, then per micro-batch)::

        local = compute_batch_loss_stats(mini_batch_mask, mini_batch_uid)
        stats = merge_batch_loss_stats(all_gather_object(local))   # [local] when dp_size == 1
        for mb in micro_batches:
            info = make_global_batch_info(stats, index=mb_uid, dp_size=dp, loss_scale_factor=L_max)
            with global_batch_info(**info):
                pg_loss, metrics = policy_loss_fn(...)        # and entropy / KL agg_loss terms
            loss.backward()                                   # no 1/n_micro scaling
    """
    unknown = sorted(set(info) - set(GLOBAL_BATCH_INFO_KEYS))
    if unknown:
        raise ValueError(f"global_batch_info: unknown key(s) {unknown}; accepted: {list(GLOBAL_BATCH_INFO_KEYS)}")
    merged = dict(_GLOBAL_BATCH_INFO.get())
    for key, value in info.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    token = _GLOBAL_BATCH_INFO.set(merged)
    try:
        yield merged
    finally:
        _GLOBAL_BATCH_INFO.reset(token)


def get_global_batch_info() -> dict:
    """A copy of the values of the innermost active `global_batch_info` context (outside any
    context: the values written through `global_batch_info_view()`, usually {})."""
    return dict(_GLOBAL_BATCH_INFO.get())


class GlobalBatchInfoView(MutableMapping):
    """Live, writable view of the active global batch info (what `ActorConfig.global_batch_info`
    returns).

    Upstream's actor writes the denominators into `config.global_batch_info[...]` before calling
    a loss, and upstream losses call `agg_loss(..., **config.global_batch_info)`. Through this view
    such writes land in the innermost active `global_batch_info(...)` context (for the rest of that
    context), or, outside any context, in the process-wide base values that every later context
    and every `agg_loss` call starts from, so the normalisation follows what the code wrote.
    Keys are checked against `GLOBAL_BATCH_INFO_KEYS`; assigning None removes a key.
    """

    def _target(self) -> dict:
        return _GLOBAL_BATCH_INFO.get()

    def __getitem__(self, key: str) -> Any:
        return self._target()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in GLOBAL_BATCH_INFO_KEYS:
            raise KeyError(f"global_batch_info: unknown key {key!r}; accepted: {list(GLOBAL_BATCH_INFO_KEYS)}")
        if value is None:
            self._target().pop(key, None)
        else:
            self._target()[key] = value

    def __delitem__(self, key: str) -> None:
        del self._target()[key]

    def __iter__(self):
        return iter(dict(self._target()))

    def __len__(self) -> int:
        return len(self._target())

    def __repr__(self) -> str:
        return f"GlobalBatchInfoView({dict(self._target())!r})"


def global_batch_info_view() -> GlobalBatchInfoView:
    """The live view described in `GlobalBatchInfoView`."""
    return GlobalBatchInfoView()


@dataclass
class BatchLossStats:
    """Denominators of the loss aggregation for one mini-batch (summed over data-parallel ranks
    with `merge_batch_loss_stats`).

    num_tokens: valid tokens (mask sum).
    num_seqs: sequences with at least one valid token.
    group_num_tokens: prompt id -> valid tokens of that group (empty when no index was given).
    """

    num_tokens: int = 0
    num_seqs: int = 0
    group_num_tokens: dict = field(default_factory=dict)

    @property
    def num_groups(self) -> int:
        """Groups with at least one valid token (empty groups do not count in prompt-mean)."""
        return sum(1 for n in self.group_num_tokens.values() if n > 0)


def compute_batch_loss_stats(
    response_mask: torch.Tensor, index: Sequence[Hashable] | np.ndarray | None = None
) -> BatchLossStats:
    """Local aggregation denominators of a (mini-)batch.

    Args:
        response_mask: [B, L] loss mask (after any rollout-correction rejection).
        index: [B] prompt ids (uid); needed only for `prompt-mean`.
    """
    row_tokens = response_mask.to(torch.int64).sum(dim=-1).tolist()
    groups: dict = {}
    if index is not None:
        if len(index) != len(row_tokens):
            raise ValueError(f"compute_batch_loss_stats: index has {len(index)} entries for {len(row_tokens)} rows")
        for uid, n in zip(index, row_tokens, strict=False):
            groups[uid] = groups.get(uid, 0) + int(n)
    return BatchLossStats(
        num_tokens=int(sum(row_tokens)), num_seqs=sum(1 for n in row_tokens if n > 0), group_num_tokens=groups
    )


def merge_batch_loss_stats(stats: Sequence[BatchLossStats]) -> BatchLossStats:
    """Sum the stats of several ranks (`torch.distributed.all_gather_object` output). Groups that
    straddle ranks are merged by prompt id, so each group is counted once."""
    merged = BatchLossStats()
    for item in stats:
        merged.num_tokens += item.num_tokens
        merged.num_seqs += item.num_seqs
        for uid, n in item.group_num_tokens.items():
            merged.group_num_tokens[uid] = merged.group_num_tokens.get(uid, 0) + n
    return merged


def make_global_batch_info(
    stats: BatchLossStats,
    index: Sequence[Hashable] | np.ndarray | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
    device: torch.device | str | None = None,
) -> dict:
    """kwargs for `global_batch_info(...)` / `agg_loss(...)` for one micro-batch.

    Args:
        stats: mini-batch stats over all data-parallel ranks.
        index: prompt ids of the micro-batch rows ([b]); adds `group_num_tokens` ([b] float tensor)
            and `global_num_groups` for `prompt-mean`.
        dp_size: number of data-parallel ranks whose gradients FSDP averages.
        loss_scale_factor: constant divisor of `seq-mean-token-sum-norm` (the response length limit).
    """
    info: dict = {
        "dp_size": int(dp_size),
        "batch_num_tokens": stats.num_tokens,
        "global_batch_size": stats.num_seqs,
    }
    if loss_scale_factor is not None:
        info["loss_scale_factor"] = float(loss_scale_factor)
    if index is not None:
        missing = [uid for uid in index if uid not in stats.group_num_tokens]
        if missing:
            raise ValueError(f"make_global_batch_info: prompt ids {missing[:5]} are not in the mini-batch stats")
        info["group_num_tokens"] = torch.tensor(
            [float(stats.group_num_tokens[uid]) for uid in index], dtype=torch.float32, device=device
        )
        info["global_num_groups"] = stats.num_groups
    return info


def compute_group_num_tokens(response_mask: torch.Tensor, index: Sequence[Hashable] | np.ndarray) -> torch.Tensor:
    """[B] valid-token count of each row's group (the `prompt-mean` denominator D_g), float."""
    stats = compute_batch_loss_stats(response_mask, index)
    return torch.tensor(
        [float(stats.group_num_tokens[uid]) for uid in index], dtype=torch.float32, device=response_mask.device
    )


def _clamp_count(count: Any, like: torch.Tensor) -> torch.Tensor | float:
    if torch.is_tensor(count):
        return count.to(like.dtype).clamp(min=1)
    return float(max(count, 1))


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
    group_num_tokens: torch.Tensor | None = None,
    global_num_groups: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss matrix into a scalar.

    Modes (l = loss_mat, m = loss_mask, n_i = valid tokens of row i, B = rows with n_i > 0):
    - `token-mean`: sum(l*m) / sum(m)
    - `token-sum`: sum(l*m) (no normalisation; times `dp_size` so FSDP's gradient mean over
      ranks gives the sum over all ranks' tokens)
    - `seq-mean-token-sum`: sum_i sum_t l*m / B
    - `seq-mean-token-mean`: sum_i (sum_t l*m / n_i) / B
    - `seq-mean-token-sum-norm` (Dr.GRPO): sum(l*m) / (B * loss_scale_factor); the factor should be
      a constant (the response length limit); it defaults to the padded width `L` when not given
    - `prompt-mean`: mean over prompt groups g of (sum over the group's tokens / D_g), D_g = valid
      tokens of group g; needs `group_num_tokens` (row-aligned D_g)

    Exact micro-batching: when the mini-batch-global denominators are given (`batch_num_tokens`,
    `global_batch_size` = B, `global_num_groups` = number of non-empty groups, row-aligned
    `group_num_tokens`; all over every data-parallel rank) the result is this micro-batch's share of
    the mini-batch loss times `dp_size` (FSDP averages gradients over ranks), so summing the
    micro-batch losses gives exactly the full mini-batch loss and gradient. When none of
    `dp_size`/`batch_num_tokens`/`global_batch_size`/`group_num_tokens`/`global_num_groups` is
    passed, the values of the active `global_batch_info` context are used (if any); outside a
    context the plain full-batch value of the given tensors is returned. `loss_scale_factor` falls
    back to the context independently. Empty rows/masks give 0, never NaN.

    Args:
        loss_mat: [b, L] per-token loss.
        loss_mask: [b, L] 0/1 mask.
    Returns:
        0-d tensor.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"Invalid loss_agg_mode {loss_agg_mode!r}; expected one of {list(LOSS_AGG_MODES)}")
    ctx = _GLOBAL_BATCH_INFO.get()
    explicit = dp_size != 1 or any(
        v is not None for v in (batch_num_tokens, global_batch_size, group_num_tokens, global_num_groups)
    )
    if not explicit and ctx:
        dp_size = ctx.get("dp_size", 1)
        batch_num_tokens = ctx.get("batch_num_tokens")
        global_batch_size = ctx.get("global_batch_size")
        group_num_tokens = ctx.get("group_num_tokens")
        global_num_groups = ctx.get("global_num_groups")
    if loss_scale_factor is None:
        loss_scale_factor = ctx.get("loss_scale_factor")

    mask = loss_mask.bool()
    selected = torch.where(mask, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))
    row_tokens = mask.sum(dim=-1)
    row_sums = selected.sum(dim=-1)

    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("agg_loss(token-mean): batch_num_tokens (global) is required when dp_size > 1")
            batch_num_tokens = row_tokens.sum()
        return selected.sum() / _clamp_count(batch_num_tokens, loss_mat) * dp_size

    if loss_agg_mode == "token-sum":
        return selected.sum() * dp_size

    if loss_agg_mode == "prompt-mean":
        if group_num_tokens is None:
            raise ValueError(
                "agg_loss(prompt-mean) needs the group token counts: pass group_num_tokens (row-aligned [b]) "
                "and global_num_groups, or run inside `with global_batch_info(**make_global_batch_info(...))`"
            )
        group_tokens = torch.as_tensor(group_num_tokens, device=loss_mat.device).to(loss_mat.dtype).clamp(min=1)
        if group_tokens.shape != row_sums.shape:
            raise ValueError(
                f"agg_loss(prompt-mean): group_num_tokens shape {tuple(group_tokens.shape)} != rows "
                f"{tuple(row_sums.shape)}"
            )
        if global_num_groups is None:
            if dp_size > 1:
                raise ValueError("agg_loss(prompt-mean): global_num_groups is required when dp_size > 1")
            # for a complete batch, sum_i n_i / D_g(i) counts each non-empty group exactly once
            global_num_groups = torch.round((row_tokens.to(loss_mat.dtype) / group_tokens).sum())
        return (row_sums / group_tokens).sum() / _clamp_count(global_num_groups, loss_mat) * dp_size

    # sequence-level modes
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError(f"agg_loss({loss_agg_mode}): global_batch_size is required when dp_size > 1")
        global_batch_size = (row_tokens > 0).sum()
    if loss_agg_mode == "seq-mean-token-mean":
        row_sums = row_sums / row_tokens.to(loss_mat.dtype).clamp(min=1)
    loss = row_sums.sum() / _clamp_count(global_batch_size, loss_mat) * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        if loss_scale_factor is None:
            loss_scale_factor = loss_mask.shape[-1]
        if not float(loss_scale_factor) > 0:
            raise ValueError(f"agg_loss: loss_scale_factor={loss_scale_factor} must be > 0")
        loss = loss / float(loss_scale_factor)
    return loss


# =============================================================================================
# Policy losses
# =============================================================================================


def _finish(
    pg_losses: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """Apply rollout IS weights (detached) to the per-token loss, then aggregate."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * _valid_only(rollout_is_weights.detach(), response_mask)
    return agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor=config_get(config, "loss_scale_factor"))


def _metrics(clipfrac: Any, ppo_kl: Any, clipfrac_lower: Any, **extra: Any) -> dict[str, float]:
    out = {
        "actor/pg_clipfrac": _to_float(clipfrac),
        "actor/ppo_kl": _to_float(ppo_kl),
        "actor/pg_clipfrac_lower": _to_float(clipfrac_lower),
    }
    out.update({k: _to_float(v) for k, v in extra.items()})
    return out


def _valid_only(coef: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """A detached per-token coefficient with 0 on masked positions: a NaN there would otherwise
    turn the (zero) upstream gradient into NaN through the product rule."""
    return torch.where(response_mask.bool(), coef, torch.zeros((), dtype=coef.dtype, device=coef.device))


def _clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    # exp of a log-ratio beyond +-20 is numerically meaningless; keep it finite
    return torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped objective with asymmetric bounds and dual clip.

    Per token, with ratio = exp(log_prob - old_log_prob):
    `l = max(-A*ratio, -A*clip(ratio, 1-clip_ratio_low, 1+clip_ratio_high))`, and for A < 0 the
    dual clip `l = min(l, -A*clip_ratio_c)` bounds the loss when the ratio explodes.

    Args (all [B, L]): old_log_prob, log_prob (requires grad), advantages, response_mask.
        config: actor config (`clip_ratio`, `clip_ratio_low`, `clip_ratio_high`, `clip_ratio_c`,
        `loss_scale_factor`) as a dataclass or a dict.
        rollout_is_weights: [B, L] detached weights multiplying the per-token loss, or None.
    Returns:
        pg_loss (0-d tensor) and metrics as python floats: `actor/pg_clipfrac` (share of tokens on
        the clipped branch), `actor/ppo_kl` (masked mean of old_log_prob - log_prob),
        `actor/pg_clipfrac_lower` (share on the dual-clip branch).
    """
    low, high, clip_c = _clip_params(config)
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)

    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    clipped_losses = torch.maximum(losses1, losses2)
    clipfrac = verl_F.masked_mean((losses2 > losses1).float(), response_mask)

    losses3 = -advantages * clip_c
    dual_clipped = torch.minimum(losses3, clipped_losses)
    clipfrac_lower = verl_F.masked_mean(((clipped_losses > losses3) & (advantages < 0)).float(), response_mask)

    pg_losses = torch.where(advantages < 0, dual_clipped, clipped_losses)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(clipfrac, ppo_kl, clipfrac_lower)


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: sequence-level importance ratio, clipped like PPO.

    s_i = exp(masked_mean_t(log_prob - old_log_prob)); token form
    `s_it = sg(s_i) * exp(log_prob - sg(log_prob))` (value s_i; gradient of s_i spread over the
    tokens), so with per-sequence advantages and `seq-mean-token-mean` aggregation the gradient
    equals the sequence-level objective. The passed `loss_agg_mode` is honoured (the GSPO preset
    sets `seq-mean-token-mean`). Shapes and metrics as `compute_policy_loss_vanilla`
    (`actor/pg_clipfrac_lower` is 0: no dual clip).
    """
    low, high, _ = _clip_params(config)
    log_ratio = log_prob - old_log_prob
    seq_len = response_mask.to(log_prob.dtype).sum(dim=-1).clamp(min=1)
    seq_log_ratio = verl_F.masked_sum(log_ratio, response_mask, axis=-1) / seq_len
    log_s = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    log_s = torch.clamp(log_s, max=10.0)  # a sequence ratio above e^10 is no longer informative
    s = torch.exp(log_s)

    losses1 = -advantages * s
    losses2 = -advantages * torch.clamp(s, 1.0 - low, 1.0 + high)
    pg_losses = torch.maximum(losses1, losses2)
    clipfrac = verl_F.masked_mean((losses2 > losses1).float(), response_mask)
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(clipfrac, ppo_kl, 0.0)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO: a soft sigmoid gate replaces the hard clip.

    `gate = sigmoid(tau * (ratio - 1)) * 4 / tau`, tau = `policy_loss.tau_pos` (default 1.0) where
    A > 0 else `policy_loss.tau_neg` (1.05); per-token loss `-gate * A`. At ratio 1 the gate is
    2/tau with slope exactly 1 (same gradient as the unclipped objective on-policy).
    As upstream (and the SAPO paper), the loss is always aggregated `seq-mean-token-mean`; the
    `loss_agg_mode` argument is accepted and ignored.
    Metrics: `actor/pg_clipfrac` and `actor/pg_clipfrac_lower` are 0 (nothing is clipped);
    `actor/sapo_gate_mean` is the masked mean gate.
    """
    tau_pos = float(_loss_knob(config, "tau_pos", 1.0))
    tau_neg = float(_loss_knob(config, "tau_neg", 1.05))
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"sapo: tau_pos={tau_pos} and tau_neg={tau_neg} must be > 0")
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    pg_losses = -gate * advantages
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)
    pg_loss = _finish(pg_losses, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    return pg_loss, _metrics(
        0.0, ppo_kl, 0.0, **{"actor/sapo_gate_mean": verl_F.masked_mean(gate.detach(), response_mask)}
    )


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: REINFORCE with a clipped, stop-gradient importance weight.

    Per token `-sg(clip(ratio, 1-clip_ratio_low, 1+clip_ratio_high)) * A * log_prob`: the gradient
    flows only through `log_prob`; every token keeps a gradient. `actor/pg_clipfrac` is the share
    of tokens whose weight was truncated.
    """
    low, high, _ = _clip_params(config)
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob).detach()
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1.0 - low, 1.0 + high)
    pg_losses = -_valid_only(weight * advantages, response_mask) * log_prob
    clipfrac = verl_F.masked_mean((weight != ratio).float(), response_mask)
    ppo_kl = verl_F.masked_mean(-log_ratio, response_mask)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(clipfrac, ppo_kl, 0.0)


@register_policy_loss("reinforce")
@register_policy_loss("pg")
def compute_policy_loss_pg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE / vanilla policy gradient as a registered loss (`loss_mode=reinforce` or `pg`):
    per token `-A * log_prob`; with `policy_loss.pg_use_ratio=True` multiplied by the
    stop-gradient ratio (off-policy correction). Shapes as `compute_policy_loss_vanilla`."""
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob).detach()
    coef = advantages
    if bool(_loss_knob(config, "pg_use_ratio", False)):
        coef = coef * torch.exp(log_ratio)
    pg_losses = -_valid_only(coef, response_mask) * log_prob
    ppo_kl = verl_F.masked_mean(-log_ratio, response_mask)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(0.0, ppo_kl, 0.0)


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE with optional IS correction (upstream's direct function; used by `bypass_mode`
    with `loss_type=reinforce`).

    Per token `-A * log_prob * w`, w = `rollout_is_weights` (detached; 1 when None). No ratio,
    no clip. Args ([B, L]): rollout_log_prob (the behaviour policy, only for the metric),
    log_prob (requires grad), advantages, response_mask (after any rejection).
    Returns pg_loss and `{"actor/ppo_kl": masked mean of rollout_log_prob - log_prob}`.
    """
    coef = advantages
    if rollout_is_weights is not None:
        coef = coef * rollout_is_weights.detach()
    pg_losses = -_valid_only(coef, response_mask) * log_prob
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, None)
    kl = verl_F.masked_mean((rollout_log_prob - log_prob).detach(), response_mask)
    return pg_loss, {"actor/ppo_kl": _to_float(kl)}


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG (group policy gradient): per token `-A * log_prob`, no ratio, no clip (pair it with the
    `gpg` advantage estimator)."""
    pg_losses = -_valid_only(advantages, response_mask) * log_prob
    ppo_kl = verl_F.masked_mean((old_log_prob - log_prob).detach(), response_mask)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(0.0, ppo_kl, 0.0)


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (entropy mechanism of RL): PPO clip, plus the gradient of a random subset of
    high-covariance tokens is removed.

    cov_t = (A_t - mean A) * (log_prob_t - mean log_prob) over the valid tokens of this call.
    Among valid tokens not already clipped with `clip_cov_lb < cov < clip_cov_ub`, a random
    `max(1, clip_cov_ratio * n_valid)` get a zero loss. Selection uses the tokens of one call
    (micro-batch), as upstream. `actor/pg_clipfrac` = share of tokens removed this way.
    """
    low, high, _ = _clip_params(config)
    cov_ratio = float(_loss_knob(config, "clip_cov_ratio", 0.0002))
    cov_lb = float(_loss_knob(config, "clip_cov_lb", 1.0))
    cov_ub = float(_loss_knob(config, "clip_cov_ub", 5.0))
    if not cov_ratio > 0:
        raise ValueError(f"clip_cov: policy_loss.clip_cov_ratio={cov_ratio} must be > 0")

    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    valid = response_mask.bool()
    clipped = (losses2 > losses1) & valid

    with torch.no_grad():
        adv_c = advantages - verl_F.masked_mean(advantages, response_mask)
        logp_c = log_prob.detach() - verl_F.masked_mean(log_prob.detach(), response_mask)
        cov = adv_c * logp_c
        candidates = valid & ~clipped & (cov > cov_lb) & (cov < cov_ub)
        cand_idx = torch.nonzero(candidates)
        n_clip = max(int(cov_ratio * int(valid.sum())), 1)
        keep = torch.ones_like(ratio)
        if len(cand_idx) > 0:
            chosen = cand_idx[torch.randperm(len(cand_idx), device=cand_idx.device)[:n_clip]]
            keep[chosen[:, 0], chosen[:, 1]] = 0.0

    pg_losses = torch.maximum(losses1, losses2) * keep
    clipfrac = verl_F.masked_mean((keep == 0).float(), response_mask)
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _metrics(clipfrac, ppo_kl, 0.0)


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov: unclipped `-A * ratio`, plus `ppo_kl_coef * |log ratio|` on the top
    `max(1, kl_cov_ratio * n_valid)` valid tokens by covariance (A - mean A)(log_prob - mean).
    Metrics: `actor/ppo_kl` = `actor/ppo_kl_abs` = masked mean |log ratio| (upstream's definition
    for this loss)."""
    kl_cov_ratio = float(_loss_knob(config, "kl_cov_ratio", 0.0002))
    kl_coef = float(_loss_knob(config, "ppo_kl_coef", 0.1))
    if not kl_cov_ratio > 0:
        raise ValueError(f"kl_cov: policy_loss.kl_cov_ratio={kl_cov_ratio} must be > 0")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    losses = -advantages * ratio
    losses_kl = losses + kl_coef * log_ratio.abs()
    valid = response_mask.bool()
    with torch.no_grad():
        adv_c = advantages - verl_F.masked_mean(advantages, response_mask)
        logp_c = log_prob.detach() - verl_F.masked_mean(log_prob.detach(), response_mask)
        cov = torch.where(valid, adv_c * logp_c, torch.full_like(ratio, -float("inf")))
        n_valid = int(valid.sum())
        selected = torch.zeros_like(valid)
        if n_valid > 0:
            k = max(1, int(n_valid * kl_cov_ratio))
            top = torch.topk(cov.reshape(-1), k).indices
            selected.view(-1)[top] = True
    pg_losses = torch.where(selected, losses_kl, losses)
    ppo_kl_abs = verl_F.masked_mean(log_ratio.detach().abs(), response_mask)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    # upstream reports the mean |log ratio| as actor/ppo_kl for this loss (the quantity it penalises)
    return pg_loss, _metrics(0.0, ppo_kl_abs, 0.0, **{"actor/ppo_kl_abs": ppo_kl_abs})


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO (geometric-mean policy optimisation): a sequence objective with token-level clipping.

    Per token the log-ratio is clipped to [-clip_ratio_low, clip_ratio_high] pessimistically
    (`sgn(A) * min(sgn(A) * lr, sgn(A) * clip(lr))`); the sequence ratio is the exp of its masked
    mean; loss_i = -mean_t(A) * ratio_i, averaged over non-empty sequences. The objective is
    sequence-level by construction, so `loss_agg_mode` is not used (sequence mean, micro-batch
    exact through `global_batch_size`). Rollout IS weights multiply each sequence loss by their
    geometric mean over the sequence, `exp(mean_t log(w_t + 1e-10))`. `actor/pg_clipfrac` / `_lower`:
    clipped tokens with A > 0 / A < 0.
    """
    del loss_agg_mode
    low, high, _ = _clip_params(config)
    log_ratio = log_prob - old_log_prob
    sgn = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -low, high)
    pessimistic = sgn * torch.minimum(sgn * log_ratio, sgn * clamped)
    seq_len = response_mask.to(log_prob.dtype).sum(dim=-1).clamp(min=1)
    seq_ratio = torch.exp(verl_F.masked_sum(pessimistic, response_mask, axis=-1) / seq_len)
    seq_adv = verl_F.masked_sum(advantages, response_mask, axis=-1) / seq_len
    seq_loss = -seq_adv * seq_ratio
    if rollout_is_weights is not None:
        # geometric mean of the token weights, consistent with the geometric-mean ratio (upstream);
        # the 1e-10 keeps a zero (rejected) weight finite in log space
        log_w = torch.log(rollout_is_weights.detach().to(log_prob.dtype) + 1e-10)
        seq_loss = seq_loss * torch.exp(verl_F.masked_sum(log_w, response_mask, axis=-1) / seq_len)
    # spread each sequence loss evenly over its tokens so agg_loss can take the (global) seq mean
    loss_mat = (seq_loss / seq_len).unsqueeze(-1).expand_as(log_prob)
    pg_loss = agg_loss(loss_mat, response_mask, "seq-mean-token-sum")
    clipped = log_ratio.detach() != clamped.detach()
    clipfrac = verl_F.masked_mean((clipped & (advantages > 0)).float(), response_mask)
    clipfrac_lower = verl_F.masked_mean((clipped & (advantages < 0)).float(), response_mask)
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)
    return pg_loss, _metrics(clipfrac, ppo_kl, clipfrac_lower)


def _dppo_setup(old_log_prob, log_prob, config):
    # the clip ratios are divergence thresholds here (TV or binary KL), not ratio bounds
    base = float(config_get(config, "clip_ratio", 0.2))
    low = config_get(config, "clip_ratio_low", None)
    high = config_get(config, "clip_ratio_high", None)
    low = base if low is None else float(low)
    high = base if high is None else float(high)
    trunc = float(config_get(config, "clip_ratio_c", 20.0))
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    return low, high, trunc, log_ratio, ratio


def _dppo_finish(
    valid, ratio, log_ratio, trunc, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
):
    valid = valid.detach().to(log_prob.dtype)
    weight = torch.clamp(ratio, max=trunc).detach() * valid
    pg_losses = -_valid_only(weight * advantages, response_mask) * log_prob
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    clipfrac = verl_F.masked_mean(1.0 - valid, response_mask)
    clipfrac_lower = verl_F.masked_mean((ratio.detach() > trunc).to(valid.dtype) * valid, response_mask)
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)
    return pg_loss, _metrics(clipfrac, ppo_kl, clipfrac_lower)


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-TV: trust region by the change of the token probability instead of the ratio.

    With p = exp(log_prob), p_old = exp(old_log_prob): a token keeps its gradient if
    `p - p_old <= clip_ratio_high` (A > 0) or `p - p_old >= -clip_ratio_low` (A <= 0); loss per
    kept token `-A * sg(min(ratio, clip_ratio_c)) * log_prob` (truncated IS, default
    clip_ratio_c 20 when the config has none). `actor/pg_clipfrac`: tokens outside the region;
    `actor/pg_clipfrac_lower`: kept tokens whose ratio was truncated. Shapes as vanilla.
    """
    low, high, trunc, log_ratio, ratio = _dppo_setup(old_log_prob, log_prob, config)
    delta = (torch.exp(log_prob) - torch.exp(old_log_prob)).detach()
    valid = torch.where(advantages > 0, delta <= high, delta >= -low)
    return _dppo_finish(
        valid, ratio, log_ratio, trunc, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-KL: as `dppo_tv` with the Bernoulli KL of the token probability,
    `KL_b = p_old log(p_old/p) + (1-p_old) log((1-p_old+1e-8)/(1-p+1e-8))`. A token keeps its
    gradient if `KL_b <= clip_ratio_high` or p <= p_old (A > 0), `KL_b <= clip_ratio_low` or
    p >= p_old (A <= 0). Loss and metrics as `dppo_tv`."""
    low, high, trunc, log_ratio, ratio = _dppo_setup(old_log_prob, log_prob, config)
    lp = log_prob.detach()
    p, p_old = torch.exp(lp), torch.exp(old_log_prob)
    kl_b = p_old * (old_log_prob - lp) + (1.0 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    valid = torch.where(advantages > 0, (kl_b <= high) | (p <= p_old), (kl_b <= low) | (p >= p_old))
    return _dppo_finish(
        valid, ratio, log_ratio, trunc, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DRO (direct reward optimisation): a quadratic proximal penalty instead of a clip.

    Per token `-(A * log_prob - beta/2 * (log_prob - old_log_prob)^2)`, beta =
    `policy_loss.dro_beta` (default 0.1, must be > 0). The log-ratio of the penalty is not
    clamped. `actor/pg_clipfrac*` are 0.
    """
    beta = float(_loss_knob(config, "dro_beta", 0.1))
    if not beta > 0:
        raise ValueError(f"dro: policy_loss.dro_beta={beta} must be > 0")
    log_ratio = log_prob - old_log_prob
    pg_losses = (
        -(_valid_only(advantages, response_mask) * log_prob)
        + 0.5
        * beta
        * torch.where(
            response_mask.bool(), log_ratio, torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
        ).square()
    )
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)
    return pg_loss, _metrics(0.0, ppo_kl, 0.0)


@register_policy_loss("up")
def compute_policy_loss_up(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """UP (unbounded positive): tokens with A > 0 use the unclipped self-anchored REINFORCE term
    `-A * exp(log_prob - sg(log_prob))` (value -A, gradient -A grad log_prob); tokens with A <= 0
    use the vanilla PPO clip with dual clip. `actor/pg_clipfrac` counts clipped tokens among the
    A <= 0 tokens; `actor/pg_clipfrac_lower` the dual-clip branch."""
    low, high, clip_c = _clip_params(config)
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    clipped = torch.maximum(losses1, losses2)
    losses3 = -advantages * clip_c
    neg = torch.where(advantages < 0, torch.minimum(losses3, clipped), clipped)
    pos = -advantages * torch.exp(log_prob - log_prob.detach())
    pg_losses = torch.where(advantages > 0, pos, neg)
    pg_loss = _finish(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    neg_mask = response_mask.bool() & (advantages <= 0)
    clipfrac = verl_F.masked_mean((losses2 > losses1).float(), neg_mask)
    clipfrac_lower = verl_F.masked_mean(((clipped > losses3) & (advantages < 0)).float(), response_mask)
    ppo_kl = verl_F.masked_mean(-log_ratio.detach(), response_mask)
    return pg_loss, _metrics(clipfrac, ppo_kl, clipfrac_lower)


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Rollout-correction bypass mode: `old_log_prob` *is* the rollout log-prob (the trainer
    skipped the learner's recomputation), so there are two policies instead of three.

    Reads `config.policy_loss.rollout_correction` (`loss_type`, `rollout_is`,
    `rollout_is_threshold`, `rollout_is_batch_normalize`, `rollout_rs`, `rollout_rs_threshold`),
    computes IS weights and the rejection mask of the *current* policy against the rollout
    (`rollout_corr_helper.compute_rollout_correction_and_rejection_mask`, no gradient), then:
    - `loss_type=ppo_clip` (default): vanilla PPO on ratio = pi / pi_rollout over the kept tokens;
      the IS weights are not applied (the ratio already is the IS correction);
    - `loss_type=reinforce`: `compute_policy_loss_reinforce` with the IS weights.
    The passed `rollout_is_weights` are ignored. With `rollout_is_batch_normalize` the weights are
    normalised over this call (micro-batch), not over all ranks. Metrics: the loss's plus
    `rollout_corr/*`.
    """
    from verl.trainer.ppo import rollout_corr_helper  # lazy: keeps importing core_algos pure torch

    del rollout_is_weights
    rc = config_get(config_get(config, "policy_loss", None), "rollout_correction", None)
    if rc is None:
        raise ValueError(
            "loss_mode='bypass_mode' needs actor.policy_loss.rollout_correction (set by the trainer with "
            "algorithm.rollout_correction.bypass_mode=True)"
        )
    loss_type = config_get(rc, "loss_type", "ppo_clip")
    if loss_type not in ("ppo_clip", "reinforce"):
        raise ValueError(f"Invalid loss_type: {loss_type}. Must be 'reinforce' or 'ppo_clip'.")
    level = config_get(rc, "rollout_is", None)
    with torch.no_grad():
        weights_proto, kept_mask, rc_metrics = rollout_corr_helper.compute_rollout_correction_and_rejection_mask(
            old_log_prob=log_prob.detach(),
            rollout_log_prob=old_log_prob,
            response_mask=response_mask,
            rollout_is=level,
            rollout_is_threshold=config_get(rc, "rollout_is_threshold", 2.0),
            rollout_is_batch_normalize=False,  # normalised below, within this call
            rollout_rs=config_get(rc, "rollout_rs", None),
            rollout_rs_threshold=config_get(rc, "rollout_rs_threshold", None),
            rollout_rs_threshold_lower=config_get(rc, "rollout_rs_threshold_lower", None),
        )
    weights = weights_proto.batch["rollout_is_weights"] if weights_proto is not None else None
    if weights is not None and bool(config_get(rc, "rollout_is_batch_normalize", False)):
        # over this call's tokens (token level) or sequences (sequence level): micro-batches may
        # differ in number between ranks, so no collective here
        if level == "sequence":
            seq_ok = response_mask.sum(-1) > 0
            mean = (
                verl_F.masked_mean(weights, response_mask, axis=-1)[seq_ok].mean()
                if seq_ok.any()
                else weights.new_ones(())
            )
        else:
            mean = verl_F.masked_mean(weights, response_mask)
        factor = float(mean) if float(mean) > 1e-8 else 1.0
        weights = weights / factor
        rc_metrics["rollout_corr/rollout_is_batch_norm_factor"] = factor
    if loss_type == "reinforce":
        pg_loss, metrics = compute_policy_loss_reinforce(
            old_log_prob, log_prob, advantages, kept_mask, loss_agg_mode, config, rollout_is_weights=weights
        )
    else:
        pg_loss, metrics = compute_policy_loss_vanilla(
            old_log_prob, log_prob, advantages, kept_mask, loss_agg_mode, config, rollout_is_weights=None
        )
    metrics = dict(metrics)
    metrics.update(rc_metrics)
    return pg_loss, metrics


def compute_policy_loss(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    cliprange=None,
    cliprange_low=None,
    cliprange_high=None,
    clip_ratio_c=3.0,
    loss_agg_mode: str = "token-mean",
):
    """Legacy upstream entry point: vanilla PPO loss returning the 4-tuple
    `(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)` (metrics as 0-d tensors)."""
    clip = 0.2 if cliprange is None else cliprange
    config = {
        "clip_ratio": clip,
        "clip_ratio_low": cliprange_low if cliprange_low is not None else clip,
        "clip_ratio_high": cliprange_high if cliprange_high is not None else clip,
        "clip_ratio_c": clip_ratio_c,
    }
    pg_loss, m = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config)
    as_t = lambda v: torch.tensor(v, device=pg_loss.device)  # noqa: E731
    return pg_loss, as_t(m["actor/pg_clipfrac"]), as_t(m["actor/ppo_kl"]), as_t(m["actor/pg_clipfrac_lower"])


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Aggregated categorical entropy of `logits` [B, L, V] over `response_mask` [B, L]."""
    entropy = verl_F.entropy_from_logits(logits)
    return agg_loss(entropy, response_mask, loss_agg_mode)


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float | None,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss `max(0.5*(V-R)^2, 0.5*(clip(V, V_old-c, V_old+c)-R)^2)`, aggregated.

    Args (all [B, L]): vpreds (current values, requires grad), returns (targets R), values
        (V_old from the rollout), response_mask. cliprange_value: c (None disables clipping).
        dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: forwarded to `agg_loss`
        (mini-batch-global denominators); when none is given the active `global_batch_info`
        context supplies them, as for `agg_loss`.
    Returns:
        vf_loss (0-d tensor) and vf_clipfrac (0-d detached tensor: share of tokens where the
        clipped term is the larger one).
    """
    if cliprange_value is None:
        vpred_clipped = vpreds
    else:
        vpred_clipped = verl_F.clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    losses1 = (vpreds - returns).square()
    losses2 = (vpred_clipped - returns).square()
    vf_loss = 0.5 * agg_loss(
        torch.maximum(losses1, losses2),
        response_mask,
        loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    vf_clipfrac = verl_F.masked_mean((losses2 > losses1).float(), response_mask).detach()
    return vf_loss, vf_clipfrac


# =============================================================================================
# Groups and normalisation
# =============================================================================================


def _group_ids(
    index: Sequence[Hashable] | np.ndarray | None, batch_size: int, device, who: str
) -> tuple[torch.Tensor, int]:
    """Map prompt ids to dense group ids 0..G-1 (first-appearance order): ([B] long, G)."""
    if index is None:
        raise ValueError(f"{who} groups responses by prompt and needs `index` (the uid array of the batch)")
    if len(index) != batch_size:
        raise ValueError(f"{who}: index has {len(index)} entries but the batch has {batch_size} rows")
    mapping: dict = {}
    try:
        ids = [mapping.setdefault(uid, len(mapping)) for uid in index]
    except TypeError as exc:
        raise TypeError(f"{who}: prompt ids in `index` must be hashable (got {type(index[0]).__name__})") from exc
    return torch.tensor(ids, dtype=torch.long, device=device), len(mapping)


def _group_sum(values: torch.Tensor, ids: torch.Tensor, n_groups: int) -> torch.Tensor:
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, ids, values)


def normalize_by_config(
    values: torch.Tensor,
    norm_config: Any,
    index: Sequence[Hashable] | np.ndarray | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """AReaL-style normalisation `(x - mean) / (std + eps)` described by a `NormConfig`.

    Args:
        values: [B] one value per response, or [B, L] per token (then `mask` [B, L] selects the
            tokens that enter the statistics and the output is 0 elsewhere).
        norm_config: `mean_level` / `std_level` in {"batch", "group", None}, `mean_leave1out`,
            `std_unbiased` (default True), `eps` (default 1e-5); dataclass or dict.
        index: [B] prompt ids; required when a level is "group".
    Semantics:
        - mean: of the group or the batch; with `mean_leave1out` the mean of the *other*
          responses (all tokens of the own response are left out). None: no centring.
        - std: of the raw values at `std_level` (unbiased by default). None: no scaling. A batch
          std over fewer than 2 elements is taken as 1 (no scaling).
        - a response whose group has a single response gets 0 whenever a level is "group" (no
          contrast, no signal), and so does a response with no valid tokens.
    """
    mean_level = config_get(norm_config, "mean_level", None)
    std_level = config_get(norm_config, "std_level", None)
    leave1out = bool(config_get(norm_config, "mean_leave1out", False))
    unbiased = bool(config_get(norm_config, "std_unbiased", True))
    eps = float(config_get(norm_config, "eps", 1e-5))
    for key, level in (("mean_level", mean_level), ("std_level", std_level)):
        if level not in ("batch", "group", None):
            raise ValueError(f"normalisation {key}={level!r}; expected one of ['batch', 'group', None]")

    per_token = values.dim() == 2
    valid = mask.bool() if mask is not None else torch.ones_like(values, dtype=torch.bool)
    x = torch.where(valid, values, torch.zeros((), dtype=values.dtype, device=values.device))
    w = valid.to(values.dtype)
    # per-response sums and counts of the elements entering the statistics
    row_sum = x.sum(dim=-1) if per_token else x
    row_cnt = w.sum(dim=-1) if per_token else w
    batch_size = values.shape[0]

    uses_group = "group" in (mean_level, std_level)
    out_ok = row_cnt > 0
    if uses_group:
        ids, n_groups = _group_ids(index, batch_size, values.device, "normalisation with level 'group'")
        g_rows = _group_sum(torch.ones_like(row_cnt), ids, n_groups)
        out_ok = out_ok & (g_rows[ids] > 1)

    def expand(row_stat: torch.Tensor) -> torch.Tensor:
        return row_stat.unsqueeze(-1) if per_token else row_stat

    # ---- mean
    if mean_level is None:
        mean = torch.zeros_like(row_sum)
    else:
        if mean_level == "group":
            tot_sum = _group_sum(row_sum, ids, n_groups)[ids]
            tot_cnt = _group_sum(row_cnt, ids, n_groups)[ids]
        else:
            tot_sum = row_sum.sum().expand_as(row_sum)
            tot_cnt = row_cnt.sum().expand_as(row_cnt)
        if leave1out:
            mean = (tot_sum - row_sum) / (tot_cnt - row_cnt).clamp(min=1)
        else:
            mean = tot_sum / tot_cnt.clamp(min=1)
    centred = values - expand(mean)

    # ---- std (of the raw values at std_level)
    if std_level is None:
        scaled = centred
    else:
        if std_level == "group":
            g_sum = _group_sum(row_sum, ids, n_groups)
            g_cnt = _group_sum(row_cnt, ids, n_groups)
            g_mean = (g_sum / g_cnt.clamp(min=1))[ids]
            dev = torch.where(valid, values - expand(g_mean), torch.zeros((), dtype=values.dtype, device=values.device))
            row_sq = dev.square().sum(dim=-1) if per_token else dev.square()
            sq = _group_sum(row_sq, ids, n_groups)[ids]
            cnt = g_cnt[ids]
            denom = (cnt - 1).clamp(min=1) if unbiased else cnt.clamp(min=1)
            std = torch.sqrt(sq / denom)
        else:
            b_cnt = row_cnt.sum()
            b_mean = row_sum.sum() / b_cnt.clamp(min=1)
            dev = torch.where(valid, values - b_mean, torch.zeros((), dtype=values.dtype, device=values.device))
            b_sq = dev.square().sum()
            denom = (b_cnt - 1).clamp(min=1) if unbiased else b_cnt.clamp(min=1)
            too_few = b_cnt < (2 if unbiased else 1)
            b_std = torch.where(too_few, torch.ones_like(b_sq) - eps, torch.sqrt(b_sq / denom))
            std = b_std.expand_as(row_sum)
        scaled = centred / (expand(std) + eps)

    keep = valid & expand(out_ok) if per_token else valid & out_ok
    return torch.where(keep, scaled, torch.zeros((), dtype=values.dtype, device=values.device))


# =============================================================================================
# Dynamic GAE lambda
# =============================================================================================


@dataclass
class GAELambdaContext:
    """Inputs of a dynamic-lambda function, each [B]:
    effective_token_lengths (valid generated tokens), turn_counts (non-empty turns; 0 without
    turn ids), timestep_lengths (L in the chosen `gae_timestep_unit`)."""

    effective_token_lengths: torch.Tensor
    turn_counts: torch.Tensor
    timestep_lengths: torch.Tensor


GAE_LAMBDA_FN_REGISTRY: dict[str, Callable] = {}


def register_gae_lambda_fn(*names: str) -> Callable[[Callable], Callable]:
    """Register a dynamic-lambda function `fn(ctx: GAELambdaContext, **lam_kwargs) -> [B]` under
    short names usable as `algorithm.lam`."""

    def decorator(fn: Callable) -> Callable:
        for name in names:
            current = GAE_LAMBDA_FN_REGISTRY.get(name)
            if current is not None and not _same_function(current, fn):
                raise ValueError(f"GAE lambda function {name!r} is already registered")
            GAE_LAMBDA_FN_REGISTRY[name] = fn
        return fn

    return decorator


@register_gae_lambda_fn("vapo_length_adaptive", "vapo_length_adaptive_gae")
def vapo_length_adaptive(ctx: GAELambdaContext, alpha: float = 0.05) -> torch.Tensor:
    """VAPO length-adaptive lambda: `max(0, 1 - 1/(alpha*L))` for L > 0, 0 for L = 0."""
    if not alpha > 0:
        raise ValueError(f"vapo_length_adaptive: alpha={alpha} must be > 0 (algorithm.lam_kwargs.alpha)")
    length = ctx.timestep_lengths.to(torch.float64)
    lam = torch.clamp(1.0 - 1.0 / (alpha * length.clamp(min=1)), min=0.0)
    return torch.where(length > 0, lam, torch.zeros_like(lam)).to(torch.float32)


@register_gae_lambda_fn("relative_position", "relative_position_gae_lambda")
def relative_position(ctx: GAELambdaContext, q: float) -> torch.Tensor:
    """Relative-position lambda: `q**(1/(L-1))` for L >= 2, 1 for L = 1, 0 for L = 0 (with gamma = 1
    the first step keeps a share q of the last step's signal)."""
    if not 0 < q <= 1:
        raise ValueError(f"relative_position: q={q} must be in (0, 1] (algorithm.lam_kwargs.q)")
    length = ctx.timestep_lengths.to(torch.float64)
    lam = torch.pow(torch.full_like(length, float(q)), 1.0 / (length - 1).clamp(min=1))
    lam = torch.where(length >= 2, lam, torch.where(length == 1, torch.ones_like(lam), torch.zeros_like(lam)))
    return lam.to(torch.float32)


def _resolve_callable(spec: str) -> Callable:
    if spec in GAE_LAMBDA_FN_REGISTRY:
        return GAE_LAMBDA_FN_REGISTRY[spec]
    module_name, _, attr = spec.rpartition(".")
    if module_name:
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"algorithm.lam={spec!r}: cannot import {attr!r} from {module_name!r} ({exc})") from exc
    raise ValueError(
        f"algorithm.lam={spec!r} is neither a number, a registered lambda function {sorted(GAE_LAMBDA_FN_REGISTRY)} "
        "nor a dotted path `package.module.function`"
    )


def resolve_gae_lambda(lam: Any, lam_kwargs: Mapping | None, ctx: GAELambdaContext) -> float | torch.Tensor:
    """A float, or a per-trajectory [B] tensor for a callable / registered name / dotted path."""
    if isinstance(lam, bool):
        raise ValueError(f"algorithm.lam={lam!r} must be a number or a lambda function name")
    if isinstance(lam, (int, float)):
        return float(lam)
    if torch.is_tensor(lam):
        return lam
    fn = _resolve_callable(lam) if isinstance(lam, str) else lam
    if not callable(fn):
        raise ValueError(f"algorithm.lam={lam!r} is not callable")
    kwargs = dict(lam_kwargs or {})
    try:
        out = fn(ctx, **kwargs)
    except TypeError as exc:
        raise ValueError(f"algorithm.lam={lam!r} rejected algorithm.lam_kwargs={kwargs}: {exc}") from exc
    out = torch.as_tensor(out, dtype=torch.float32, device=ctx.timestep_lengths.device)
    if out.shape != ctx.timestep_lengths.shape or not torch.isfinite(out).all() or (out < 0).any() or (out > 1).any():
        raise ValueError(
            f"algorithm.lam={lam!r} must return finite values in [0, 1] of shape {tuple(ctx.timestep_lengths.shape)}; "
            f"got shape {tuple(out.shape)}"
        )
    return out


# =============================================================================================
# Advantage estimators
# =============================================================================================


def _outcome_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-response outcome reward [B]: the sum of the token rewards on valid tokens."""
    return verl_F.masked_sum(token_level_rewards, response_mask, axis=-1)


def _broadcast(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return torch.where(
        response_mask.bool(), scores.unsqueeze(-1), torch.zeros((), dtype=scores.dtype, device=scores.device)
    )


def _token_gae(rewards, values, mask, gamma: float, lam) -> torch.Tensor:
    """Raw token-level GAE; masked positions consume no timestep and carry the next values."""
    valid = mask.bool()
    batch, length = rewards.shape
    lam_t = (
        lam if torch.is_tensor(lam) else torch.full((batch,), float(lam), dtype=rewards.dtype, device=rewards.device)
    )
    lam_t = lam_t.to(rewards.dtype)
    next_value = torch.zeros(batch, dtype=rewards.dtype, device=rewards.device)
    last_adv = torch.zeros_like(next_value)
    adv = torch.zeros_like(rewards)
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam_t * last_adv
        m = valid[:, t]
        next_value = torch.where(m, values[:, t], next_value)
        last_adv = torch.where(m, candidate, last_adv)
        adv[:, t] = last_adv
    return adv


def _turn_gae(task_rewards, values, mask, turn_ids, gamma: float, lam) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level GAE: (A_u broadcast [B, L], G_u = A_u + V_u broadcast [B, L])."""
    batch = task_rewards.shape[0]
    adv = torch.zeros_like(task_rewards)
    ret = torch.zeros_like(task_rewards)
    for b in range(batch):
        pos = torch.nonzero(mask[b].bool()).squeeze(-1)
        if pos.numel() == 0:
            continue
        tid = turn_ids[b, pos]
        if (tid < 0).any():
            raise ValueError(f"turn_ids row {b}: a valid (response_mask=1) token has turn id -1")
        if (tid[1:] < tid[:-1]).any():
            raise ValueError(f"turn_ids row {b}: turn ids must be non-decreasing over the action tokens")
        starts = torch.ones_like(tid, dtype=torch.bool)
        starts[1:] = tid[1:] != tid[:-1]
        turn_of = torch.cumsum(starts.long(), 0) - 1
        n_turns = int(turn_of[-1]) + 1
        r_u = torch.zeros(n_turns, dtype=task_rewards.dtype, device=task_rewards.device).index_add_(
            0, turn_of, task_rewards[b, pos]
        )
        v_u = values[b, pos[starts]]
        lam_b = float(lam[b]) if torch.is_tensor(lam) else float(lam)
        a_u = torch.zeros_like(r_u)
        running = 0.0
        for u in reversed(range(n_turns)):
            next_v = v_u[u + 1] if u + 1 < n_turns else 0.0
            delta = r_u[u] + gamma * next_v - v_u[u]
            running = delta + gamma * lam_b * running
            a_u[u] = running
        adv[b, pos] = a_u[turn_of]
        ret[b, pos] = (a_u + v_u)[turn_of]
    return adv, ret


def _turn_counts(mask: torch.Tensor, turn_ids: torch.Tensor | None) -> torch.Tensor:
    if turn_ids is None:
        return torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device)
    counts = []
    for b in range(mask.shape[0]):
        tid = turn_ids[b, mask[b].bool()]
        counts.append(int(torch.unique(tid[tid >= 0]).numel()))
    return torch.tensor(counts, dtype=torch.long, device=mask.device)


@register_adv_est(AdvantageEstimator.GAE, needs_critic=True)
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | None = None,
    lam: Any = None,
    config: Any = None,
    index: Any = None,
    turn_ids: torch.Tensor | None = None,
    token_level_scores: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the response (critic needed).

    Token unit (`algorithm.gae_timestep_unit=token`, default): `delta_t = r_t + gamma*V_{t+1} - V_t`,
    `A_t = delta_t + gamma*lam*A_{t+1}` over valid tokens (masked positions consume no timestep),
    returns `= A + V` (raw A).
    Turn unit: each non-empty turn (same `turn_ids`) is one step: the task rewards of the turn are
    summed, V_u is the value at the turn's first action token, A_u / G_u = A_u + V_u are broadcast
    to the turn's tokens; the per-token KL part (`token_level_rewards - token_level_scores`, when
    `token_level_scores` is passed) is added to the actor advantage after the recursion and is not
    part of the returns.
    The advantages are then whitened over the valid tokens (`masked_whiten`), or normalised by
    `algorithm.adv_norm` when that is set. Masked positions are 0 in both outputs.

    Args:
        token_level_rewards, values, response_mask: [B, L].
        gamma, lam: override `config.gamma` / `config.lam`; `lam` may be a float, a [B] tensor, a
            registered name (`vapo_length_adaptive`, `relative_position`), a dotted path or a callable
            (called with a `GAELambdaContext` and `config.lam_kwargs`).
        turn_ids: [B, L] turn id per response token (-1 on non-action tokens), or [B, S] aligned
            with input_ids (the last L columns are used).
    Returns:
        advantages [B, L], returns [B, L].
    """
    gamma = float(gamma if gamma is not None else config_get(config, "gamma", 1.0))
    lam_spec = lam if lam is not None else config_get(config, "lam", 1.0)
    unit = config_get(config, "gae_timestep_unit", "token")
    if unit not in ("token", "turn"):
        raise ValueError(f"algorithm.gae_timestep_unit={unit!r}; expected one of ['token', 'turn']")
    with torch.no_grad():
        mask = response_mask.bool()
        zero = torch.zeros((), dtype=token_level_rewards.dtype, device=token_level_rewards.device)
        rewards = torch.where(mask, token_level_rewards, zero)
        vals = torch.where(mask, values.to(rewards.dtype), zero)
        if turn_ids is not None and turn_ids.shape[-1] != rewards.shape[-1]:
            turn_ids = turn_ids[..., -rewards.shape[-1] :]
        if unit == "turn" and turn_ids is None:
            raise ValueError("algorithm.gae_timestep_unit=turn needs `turn_ids` in the batch")
        if isinstance(lam_spec, (int, float)) and not isinstance(lam_spec, bool):
            lam_value = float(lam_spec)  # a constant lambda needs no per-trajectory lengths
        else:
            token_lengths = mask.sum(dim=-1)
            turn_counts = _turn_counts(mask, turn_ids)
            ctx = GAELambdaContext(
                effective_token_lengths=token_lengths,
                turn_counts=turn_counts,
                timestep_lengths=turn_counts if unit == "turn" else token_lengths,
            )
            lam_value = resolve_gae_lambda(lam_spec, config_get(config, "lam_kwargs", {}), ctx)

        if unit == "token":
            raw_adv = _token_gae(rewards, vals, mask, gamma, lam_value)
            returns = raw_adv + vals
        else:
            if token_level_scores is not None:
                task = torch.where(mask, token_level_scores.to(rewards.dtype), zero)
            else:
                task = rewards
            raw_adv, returns = _turn_gae(task, vals, mask, turn_ids, gamma, lam_value)
            raw_adv = raw_adv + (rewards - task)  # token-local KL part, after the recursion

        adv_norm = config_get(config, "adv_norm", None)
        if adv_norm is not None:
            advantages = normalize_by_config(raw_adv, adv_norm, index=index, mask=mask)
        else:
            advantages = verl_F.masked_whiten(raw_adv, mask)
        advantages = torch.where(mask, advantages, zero)
        returns = torch.where(mask, returns, zero)
    return advantages, returns


def _norm_by_std(norm_adv_by_std_in_grpo: bool | None, config: Any) -> bool:
    if norm_adv_by_std_in_grpo is not None:
        return bool(norm_adv_by_std_in_grpo)
    return bool(config_get(config, "norm_adv_by_std_in_grpo", True))


@register_adv_est(AdvantageEstimator.GRPO, needs_groups=True)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: `(r - mean_group) / (std_group + epsilon)` broadcast to the tokens.

    r = sum of the token rewards of a response; std is unbiased (as `torch.std`).
    `norm_adv_by_std_in_grpo=False` (or `algorithm.norm_adv_by_std_in_grpo`) gives Dr.GRPO
    (`r - mean_group`). A group with a single response gets 0. Returns (advantages, advantages),
    both [B, L], 0 on masked positions.
    """
    scale = _norm_by_std(norm_adv_by_std_in_grpo, config)
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        _group_ids(index, scores.shape[0], scores.device, "grpo")  # validates the index
        rows: dict = defaultdict(list)
        for i, uid in enumerate(index):
            rows[uid].append(i)
        out = torch.zeros_like(scores)
        for members in rows.values():
            if len(members) < 2:
                continue  # no baseline, no signal
            group = scores[members]
            centred = group - group.mean()
            out[members] = centred / (group.std() + epsilon) if scale else centred
        adv = _broadcast(out, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED, needs_groups=True)
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same result as `grpo`, computed with scatter operations instead of a loop over groups."""
    scale = _norm_by_std(norm_adv_by_std_in_grpo, config)
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        ids, n_groups = _group_ids(index, scores.shape[0], scores.device, "grpo_vectorized")
        count = _group_sum(torch.ones_like(scores), ids, n_groups)
        mean = _group_sum(scores, ids, n_groups) / count.clamp(min=1)
        centred = scores - mean[ids]
        if scale:
            var = _group_sum(centred.square(), ids, n_groups) / (count - 1).clamp(min=1)
            centred = centred / (var.sqrt()[ids] + epsilon)
        out = torch.where(count[ids] > 1, centred, torch.zeros_like(centred))
        adv = _broadcast(out, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.GRPO_PASSK, needs_groups=True)
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k advantage: only the best response of each group gets `r_max - r_second` (divided by
    `std_group + epsilon` when normalising by std); all others get 0. Groups of one response: 0."""
    scale = _norm_by_std(norm_adv_by_std_in_grpo, config)
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        _group_ids(index, scores.shape[0], scores.device, "grpo_passk")
        rows: dict = defaultdict(list)
        for i, uid in enumerate(index):
            rows[uid].append(i)
        out = torch.zeros_like(scores)
        for members in rows.values():
            if len(members) < 2:
                continue
            group = scores[members]
            top, top_idx = torch.topk(group, 2)
            value = top[0] - top[1]
            if scale:
                value = value / (group.std() + epsilon)
            out[members[int(top_idx[0])]] = value
        adv = _broadcast(out, response_mask)
    return adv, adv


def step_rewards_to_go(
    step_rewards: torch.Tensor, step_end_mask: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """Process supervision: the advantage of a token is the sum of the (normalised) rewards of the
    steps that end at or after it.

    Args:
        step_rewards: [B, L] reward of a step at its last token (other positions ignored).
        step_end_mask: [B, L] True at the last token of each step.
        response_mask: [B, L].
    Returns:
        [B, L] reverse cumulative sum of the step rewards, 0 on masked positions.
    """
    ends = step_end_mask.bool() & response_mask.bool()
    placed = torch.where(ends, step_rewards, torch.zeros((), dtype=step_rewards.dtype, device=step_rewards.device))
    to_go = placed.flip(-1).cumsum(-1).flip(-1)
    return torch.where(response_mask.bool(), to_go, torch.zeros((), dtype=to_go.dtype, device=to_go.device))


@register_adv_est(AdvantageEstimator.GRPO_PROCESS, needs_groups=True)
def compute_grpo_process_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    step_end_mask: torch.Tensor | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Process-supervision GRPO (DeepSeekMath): normalise all step rewards of a group with the
    group's mean and std, then the advantage of a token is the sum of the normalised rewards of the
    steps ending at or after it.

    Args:
        token_level_rewards: [B, L] step rewards placed on the last token of each step.
        step_end_mask: [B, L] marks the step ends (so a step reward of exactly 0 still counts); by
            default every valid position with a non-zero reward is a step end.
    Groups of one response get 0. Returns (advantages, advantages).
    """
    scale = _norm_by_std(norm_adv_by_std_in_grpo, config)
    with torch.no_grad():
        mask = response_mask.bool()
        if step_end_mask is None:
            ends = mask & (token_level_rewards != 0)
        else:
            ends = step_end_mask.bool() & mask
        ids, n_groups = _group_ids(index, token_level_rewards.shape[0], token_level_rewards.device, "grpo_process")
        zero = torch.zeros((), dtype=token_level_rewards.dtype, device=token_level_rewards.device)
        r = torch.where(ends, token_level_rewards, zero)
        e = ends.to(r.dtype)
        cnt = _group_sum(e.sum(-1), ids, n_groups)
        mean = _group_sum(r.sum(-1), ids, n_groups) / cnt.clamp(min=1)
        centred = torch.where(ends, r - mean[ids].unsqueeze(-1), zero)
        if scale:
            var = _group_sum(centred.square().sum(-1), ids, n_groups) / (cnt - 1).clamp(min=1)
            centred = centred / (var.sqrt()[ids].unsqueeze(-1) + epsilon)
        adv = step_rewards_to_go(centred, ends, response_mask)
        rows = _group_sum(torch.ones(ids.shape[0], dtype=r.dtype, device=r.device), ids, n_groups)
        adv = torch.where((rows[ids] > 1).unsqueeze(-1), adv, zero)
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO, needs_groups=True)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: `r_i - mean_{j != i} r_j` = `G/(G-1) * (r_i - mean_group)`; groups of one: 0."""
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        _group_ids(index, scores.shape[0], scores.device, "rloo")
        rows: dict = defaultdict(list)
        for i, uid in enumerate(index):
            rows[uid].append(i)
        out = torch.zeros_like(scores)
        for members in rows.values():
            n = len(members)
            if n < 2:
                continue
            group = scores[members]
            out[members] = group - (group.sum() - group) / (n - 1)
        adv = _broadcast(out, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED, needs_groups=True)
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same result as `rloo`, with scatter operations."""
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        ids, n_groups = _group_ids(index, scores.shape[0], scores.device, "rloo_vectorized")
        count = _group_sum(torch.ones_like(scores), ids, n_groups)[ids]
        total = _group_sum(scores, ids, n_groups)[ids]
        loo = scores - (total - scores) / (count - 1).clamp(min=1)
        out = torch.where(count > 1, loo, torch.zeros_like(loo))
        adv = _broadcast(out, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    gamma: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go of the token rewards (KL-shaped when KL is in the
    reward), `G_t = r_t + gamma * G_{t+1}` over valid tokens, whitened over the batch's valid
    tokens. Returns (advantages, returns)."""
    gamma = float(gamma if gamma is not None else config_get(config, "gamma", 1.0))
    with torch.no_grad():
        mask = response_mask.bool()
        zero = torch.zeros((), dtype=token_level_rewards.dtype, device=token_level_rewards.device)
        rewards = torch.where(mask, token_level_rewards, zero)
        returns = torch.zeros_like(rewards)
        running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
        for t in reversed(range(rewards.shape[1])):
            # masked positions consume no timestep: they neither add reward nor discount
            running = torch.where(mask[:, t], rewards[:, t] + gamma * running, running)
            returns[:, t] = running
        returns = torch.where(mask, returns, zero)
        advantages = torch.where(mask, verl_F.masked_whiten(returns, mask), zero)
    return advantages, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE, needs_groups=True)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with baseline: subtract the group mean of the outcome reward (groups of one
    response: 0), broadcast, then whiten over the batch's valid tokens."""
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        ids, n_groups = _group_ids(index, scores.shape[0], scores.device, "reinforce_plus_plus_baseline")
        count = _group_sum(torch.ones_like(scores), ids, n_groups)
        mean = _group_sum(scores, ids, n_groups) / count.clamp(min=1)
        centred = torch.where(count[ids] > 1, scores - mean[ids], torch.zeros_like(scores))
        mask = response_mask.bool()
        adv = _broadcast(centred, response_mask)
        adv = torch.where(mask, verl_F.masked_whiten(adv, mask), torch.zeros((), dtype=adv.dtype, device=adv.device))
    return adv, adv


@register_adv_est(AdvantageEstimator.REMAX, needs_greedy_baseline=True)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: return-to-go minus the reward of the greedy rollout of the same prompt.

    Args:
        reward_baselines: [B] greedy-rollout reward (produced by the trainer).
    Returns:
        advantages = returns - baseline on valid tokens, returns = reverse cumsum of rewards.
    """
    if reward_baselines is None:
        raise ValueError("remax needs `reward_baselines` (the greedy rollout reward per prompt)")
    with torch.no_grad():
        mask = response_mask.bool()
        zero = torch.zeros((), dtype=token_level_rewards.dtype, device=token_level_rewards.device)
        rewards = torch.where(mask, token_level_rewards, zero)
        returns = rewards.flip(-1).cumsum(-1).flip(-1)
        returns = torch.where(mask, returns, zero)
        advantages = torch.where(mask, returns - reward_baselines.to(rewards.dtype).unsqueeze(-1), zero)
    return advantages, returns


@register_adv_est(AdvantageEstimator.OPO, needs_groups=True)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: baseline weighted by response length, `b = sum(len_j r_j) / sum(len_j)` over the group;
    advantage `r - b`. Groups of one response: 0."""
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        lengths = response_mask.to(scores.dtype).sum(-1)
        ids, n_groups = _group_ids(index, scores.shape[0], scores.device, "opo")
        count = _group_sum(torch.ones_like(scores), ids, n_groups)
        baseline = _group_sum(lengths * scores, ids, n_groups) / _group_sum(lengths, ids, n_groups).clamp(min=1)
        out = torch.where(count[ids] > 1, scores - baseline[ids], torch.zeros_like(scores))
        adv = _broadcast(out, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.GPG, needs_groups=True)
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: `alpha * (r - mean_group) / f_norm` with `alpha = B / #(responses with r != 0)`
    (corrects for groups without signal). Groups of one response: 0. The `alpha` argument is
    accepted for upstream compatibility; the batch-derived value is used."""
    del alpha
    with torch.no_grad():
        scores = _outcome_scores(token_level_rewards, response_mask)
        ids, n_groups = _group_ids(index, scores.shape[0], scores.device, "gpg")
        alpha = scores.shape[0] / max(int(torch.count_nonzero(scores)), 1)
        count = _group_sum(torch.ones_like(scores), ids, n_groups)
        mean = _group_sum(scores, ids, n_groups) / count.clamp(min=1)
        out = torch.where(count[ids] > 1, alpha * (scores - mean[ids]) / f_norm, torch.zeros_like(scores))
        adv = _broadcast(out, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.GDPO)
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    non_tensor_batch: Mapping | None = None,
    batch: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (group reward-decoupled normalisation): each reward component is normalised within
    its group like GRPO, the normalised components are summed with weights, and the sum is
    whitened over the batch's valid tokens.

    Components: `algorithm.gdpo_reward_keys` names per-response values in `non_tensor_batch`
    (what the scoring function returned in its dict), weighted by `algorithm.gdpo_reward_weights`
    (default 1 each). Without `config`/`non_tensor_batch`/`batch` the single component is the
    outcome reward (then GDPO = GRPO followed by whitening). Groups of one response get 0 in each
    component (the GRPO rule). Returns (advantages, advantages), [B, L].
    """
    components: list[torch.Tensor] = []
    weights: list[float] | None = None
    if config is not None and non_tensor_batch is not None and batch is not None:
        keys = config_get(config, "gdpo_reward_keys", None)
        if not keys:
            raise ValueError(
                "GDPO requires algorithm.gdpo_reward_keys: the reward component keys returned by the scoring "
                "function (e.g. ['format_reward', 'accuracy_reward'])"
            )
        last = (response_mask.to(torch.long).sum(-1) - 1).clamp(min=0)
        rows = torch.arange(response_mask.shape[0], device=response_mask.device)
        for key in keys:
            if key not in non_tensor_batch:
                raise KeyError(
                    f"GDPO reward key {key!r} not found in non_tensor_batch; available: {sorted(non_tensor_batch)}. "
                    "Does the scoring function return a dict containing it?"
                )
            values = torch.as_tensor(np.asarray(non_tensor_batch[key], dtype=np.float32), device=response_mask.device)
            placed = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
            placed[rows, last] = values
            components.append(placed)
        raw_weights = config_get(config, "gdpo_reward_weights", None)
        if raw_weights is not None:
            weights = [float(w) for w in raw_weights]
            if len(weights) != len(components):
                raise ValueError(
                    f"algorithm.gdpo_reward_weights has {len(weights)} entries for {len(components)} gdpo_reward_keys"
                )
    if not components:
        components = [token_level_rewards]
    if weights is None:
        weights = [1.0] * len(components)
    with torch.no_grad():
        total = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
        for w, comp in zip(weights, components, strict=False):
            adv, _ = compute_grpo_outcome_advantage(
                comp,
                response_mask,
                index,
                epsilon=epsilon,
                norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
                config=config,
            )
            total = total + w * adv.to(total.dtype)
        mask = response_mask.bool()
        adv = torch.where(
            mask, verl_F.masked_whiten(total, mask), torch.zeros((), dtype=total.dtype, device=total.device)
        )
    return adv, adv


def _otb_inputs(token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights, who):
    if old_log_probs is None or sum_pi_squared is None:
        raise ValueError(
            f"{who} needs `old_log_probs` and `sum_pi_squared` ([B, L], sum over the vocabulary of pi^2 per "
            "token) in the batch; the actor must compute sum_pi_squared (actor.calculate_sum_pi_squared=True)"
        )
    mask = response_mask.to(token_level_rewards.dtype)
    returns = (token_level_rewards * mask).flip(-1).cumsum(-1).flip(-1)
    # per-token score-norm proxy ||s_t||^2 = 1 - 2 pi_t + sum_v pi_v^2, accumulated along the path
    w = 1.0 - 2.0 * torch.exp(old_log_probs.to(mask.dtype)) + sum_pi_squared.to(mask.dtype)
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.to(mask.dtype).square()
    w_cum = (w * mask).cumsum(-1)
    return mask, returns, w_cum


def _zero_unique_tail(baselines: torch.Tensor, rows: list[int], lengths: torch.Tensor) -> None:
    """Where one trajectory of a group is strictly the longest, its baseline beyond the
    second-longest length is 0 (no other trajectory informs those positions)."""
    ordered = torch.sort(lengths).values
    longest, second = int(ordered[-1]), int(ordered[-2])
    at_max = (lengths == longest).nonzero(as_tuple=True)[0]
    if at_max.numel() == 1 and longest > second:
        baselines[rows[int(at_max[0])], second:] = 0.0


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE, needs_old_log_probs=True)
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal token baseline (OTB): one baseline per position t and group,
    `B_t = sum_i G_it W_it / (sum_i W_it + eps)`, with G the reward-to-go and
    `W_it = sum_{j<=t} (1 - 2 pi_ij + sum_pi_squared_ij)` (times the squared rollout IS weight
    when given) over valid tokens; advantage `G - B` on valid tokens. With `handle_zero_tail`, a
    group's unique longest trajectory gets baseline 0 beyond the second-longest length. Positions
    are compared by column (padded index). Groups of one response: 0 (our singleton rule;
    upstream keeps the raw return). Returns (advantages, returns), [B, L].
    """
    with torch.no_grad():
        mask, returns, w_cum = _otb_inputs(
            token_level_rewards,
            response_mask,
            old_log_probs,
            sum_pi_squared,
            rollout_is_weights,
            "optimal_token_baseline",
        )
        _group_ids(index, mask.shape[0], mask.device, "optimal_token_baseline")
        groups: dict = defaultdict(list)
        for i, uid in enumerate(index):
            groups[uid].append(i)
        baselines = torch.zeros_like(returns)
        keep = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
        for rows in groups.values():
            if len(rows) < 2:
                continue
            idx = torch.tensor(rows, device=mask.device)
            m, g, w = mask[idx], returns[idx], w_cum[idx]
            b = (g * w * m).sum(0) / ((w * m).sum(0) + epsilon)
            baselines[idx] = b.to(baselines.dtype).unsqueeze(0).expand(len(rows), -1)
            keep[idx] = True
            if handle_zero_tail:
                _zero_unique_tail(baselines, rows, m.sum(-1))
        adv = (returns - baselines) * mask * keep.unsqueeze(-1).to(mask.dtype)
    return adv, returns


@register_adv_est(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE, needs_old_log_probs=True)
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB for multi-turn / tool-interleaved responses: like `optimal_token_baseline`, but the
    positions compared across a group are the k-th *valid* token of each trajectory (tool-output
    gaps in the mask are skipped), not the padded column. Responses without valid tokens are
    left out of their group. Groups of one response: 0. Returns (advantages, returns), [B, L].
    """
    with torch.no_grad():
        mask, returns, w_cum = _otb_inputs(
            token_level_rewards,
            response_mask,
            old_log_probs,
            sum_pi_squared,
            rollout_is_weights,
            "tir_optimal_token_baseline",
        )
        _group_ids(index, mask.shape[0], mask.device, "tir_optimal_token_baseline")
        valid = response_mask.bool()
        lengths = valid.sum(-1)
        width = int(lengths.max()) if lengths.numel() else 0
        packed_w = torch.zeros((mask.shape[0], width), dtype=mask.dtype, device=mask.device)
        packed_g = torch.zeros_like(packed_w)
        for i in range(mask.shape[0]):
            n = int(lengths[i])
            packed_w[i, :n] = w_cum[i, valid[i]]
            packed_g[i, :n] = returns[i, valid[i]]
        packed_m = (torch.arange(width, device=mask.device).unsqueeze(0) < lengths.unsqueeze(-1)).to(mask.dtype)
        groups: dict = defaultdict(list)
        for i, uid in enumerate(index):
            if int(lengths[i]) > 0:
                groups[uid].append(i)
        baselines = torch.zeros_like(packed_w)
        keep = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
        for rows in groups.values():
            if len(rows) < 2:
                continue
            idx = torch.tensor(rows, device=mask.device)
            m, g, w = packed_m[idx], packed_g[idx], packed_w[idx]
            b = (g * w * m).sum(0) / ((w * m).sum(0) + epsilon)
            baselines[idx] = b.to(baselines.dtype).unsqueeze(0).expand(len(rows), -1)
            keep[idx] = True
            if handle_zero_tail:
                _zero_unique_tail(baselines, rows, lengths[idx])
        packed_adv = (packed_g - baselines) * packed_m
        adv = torch.zeros_like(returns)
        for i in range(mask.shape[0]):
            n = int(lengths[i])
            if n > 0 and bool(keep[i]):
                adv[i, valid[i]] = packed_adv[i, :n]
    return adv, returns


def compute_pf_ppo_reweight_data(data: Any, reweight_method: str = "pow", weight_pow: float = 2.0) -> Any:
    """PF-PPO: resample the batch (with replacement, same size) with weights from the outcome
    score `s = token_level_scores.sum(-1)`:

    - `pow`: `|s| ** weight_pow`
    - `max_min`: 1 for responses with the batch's max or min score, else 0
    - `max_random`: 0.4 for the max score, else 0.1

    (weights + 1e-8, so no row has probability 0 when all weights vanish). `data` is a DataProto
    (duck-typed: `batch`, `non_tensor_batch`, `meta_info`, `select_idxs`); meta_info lists with
    one entry per row are resampled too. Uses torch's global generator. Returns a new DataProto.
    """
    scores = data.batch["token_level_scores"].sum(dim=-1)
    if reweight_method == "pow":
        weights = torch.abs(scores).pow(weight_pow)
    elif reweight_method == "max_min":
        weights = ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)
    elif reweight_method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    else:
        raise ValueError(
            f"Unsupported reweight_method: {reweight_method}; expected one of ['pow', 'max_min', 'max_random'] "
            "(algorithm.pf_ppo.reweight_method)"
        )
    weights = torch.clamp(weights.float() + 1e-8, min=1e-8)
    n = scores.shape[0]
    idx = torch.multinomial(weights, n, replacement=True).cpu().numpy()
    out = data.select_idxs(idx)
    out.meta_info = {
        k: ([v[i] for i in idx] if isinstance(v, list) and len(v) == n else v) for k, v in dict(data.meta_info).items()
    }
    return out


@register_adv_est(AdvantageEstimator.NORM)
def compute_norm_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    reward_norm: Any = None,
    adv_norm: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalisation-driven outcome advantage (`algorithm.adv_estimator=norm`).

    r = outcome reward per response; `algorithm.reward_norm` (if set) normalises r, then
    `algorithm.adv_norm` (if set) normalises the result; both are `NormConfig`s applied per
    response (`normalize_by_config`), and the value is broadcast to the response's tokens. The
    presets (GRPO = adv_norm group/group, Dr.GRPO = group/null, RLOO = group/null + leave1out,
    LitePPO = group/batch) reproduce the named estimators. Returns (advantages, advantages).
    """
    reward_norm = reward_norm if reward_norm is not None else config_get(config, "reward_norm", None)
    adv_norm = adv_norm if adv_norm is not None else config_get(config, "adv_norm", None)
    if reward_norm is None and adv_norm is None:
        raise ValueError("algorithm.adv_estimator=norm needs algorithm.reward_norm and/or algorithm.adv_norm to be set")
    with torch.no_grad():
        x = _outcome_scores(token_level_rewards, response_mask)
        if reward_norm is not None:
            x = normalize_by_config(x, reward_norm, index=index)
        if adv_norm is not None:
            x = normalize_by_config(x, adv_norm, index=index)
        adv = _broadcast(x, response_mask)
    return adv, adv


# =============================================================================================
# Reward shaping
# =============================================================================================


def compute_overlong_penalty(
    response_length: torch.Tensor | int | float,
    max_response_length: int,
    overlong_buffer_len: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor | float:
    """DAPO soft overlong penalty (added to the score by the reward manager).

    With `safe = max_response_length - overlong_buffer_len`: length <= safe -> 0; safe < length <=
    max -> `(safe - length) / overlong_buffer_len`; beyond max -> -1; all times `penalty_factor`.
    Accepts a python number (returns a float) or a tensor of lengths (returns a float tensor).
    """
    if not 0 < overlong_buffer_len <= max_response_length:
        raise ValueError(
            f"overlong_buffer_len={overlong_buffer_len} must be in (0, max_response_length={max_response_length}]"
        )
    safe = max_response_length - overlong_buffer_len
    if torch.is_tensor(response_length):
        length = response_length.to(torch.float32)
        ramp = (safe - length) / overlong_buffer_len
        pen = torch.where(
            length <= safe,
            torch.zeros_like(length),
            torch.where(length <= max_response_length, ramp, -torch.ones_like(length)),
        )
        return pen * penalty_factor
    length = float(response_length)
    if length <= safe:
        return 0.0
    if length <= max_response_length:
        return (safe - length) / overlong_buffer_len * penalty_factor
    return -1.0 * penalty_factor
