"""Safe and verifiable checkpoint files.

- `save_plain` / `load_plain`: `.pt` files hold only tensors and plain Python containers
  (dict, list, tuple, str, int, float, bool, None), checked before writing, and are read with
  `torch.load(..., weights_only=True)`: loading a checkpoint from elsewhere cannot run code.
  Random-generator states are stored in that form too (`rng_state_to_plain` turns numpy's state,
  which holds an ndarray, into lists; `rng_state_from_plain` turns it back).
- `write_manifest` / `verify_manifest`: `manifest.json` lists every file of a checkpoint
  directory with its size and SHA-256. It is written last, inside the directory that is then
  renamed into place, so a published checkpoint always has one; verifying it names the first
  missing, truncated or altered file (`CheckpointCorruptError`). A sub-directory with its own
  manifest (a worker group's part) is covered through that manifest.
- `disk_full_cause` recognises a full disk behind the errors it causes (`OSError` ENOSPC, and
  torch's zip writer's "unexpected pos"), so save errors can say so plainly.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
from typing import Any

import numpy as np
import torch

__all__ = [
    "MANIFEST_FILE",
    "CheckpointCorruptError",
    "check_plain",
    "disk_full_cause",
    "load_plain",
    "rng_state_from_plain",
    "rng_state_to_plain",
    "save_plain",
    "verify_manifest",
    "write_manifest",
]

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
_CHUNK = 8 << 20


class CheckpointCorruptError(ValueError):
    """A checkpoint file is missing, truncated or altered (`path` names it)."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


# ------------------------------------------------------------------------------- plain objects
_PLAIN_SCALARS = (str, int, float, bool, bytes, type(None))


def check_plain(obj: Any, where: str = "state") -> None:
    """Raise TypeError naming the first entry of `obj` that is not a tensor or plain container."""
    if isinstance(obj, _PLAIN_SCALARS) or isinstance(obj, torch.Tensor):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, (str, int, float, bool, type(None))):
                raise TypeError(f"{where} has a key {k!r} of type {type(k).__name__}; checkpoints hold plain keys")
            check_plain(v, f"{where}[{k!r}]")
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            check_plain(v, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}; checkpoint files hold only tensors and plain "
        "Python containers (dict, list, tuple, str, int, float, bool, None) so that they load with "
        "torch.load(weights_only=True). Convert it (e.g. an ndarray with .tolist() or torch.from_numpy)"
    )


def disk_full_cause(exc: BaseException, path: str | None = None) -> str | None:
    """A description of the full disk behind `exc` (or its causes), else None."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 10:
        text = str(e)
        if (
            (isinstance(e, OSError) and e.errno == errno.ENOSPC)
            or "no space left" in text.lower()
            or "ENOSPC" in text
            or "unexpected pos" in text
        ):
            break
        e = e.__cause__ or e.__context__
        seen += 1
    else:
        return None
    free = ""
    if path is not None:
        probe = path
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe)
        try:
            free = f", {shutil.disk_usage(probe or '.').free} bytes free"
        except OSError:
            pass
    return f"no space left on the device (ENOSPC{free})"


def save_plain(obj: Any, path: str, what: str | None = None) -> None:
    """`torch.save(obj, path)` after `check_plain`; a full disk is named as such, with the file."""
    check_plain(obj, what or os.path.basename(path))
    try:
        torch.save(obj, path)
    except Exception as exc:  # noqa: BLE001 - re-raised with the file and the cause
        cause = disk_full_cause(exc, path)
        if cause:
            raise OSError(errno.ENOSPC, f"writing {path} failed: {cause}") from exc
        raise


def load_plain(path: str) -> Any:
    """`torch.load(path, weights_only=True)` on CPU; a missing or unreadable file is named."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint file {path} is missing")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - re-raised naming the file
        text = str(exc)
        if "Weights only load failed" in text:
            found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
            what = f" ({found.group(1)})" if found else ""
            raise CheckpointCorruptError(
                f"checkpoint file {path} holds an object other than tensors and plain containers{what}; refused: "
                "loading it could run code. Re-save the state as plain tensors/containers",
                path,
            ) from exc
        raise CheckpointCorruptError(
            f"checkpoint file {path} cannot be read, it is damaged ({type(exc).__name__}: "
            f"{text.splitlines()[0][:300] if text else ''})",
            path,
        ) from exc


