"""Which accelerator this process computes on, in one place.

Everything that must choose between CUDA and CPU (tensor placement, the torch.distributed backend,
memory statistics) asks this module, so a CPU-only laptop and a GPU node run the same code.

The choice is automatic (CUDA when `torch.cuda.is_available()`), and can be forced with the
environment variable `VERL_DEVICE`:

- unset, empty or ``auto``: CUDA if available, else CPU;
- ``cpu``: CPU even on a GPU machine (useful for tests and for debugging on a GPU node);
- ``cuda``: CUDA, and a clear error if no CUDA device is visible.

`is_cuda_available` is evaluated once at import, as in upstream verl; the functions re-read the
environment on every call so that a process which sets `VERL_DEVICE` after importing verl (for
example a Ray worker whose environment is given through `runtime_env`) still gets what it asked for.
"""

from __future__ import annotations

import os

import torch

__all__ = [
    "is_cuda_available",
    "is_npu_available",
    "get_device_name",
    "get_torch_device",
    "get_device_id",
    "get_dist_backend",
    "get_nccl_backend",
    "get_visible_devices_keyword",
]

_DEVICE_ENV = "VERL_DEVICE"
_ACCEPTED = ("auto", "cpu", "cuda")


def _requested_device() -> str:
    value = os.environ.get(_DEVICE_ENV, "").strip().lower() or "auto"
    if value not in _ACCEPTED:
        raise ValueError(
            f"{_DEVICE_ENV}={os.environ.get(_DEVICE_ENV)!r} is not understood; accepted values: {_ACCEPTED}"
        )
    return value


def _use_cuda() -> bool:
    requested = _requested_device()
    if requested == "cpu":
        return False
    available = torch.cuda.is_available()
    if requested == "cuda" and not available:
        raise RuntimeError(
            f"{_DEVICE_ENV}=cuda but torch sees no CUDA device (torch {torch.__version__}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    return available


is_cuda_available: bool = _use_cuda()
# Ascend NPUs are not supported by this implementation; the name exists because upstream code tests it.
is_npu_available: bool = False


def get_device_name() -> str:
    """Return ``"cuda"`` or ``"cpu"``: the device type tensors of this process should live on."""
    return "cuda" if _use_cuda() else "cpu"


class _CpuDeviceShim:
    """Stands in for the `torch.cuda` module on CPU so device-agnostic code needs no branches.

    Only the calls that training code makes on the device module are provided; each does the CPU
    equivalent (seeding and RNG state go to torch's CPU generator, memory statistics are zero,
    synchronisation and cache clearing are no-ops because CPU kernels are synchronous).
    """

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def set_device(self, device) -> None:
        pass

    def synchronize(self, device=None) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_rng_state(self, device=None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device=None) -> None:
        torch.set_rng_state(state)

    def memory_allocated(self, device=None) -> int:
        return 0

    def memory_reserved(self, device=None) -> int:
        return 0

    def max_memory_allocated(self, device=None) -> int:
        return 0

    def max_memory_reserved(self, device=None) -> int:
        return 0

    def reset_peak_memory_stats(self, device=None) -> None:
        pass

    def mem_get_info(self, device=None) -> tuple[int, int]:
        # (free, total) of host memory, so "fraction of memory free" computations stay meaningful.
        try:
            pages = os.sysconf("SC_PHYS_PAGES")
            avail = os.sysconf("SC_AVPHYS_PAGES")
            size = os.sysconf("SC_PAGE_SIZE")
            return avail * size, pages * size
        except (ValueError, OSError, AttributeError):
            return 0, 0

    def __repr__(self) -> str:
        return "<verl cpu device shim>"


_cpu_shim = _CpuDeviceShim()


def get_torch_device():
    """Return `torch.cuda` on CUDA, else a CPU shim with the same commonly used functions."""
    return torch.cuda if _use_cuda() else _cpu_shim


def get_device_id() -> int:
    """Index of this process's current device (`torch.cuda.current_device()`; 0 on CPU)."""
    return torch.cuda.current_device() if _use_cuda() else 0


def get_dist_backend() -> str:
    """torch.distributed backend for this device: ``"nccl"`` on CUDA, ``"gloo"`` on CPU."""
    return "nccl" if _use_cuda() else "gloo"


def get_nccl_backend() -> str:
    """Upstream name for the collective backend; here it falls back to gloo on CPU."""
    return get_dist_backend()


def get_visible_devices_keyword() -> str:
    """Environment variable that restricts the devices a process sees."""
    return "CUDA_VISIBLE_DEVICES"


def resolve_device(requested: str) -> str:
    """`auto` -> cuda when torch sees a GPU, else cpu; `cuda` without a GPU raises."""
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device=cuda but torch sees no CUDA device; use trainer.device=cpu or auto")
    return requested
