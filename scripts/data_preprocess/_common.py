"""Shared part of the data_preprocess scripts: the command line, finding and reading the split files,
loading from the hub, building rows of verl's RL schema and writing parquet.

A script only defines how one source record becomes one RL row (``convert``) and calls `run`.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from collections.abc import Callable

# the scripts run as files (python scripts/data_preprocess/x.py): make the repository importable
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from verl.utils.dataset.files import read_file_rows  # noqa: E402

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


def rl_row(data_source: str, question: str, instruction: str, ground_truth: str, extra_info: dict) -> dict:
    """One row of the RL schema: a single user message ``question + " " + instruction``."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question + " " + instruction}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
    }


# convert(record, split, index, where, args) -> one RL row; `where` names the record in errors
Convert = Callable[[dict, str, int, str, argparse.Namespace], dict]


def run(
    argv: list[str] | None,
    *,
    description: str,
    default_save_dir: str,
    hub_name: str,
    hub_config: str | None,
    required_columns: tuple[str, ...],
    convert: Convert,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> dict[str, str]:
    """The command line shared by the scripts: read every requested split (local files or the hub),
    convert every record, and only then write ``{split}.parquet`` into --local_save_dir, so a bad
    record or a missing split leaves no partial output. Returns split -> written path."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local_dataset_path", default=None, help="directory (or file) with the train/test splits")
    p.add_argument("--local_save_dir", default=default_save_dir)
    p.add_argument("--from_hub", action="store_true", help=f"download {hub_name} with `datasets` (needs network)")
    p.add_argument("--splits", nargs="+", default=["train", "test"])
    if add_arguments is not None:
        add_arguments(p)
    args = p.parse_args(argv)
    if (args.local_dataset_path is None) == (not args.from_hub):
        p.error("give exactly one of --local_dataset_path DIR or --from_hub")
    converted: dict[str, list[dict]] = {}
    for split in args.splits:
        if args.from_hub:
            source = f"{hub_name}:{split}"
            records = load_from_hub(hub_name, hub_config, split)
        else:
            source = find_split_file(args.local_dataset_path, split)
            records = read_file_rows(source)
        rows = []
        for i, rec in enumerate(records):
            where = f"{source} (row {i})"
            require_columns(rec, required_columns, where)
            rows.append(convert(rec, split, i, where, args))
        converted[split] = rows
    out_dir = os.path.expanduser(args.local_save_dir)
    written = {}
    for split, rows in converted.items():
        path = os.path.join(out_dir, f"{split}.parquet")
        write_parquet(rows, path)
        written[split] = path
        print(f"{split}: {len(rows)} rows -> {path}")
    return written
