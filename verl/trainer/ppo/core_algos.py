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
it is given the mini-batch-global denominators; the engine writes them into the loss's
`config.global_batch_info` and every loss passes `**batch_info_of(config)` on (docs/algorithms.md).

Layout: this module owns the registries, their registrars and getters, the estimator traits and
`AdvantageEstimator`; the built-in functions live in `verl.trainer.ppo.algos` (`aggregation`, `kl`,
`policy_losses`, `normalization`, `gae_lambda`, `advantages`, `token_baselines`, `rewards`),
imported at the bottom of this file and re-exported here as the same objects. The registrars look
`ADV_ESTIMATOR_REGISTRY` / `POLICY_LOSS_REGISTRY` up as globals of this module when they run, so
rebinding them here (as upstream's tests do) redirects later registrations. Rebinding a function
here does not reach the built-ins, though: monkeypatching `core_algos.agg_loss` changes what user
code calling `core_algos.agg_loss` gets, while the built-in losses keep calling the `agg_loss`
they imported from `algos.aggregation` (`algos.policy_losses.agg_loss` is the name they look up).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

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
    "LOSS_AGG_MODES",
    "GLOBAL_BATCH_INFO_KEYS",
    "agg_loss",
    "batch_info_of",
    "BatchLossStats",
    "compute_batch_loss_stats",
    "merge_batch_loss_stats",
    "make_global_batch_info",
    "compute_group_num_tokens",
    # KL
    "KL_PENALTY_TYPES",
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
# The built-in functions, one module per section (verl/trainer/ppo/algos/). They import the
# registrars above, so they come last; importing them registers the built-ins. The names are
# re-exported here as the same objects.
# =============================================================================================

from verl.trainer.ppo.algos.advantages import (  # noqa: E402
    compute_gae_advantage_return,
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_process_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_norm_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_pf_ppo_reweight_data,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    step_rewards_to_go,
)
from verl.trainer.ppo.algos.aggregation import (  # noqa: E402
    GLOBAL_BATCH_INFO_KEYS,
    LOSS_AGG_MODES,
    BatchLossStats,
    agg_loss,
    batch_info_of,
    compute_batch_loss_stats,
    compute_group_num_tokens,
    make_global_batch_info,
    merge_batch_loss_stats,
)
from verl.trainer.ppo.algos.gae_lambda import (  # noqa: E402
    GAE_LAMBDA_FN_REGISTRY,
    GAELambdaContext,
    register_gae_lambda_fn,
    relative_position,
    resolve_gae_lambda,
    vapo_length_adaptive,
)
from verl.trainer.ppo.algos.gae_lambda import (  # noqa: E402
    _resolve_callable as _resolve_callable,  # validate_config resolves algorithm.lam with it
)
from verl.trainer.ppo.algos.kl import (  # noqa: E402
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    compute_rewards,
    get_kl_controller,
    kl_penalty,
    kl_penalty_forward,
)
from verl.trainer.ppo.algos.normalization import (  # noqa: E402
    normalize_by_config,
)
from verl.trainer.ppo.algos.policy_losses import (  # noqa: E402
    compute_entropy_loss,
    compute_policy_loss,
    compute_policy_loss_bypass_mode,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_pg,
    compute_policy_loss_reinforce,
    compute_policy_loss_sapo,
    compute_policy_loss_up,
    compute_policy_loss_vanilla,
    compute_value_loss,
)
from verl.trainer.ppo.algos.rewards import (  # noqa: E402
    compute_overlong_penalty,
)
from verl.trainer.ppo.algos.token_baselines import (  # noqa: E402
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
