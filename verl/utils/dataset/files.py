"""Reading tabular data files (parquet and JSON lines) into lists of row dicts.

Every row remembers where it came from, so datasets can name the file and row index when a row is
malformed (``RowSource``). Nested columns (lists of chat messages, dicts) come back as plain Python
lists/dicts, never numpy arrays.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SUPPORTED_SUFFIXES = (".parquet", ".jsonl", ".json")


@dataclass(frozen=True)
class RowSource:
    """Where a row was read from: the file path and its 0-based row index in that file."""

    path: str
    row: int

    def __str__(self) -> str:
        return f"{self.path} (row {self.row})"


def normalize_paths(data_files) -> list[str]:
    """Accept a path, a list/tuple/ListConfig of paths; expand ``~`` and check that each exists."""
    if data_files is None:
        raise ValueError("no data files given (got None); pass a parquet/jsonl path or a list of them")
    if isinstance(data_files, (str, os.PathLike)):
        paths = [data_files]
    elif isinstance(data_files, Iterable):
        paths = list(data_files)
    else:
        raise TypeError(f"data files must be a path or a list of paths, got {type(data_files).__name__}")
    if not paths:
        raise ValueError("the list of data files is empty")
    out = []
    for p in paths:
        p = os.path.expanduser(str(p))
        if not os.path.exists(p):
            raise FileNotFoundError(f"data file not found: {p}")
        if not p.endswith(SUPPORTED_SUFFIXES):
            raise ValueError(f"unsupported data file type: {p}; expected one of {', '.join(SUPPORTED_SUFFIXES)}")
        out.append(p)
    return out


def read_file_rows(path: str) -> list[dict]:
    """All rows of one parquet / jsonl file as dicts. A ``.json`` file may hold one JSON array of
    objects or, like ``.jsonl``, one object per line."""
    if path.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        # one local file: ParquetFile reads it directly; read_table would go through pyarrow.dataset,
        # whose import (with pandas) costs ~0.35 s at start-up for the same table
        try:
            return pq.ParquetFile(path).read().to_pylist()
        except pa.ArrowInvalid as exc:  # pyarrow's messages ("Parquet file size is 0 bytes") omit the path
            raise ValueError(f"{path}: not a readable parquet file ({exc})") from exc
        except OSError as exc:
            if path in str(exc):
                raise
            raise OSError(exc.errno, f"{path}: cannot read the parquet file ({exc})") from exc
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json") and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} (line {e.lineno}): not a valid JSON array ({e.msg})") from e
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise ValueError(
                    f"{path} (row {i}): expected a JSON object per array element, got {type(row).__name__}"
                )
        return rows
    rows = []
    # split on "\n" only: str.splitlines would also cut at U+2028 etc., which JSON strings may hold raw
    for line_no, line in enumerate(text.split("\n")):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path} (line {line_no + 1}): not valid JSON ({e.msg}); expected one object per line"
            ) from e
        if not isinstance(row, dict):
            raise ValueError(f"{path} (line {line_no + 1}): expected a JSON object per line, got {type(row).__name__}")
        rows.append(row)
    return rows


def read_rows(data_files) -> tuple[list[dict], list[RowSource]]:
    """Concatenate the rows of all files; returns (rows, sources) with ``sources[i]`` for ``rows[i]``."""
    rows: list[dict] = []
    sources: list[RowSource] = []
    for path in normalize_paths(data_files):
        file_rows = read_file_rows(path)
        rows.extend(file_rows)
        sources.extend(RowSource(path, i) for i in range(len(file_rows)))
    return rows, sources


def to_plain(value):
    """Convert numpy scalars/arrays (as pandas or datasets may hand them over) into Python objects."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return value
    if isinstance(value, np.ndarray):
        return [to_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def validate_messages(messages, where: RowSource | str, key: str) -> list[dict]:
    """Check that ``messages`` is a non-empty list of {"role": str, "content": str} dicts."""
    messages = to_plain(messages)
    expected = 'a non-empty list of chat messages like [{"role": "user", "content": "..."}]'
    if not isinstance(messages, Sequence) or isinstance(messages, str) or len(messages) == 0:
        raise ValueError(f"{where}: column {key!r} must be {expected}, got {_short(messages)}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(
                f"{where}: column {key!r} message {i} must be a dict with str 'role' and 'content', got {_short(m)}"
            )
    return list(messages)


def _short(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
