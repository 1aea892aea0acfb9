"""Staleness of trajectories from per-token versions (`async_trainer.trajectory_staleness`)."""

from __future__ import annotations

import torch

from verl.trainer.ppo.async_trainer import trajectory_staleness


def test_staleness_counts_the_oldest_valid_token():
    versions = torch.tensor([[4, 4, 4], [3, 4, 9], [2, 2, 2]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    # row 1: oldest valid token sampled with version 3 (the padded 9 does not count); row 2: no
    # valid token, its first column's version
    assert trajectory_staleness(versions, mask, 5).tolist() == [1, 2, 3]
