"""Dynamic GAE lambda: `algorithm.lam` as a number, a registered function name
(`vapo_length_adaptive`, `relative_position`), a dotted path or a callable of a
`GAELambdaContext` giving one lambda per trajectory [B]. Re-exported by `core_algos`."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from verl.trainer.ppo.algos.registry import _same_function


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
