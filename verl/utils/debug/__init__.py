"""Timing and memory-logging helpers (upstream's `verl.utils.debug` names)."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager

__all__ = ["log_gpu_memory_usage", "marked_timer"]


@contextmanager
def marked_timer(name: str, timing_raw: dict, color: str | None = None, **kwargs):
    """Add the seconds spent in the block to ``timing_raw[name]`` (accumulating over repeated
    blocks). `color` and extra keywords are profiler-range options upstream; accepted, unused."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + (time.perf_counter() - start)


def log_gpu_memory_usage(
    head: str, logger: logging.Logger | None = None, level: int = logging.DEBUG, rank: int | None = 0
) -> str | None:
    """Log (or print, without `logger`) the accelerator memory in GiB, prefixed by `head`, on
    process rank `rank` (None: every rank). Returns the message, or None when there is no
    CUDA device or this is another rank."""
    import torch

    if not torch.cuda.is_available():
        return None
    if (
        rank is not None
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_rank() != rank
    ):
        return None
    gib = 1024**3
    message = (
        f"{head}, memory allocated (GB): {torch.cuda.memory_allocated() / gib:.2f}, "
        f"memory reserved (GB): {torch.cuda.memory_reserved() / gib:.2f}, "
        f"device memory used/total (GB): {(torch.cuda.mem_get_info()[1] - torch.cuda.mem_get_info()[0]) / gib:.2f}/"
        f"{torch.cuda.mem_get_info()[1] / gib:.2f}"
    )
    if logger is None:
        print(message)
    else:
        logger.log(level, message)
    return message
