"""Bit-identical runs: deterministic kernels and the environment a run depends on.

Why kernels: with more than one torch thread, the CPU backward of indexing with repeated indices
(`x[index]`, whose gradient is `index_put_(..., accumulate=True)`) adds the rows of one
destination from several threads with atomic float additions, in whatever order the threads
reach them. The prefix grouper selects each shared prompt's KV cache and last logits once per
row that repeats it (`verl.workers.engine.padding_free.shared_prefix_outputs`), so its gradient
takes this path and the sums come out in a different rounding from run to run (~1e-7 relative).
`torch.use_deterministic_algorithms` makes that kernel add serially, in index order (it covers
every op torch documents as nondeterministic, in our code, transformers' and peft's).

`environment()` is what a checkpoint records so `verl.trainer.replay` can say when it replays a
step elsewhere: versions of torch / transformers / verl, the thread count, the device.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

import torch

__all__ = [
    "DeterminismState",
    "current_determinism",
    "set_deterministic",
    "restore_determinism",
    "environment",
    "environment_differences",
]


@dataclass(frozen=True)
class DeterminismState:
    """torch's process-wide determinism settings (what `set_deterministic` changes)."""

    enabled: bool
    warn_only: bool
    fill_uninitialized_memory: bool


def current_determinism() -> DeterminismState:
    """This process's settings now."""
    import torch.utils.deterministic as det

    return DeterminismState(
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        bool(det.fill_uninitialized_memory),
    )


def set_deterministic(enabled: bool) -> DeterminismState:
    """Switch torch's deterministic algorithms on (or off) for this process; returns the previous
    settings (for `restore_determinism`).

    On: `torch.use_deterministic_algorithms(True, warn_only=True)`: an op without a deterministic
    implementation (some CUDA kernels) warns instead of failing the run. Filling uninitialized
    memory (torch's default in this mode, a debugging aid that writes every new tensor once) is
    turned off: it costs a pass over every allocation and no result depends on it. On CUDA the
    cuBLAS workspace is fixed (`CUBLAS_WORKSPACE_CONFIG`, unless set) as cuBLAS needs for
    reproducible matrix products; it takes effect when the process creates its cuBLAS handle.
    """
    import torch.utils.deterministic as det

    previous = current_determinism()
    if enabled:
        if torch.cuda.is_available():
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        det.fill_uninitialized_memory = False
    else:
        torch.use_deterministic_algorithms(False)
    return previous


def restore_determinism(state: DeterminismState) -> None:
    """Put back the settings `set_deterministic` returned."""
    import torch.utils.deterministic as det

    torch.use_deterministic_algorithms(state.enabled, warn_only=state.warn_only)
    det.fill_uninitialized_memory = state.fill_uninitialized_memory


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # not installed (or no metadata): recorded as unknown
        return None


def environment(threads: int | None = None, device: str | None = None) -> dict[str, object]:
    """What a run's numbers depend on besides its config and data: package versions, the workers'
    torch threads (`threads`: `trainer.torch_threads_per_worker`; None: derived from the CPUs,
    so `cpu_count` is recorded too), the device (default: cuda when visible) and the CPU/GPU
    model. Plain JSON types."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and torch.cuda.is_available():
        hardware = torch.cuda.get_device_name(0)
    else:
        hardware = _cpu_model()
    return {
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "verl": _version("verl"),
        "python": platform.python_version(),
        "torch_threads": threads,
        "cpu_count": os.cpu_count(),
        "device": device,
        "hardware": hardware,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# keys that change results when they differ (python's version does not touch the arithmetic)
_RESULT_KEYS = ("torch", "transformers", "verl", "torch_threads", "cpu_count", "device", "hardware")


def environment_differences(recorded: dict, current: dict) -> list[str]:
    """`key: recorded -> current` for every result-relevant entry that differs."""
    return [
        f"{key}: {recorded.get(key)!r} -> {current.get(key)!r}"
        for key in _RESULT_KEYS
        if key in recorded and recorded.get(key) != current.get(key)
    ]