def rng_state_to_plain(state: dict) -> dict:
    """Copy of a {name: rng state} dict where numpy's legacy state tuple (it holds an ndarray) is
    replaced by lists; python `random` states and torch byte tensors are already plain."""
    out = {}
    for k, v in state.items():
        if isinstance(v, tuple) and len(v) == 5 and isinstance(v[1], np.ndarray):  # np.random.get_state()
            out[k] = {"numpy_mt19937": [v[0], v[1].tolist(), int(v[2]), int(v[3]), float(v[4])]}
        else:
            out[k] = v
    return out


def rng_state_from_plain(state: dict) -> dict:
    """Inverse of `rng_state_to_plain` (states saved before it existed pass through)."""
    out = {}
    for k, v in state.items():
        if isinstance(v, dict) and "numpy_mt19937" in v:
            name, keys, pos, has_gauss, cached = v["numpy_mt19937"]
            out[k] = (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached)
        elif isinstance(v, list) and k in ("python", "random"):
            out[k] = _to_tuple(v)  # tolerate a state that went through JSON-like lists
        else:
            out[k] = v
    return out


def _to_tuple(v):
    return tuple(_to_tuple(x) for x in v) if isinstance(v, list) else v


def all_rng_states() -> dict:
    """Python, numpy and torch (CPU, and CUDA when present) generator states, plain."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return rng_state_to_plain(state)


# ------------------------------------------------------------------------------- manifest
def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def write_manifest(directory: str) -> str:
    """Write `directory/manifest.json`: size and SHA-256 of every file below it, except files of a
    sub-directory that has its own manifest (that manifest is listed instead). Returns its path."""
    files: dict[str, dict] = {}
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, directory)
        if rel_dir != "." and MANIFEST_FILE in filenames:
            names = [MANIFEST_FILE]  # the part vouches for its own files
            dirnames[:] = []
        else:
            names = sorted(n for n in filenames if not (rel_dir == "." and n == MANIFEST_FILE))
        for name in names:
            path = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            files[rel] = {"size": os.path.getsize(path), "sha256": _sha256(path)}
    out = os.path.join(directory, MANIFEST_FILE)
    # written in place: `directory` is a staging directory nobody reads until it is renamed
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"version": MANIFEST_VERSION, "files": files}, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    return out


def verify_manifest(directory: str, recursive: bool = True, only: list[str] | None = None) -> bool:
    """Check the files of `directory` against its manifest; raise `CheckpointCorruptError` naming
    the first bad file. Returns False when there is no manifest (a checkpoint written before
    manifests existed: nothing to check), True when every listed file matches.

    `recursive` also verifies the manifests of sub-directories; `only` restricts the check to
    these relative paths (a worker checks the files it reads).
    """
    mpath = os.path.join(directory, MANIFEST_FILE)
    if not os.path.isfile(mpath):
        return False
    try:
        with open(mpath, encoding="utf-8") as fh:
            entries = json.load(fh)["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointCorruptError(f"checkpoint manifest {mpath} is unreadable ({exc})", mpath) from exc
    for rel, info in sorted(entries.items()):
        if only is not None and rel not in only:
            continue
        path = os.path.join(directory, rel)
        if not os.path.isfile(path):
            raise CheckpointCorruptError(f"checkpoint file {path} is missing (listed in {mpath})", path)
        size = os.path.getsize(path)
        if size != info["size"]:
            raise CheckpointCorruptError(
                f"checkpoint file {path} is {'truncated' if size < info['size'] else 'changed'}: {size} bytes, the "
                f"manifest says {info['size']}",
                path,
            )
        if _sha256(path) != info["sha256"]:
            raise CheckpointCorruptError(f"checkpoint file {path} is damaged: its SHA-256 differs from {mpath}", path)
        if recursive and os.path.basename(rel) == MANIFEST_FILE and os.path.dirname(rel):
            verify_manifest(os.path.dirname(path), recursive=True)
    return True
