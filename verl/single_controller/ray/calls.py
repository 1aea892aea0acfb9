"""Waiting on Ray object refs with errors that name the worker: `ray_get_labeled`, `RefLabel`.

On import this module registers Ray's `ObjectRef` and `ray_get_labeled` with the data layer
(`verl.dataproto.futures.register_object_refs`), which is how a `DataProtoFuture` resolves its refs
without `verl.protocol` importing Ray. `WorkerCallError` (what a failed call raises) is the data
layer's class, re-exported here.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from verl.dataproto.futures import WorkerCallError, register_object_refs

__all__ = ["RefLabel", "WorkerCallError", "ray_get_labeled", "strip_ansi"]


@dataclass(frozen=True)
class RefLabel:
    """Who computes a Ray object ref: used to name the worker in error messages."""

    text: str
    rank: int | None = None
    method: str | None = None


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    """Ray colours its remote tracebacks for terminals; log files and assertions want plain text."""
    return _ANSI_ESCAPE.sub("", text)


def _call_error(label: RefLabel, err: Exception) -> WorkerCallError:
    if isinstance(err, RayTaskError):
        message = f"{label.text} raised an exception:\n{strip_ansi(str(err))}"
    else:
        message = f"{label.text} failed: the worker process died ({type(err).__name__}: {strip_ansi(str(err))})"
    return WorkerCallError(message, label.text, label.rank, label.method)


def ray_get_labeled(refs: list, labels: list | None = None, timeout: float | None = None) -> list:
    """`ray.get` on `refs`, failing fast: the first ref that resolves to an error raises
    WorkerCallError naming its label, without waiting for the others (which may be blocked in a
    collective with the failed worker). `timeout` (seconds, None = no limit) bounds the whole wait
    and raises TimeoutError naming the workers still running.
    """
    labels = list(labels) if labels is not None else [RefLabel(f"result {i}") for i in range(len(refs))]
    position = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
        if not ready:
            waiting = ", ".join(labels[position[r]].text for r in pending)
            raise TimeoutError(f"no result after {timeout} s from: {waiting}")
        for ref in ready:
            i = position[ref]
            try:
                results[i] = ray.get(ref)
            except (RayTaskError, RayActorError) as err:
                raise _call_error(labels[i], err) from err
            except GetTimeoutError:  # pragma: no cover - ray.wait said it is ready
                raise
    return results


register_object_refs(ray.ObjectRef, ray_get_labeled)
