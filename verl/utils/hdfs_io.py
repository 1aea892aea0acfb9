"""Upstream's `verl.utils.hdfs_io` file operations, for local paths.

`exists`, `makedirs` and `copy` act on the local file system. Remote paths (``hdfs://``) raise
NotImplementedError naming the path: this project reads and writes checkpoints and data on
local or mounted storage only (see docs/checkpoints.md).
"""

from __future__ import annotations

import os
import shutil

__all__ = ["copy", "exists", "makedirs"]


def _local(path: str) -> str:
    if "://" in str(path):
        raise NotImplementedError(f"{path!r}: remote storage is not supported here; use a local or mounted path")
    return str(path)


def exists(path: str, **kwargs) -> bool:
    return os.path.exists(_local(path))


def makedirs(name: str, mode: int = 0o777, exist_ok: bool = False, **kwargs) -> None:
    os.makedirs(_local(name), mode=mode, exist_ok=exist_ok)


def copy(src: str, dst: str, **kwargs) -> str:
    """Copy a file or a directory tree; returns `dst`."""
    src, dst = _local(src), _local(dst)
    if os.path.isdir(src):
        shutil.copytree(src, dst, dirs_exist_ok=kwargs.get("dirs_exist_ok", False))
    else:
        shutil.copy2(src, dst)
    return dst
