"""KL to the reference policy: the per-token estimators (`kl_penalty`, `kl_penalty_forward`),
the KL-shaped reward (`compute_rewards`) and the controllers of the in-reward coefficient
(`algorithm.kl_ctrl`). Tensors are [B, L] over the response tokens. Re-exported by `core_algos`."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.trainer.ppo.mode_names import _KL_BASE, KL_PENALTY_TYPES  # noqa: F401 - re-exported
from verl.utils.py_functional import config_get


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
