"""Reward shaping on the driver (`compute_overlong_penalty`, DAPO's soft length penalty).
Re-exported by `core_algos`."""

from __future__ import annotations

import torch


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
