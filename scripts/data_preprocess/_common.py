"""Shared helpers of the data_preprocess scripts: find local split files, load from the hub, write parquet."""

from __future__ import annotations

import glob
import json
import os
import sys

SPLIT_SUFFIXES = (".parquet", ".jsonl", ".json")


def find_split_file(local_dataset_path: str, split: str) -> str:
    """The file of ``split`` ("train"/"test") under ``local_dataset_path``.

    Accepted layouts: ``DIR/{split}.{parquet,jsonl,json}``, ``DIR/**/{split}-*.parquet`` (the Hugging Face
    hub layout, e.g. ``main/train-00000-of-00001.parquet``), or ``local_dataset_path`` itself being a
    single file whose name contains the split name.
    """
    path = os.path.expanduser(local_dataset_path)
    if os.path.isfile(path):
        if split in os.path.basename(path):
            return path
        raise FileNotFoundError(f"{path} is a single file but its name does not contain the split {split!r}")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--local_dataset_path {path} does not exist")
    candidates = [os.path.join(path, split + s) for s in SPLIT_SUFFIXES]
    candidates += sorted(glob.glob(os.path.join(path, "**", f"{split}-*.parquet"), recursive=True))
    candidates += sorted(glob.glob(os.path.join(path, "**", f"{split}.*"), recursive=True))
    for c in candidates:
        if os.path.isfile(c) and c.endswith(SPLIT_SUFFIXES):
            return c
    raise FileNotFoundError(
        f"no {split} file under {path}; expected {split}.parquet, {split}.jsonl or a hub-style {split}-*.parquet"
    )


def read_records(path: str) -> list[dict]:
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if path.endswith(".json") and stripped.startswith("["):
        return json.loads(text)
    rows = []
    for i, line in enumerate(text.splitlines()):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} (line {i + 1}): not valid JSON: {e.msg}") from e
    return rows


def load_from_hub(name: str, config: str | None, split: str) -> list[dict]:
    """Download one split with `datasets`; exits with a clear message when the hub cannot be reached."""
    try:
        import datasets

        ds = datasets.load_dataset(name, config, split=split) if config else datasets.load_dataset(name, split=split)
    except Exception as e:  # network errors come in many types (ConnectionError, OfflineModeIsEnabled, HfHubHTTPError)
        sys.exit(
            f"could not load {name}{'/' + config if config else ''} split {split!r} from the Hugging Face hub: "
            f"{type(e).__name__}: {e}\nWithout network access, download the dataset elsewhere and pass "
            f"--local_dataset_path DIR (with {split}.parquet or {split}.jsonl)."
        )
    return [dict(r) for r in ds]


def write_parquet(rows: list[dict], path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def require_columns(row: dict, columns: tuple[str, ...], where: str) -> None:
    missing = [c for c in columns if c not in row]
    if missing:
        raise KeyError(f"{where}: missing column(s) {missing}; columns present: {sorted(row)}")
