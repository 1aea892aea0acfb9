"""The registries of policy losses and advantage estimators, their registrars and getters, the
estimator traits and `AdvantageEstimator`: the bottom of the algorithm layer (the built-ins in this
package register into them; `core_algos`, upstream's facade, re-exports every name as the same
object).

Upstream's tests rebind `core_algos.ADV_ESTIMATOR_REGISTRY` / `POLICY_LOSS_REGISTRY` to a fresh dict
and expect later registrations to land there. So the registrars and getters use the dicts bound to
those names in `core_algos` when that module is loaded (looked up in `sys.modules` when they run;
no import), else the dicts of this module, which `core_algos` binds initially.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

logger = logging.getLogger("verl.trainer.ppo.core_algos")  # the facade's logger, as before the split

_FACADE = "verl.trainer.ppo.core_algos"


def _registry(name: str) -> dict:
    """The registry dict bound to `name` in core_algos if it is loaded, else this module's."""
    facade = sys.modules.get(_FACADE)
    bound = getattr(facade, name, None) if facade is not None else None
    return bound if isinstance(bound, dict) else globals()[name]


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
        registry = _registry("POLICY_LOSS_REGISTRY")
        current = registry.get(name)
        if current is not None and not _same_function(current, fn):
            logger.warning("policy loss %r: %s replaces the registered %s", name, _qualname(fn), _qualname(current))
        registry[name] = fn
        return fn

    return decorator


def get_policy_loss_fn(name: str) -> Callable:
    """The policy loss registered as `name`; ValueError listing the registered names otherwise."""
    registry = _registry("POLICY_LOSS_REGISTRY")
    if name not in registry:
        raise ValueError(
            f"Unsupported loss mode: {name}. Supported modes are: {sorted(registry)}. "
            "Register your own with @register_policy_loss(name) in a module the trainer imports."
        )
    return registry[name]


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
    registry is looked up when the decorator runs, so code that rebinds
    `core_algos.ADV_ESTIMATOR_REGISTRY` registers into the new dict (see the module docstring).
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
        registry = _registry("ADV_ESTIMATOR_REGISTRY")
        current = registry.get(name)
        if current is not None and not _same_function(current, fn):
            raise ValueError(
                f"Adv estimator {name} has already been registered: {_qualname(current)} vs {_qualname(fn)}"
            )
        registry[name] = fn
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
    return frozenset(n for n in _registry("ADV_ESTIMATOR_REGISTRY") if getattr(get_adv_estimator_traits(n), trait))


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> Callable:
    """The estimator registered under the name; ValueError listing the registered ones otherwise."""
    name = _enum_name(name_or_enum)
    registry = _registry("ADV_ESTIMATOR_REGISTRY")
    if name not in registry:
        raise ValueError(
            f"Unknown advantage estimator simply: {name}. Registered estimators: {sorted(registry)}. "
            "Register your own with @register_adv_est(name) in a module the trainer imports."
        )
    return registry[name]


def _to_float(value: Any) -> float:
    if torch.is_tensor(value):
        return float(value.detach().float().item())
    return float(value)
