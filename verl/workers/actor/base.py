"""The actor interface: a policy that computes log-probabilities and updates itself."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

__all__ = ["BasePPOActor"]


class BasePPOActor(ABC):
    """What the worker needs from a policy engine.

    Args:
        config: the actor config (`verl.workers.config.ActorConfig`).
    """

    def __init__(self, config):
        self.config = config

    @abstractmethod
    def compute_log_prob(self, data, calculate_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probabilities [b, response_length] of `data.batch["responses"]` (and entropies)."""

    @abstractmethod
    def update_policy(self, data) -> dict:
        """One PPO update over `data` (mini-batches x micro-batches x epochs); returns metrics."""
