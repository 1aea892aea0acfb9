"""File-system helpers (upstream names `copy_to_local`, `is_non_local`, `local_mkdir_safe`) and
the atomic-write primitives the checkpoint code relies on.

Only local (and `file://`) paths are supported. Remote URIs (`hdfs://`, `s3://`, ...) raise a
clear error instead of being treated as local directory names.
"""

from __future__ import annotations

import os
import tempfile

_REMOTE_PREFIXES = ("hdfs://", "s3://", "gs://", "oss://", "abfs://", "http://", "https://")


def is_non_local(path: str) -> bool:
    """True for remote URIs (hdfs://, s3://, ...)."""
    return isinstance(path, str) and path.startswith(_REMOTE_PREFIXES)


def _local(path: str) -> str:
    if path.startswith("file://"):
        path = path[len("file://") :]
    if is_non_local(path):
        raise NotImplementedError(f"{path!r}: remote storage is not supported; copy it to a local path first")
    return os.path.expanduser(path)


def copy_to_local(
    src: str,
    cache_dir: str | None = None,
    filename: str | None = None,
    verbose: bool = False,
    always_recopy: bool = False,
    use_shm: bool = False,
) -> str:
    """The local path of `src` (a local path is returned as is; remote paths are not supported)."""
    return _local(src)


def local_mkdir_safe(path: str) -> str:
    """`mkdir -p` that tolerates a concurrent creator; returns the path."""
    path = _local(path)
    os.makedirs(path, exist_ok=True)
    return path


def fsync_dir(path: str) -> None:
    """Flush a directory entry (makes a rename inside it durable); no-op where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: str) -> None:
    """Flush every file and directory under `root` to stable storage (before a rename publishes
    them: otherwise a power loss can leave a published name with empty files)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            except OSError:
                pass
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def atomic_write_text(path: str, text: str) -> None:
    """Write `text` to `path` so that readers see the old content or the new one, never a part:
    write a temporary file in the same directory, fsync it, then `os.replace` it over `path`."""
    path = _local(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp_", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(directory)
