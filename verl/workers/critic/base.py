"""The critic interface: a value model that computes V(s) and updates itself."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

__all__ = ["BasePPOCritic"]


class BasePPOCritic(ABC):
    """What the worker needs from a value-model engine."""

    def __init__(self, config):
        self.config = config

    @abstractmethod
    def compute_values(self, data) -> torch.Tensor:
        """Values [b, response_length] of the response positions."""

    @abstractmethod
    def update_critic(self, data) -> dict:
        """Value-loss updates over `data`; returns metrics."""
