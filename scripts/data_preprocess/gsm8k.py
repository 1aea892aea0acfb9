#!/usr/bin/env python
"""Convert GSM8K into verl's RL parquet schema.

    python scripts/data_preprocess/gsm8k.py --local_dataset_path DIR --local_save_dir ~/data/gsm8k
    python scripts/data_preprocess/gsm8k.py --from_hub --local_save_dir ~/data/gsm8k   # needs network

Input rows have ``question`` and ``answer`` (the worked solution ending in ``#### <number>``). Output
rows (``train.parquet`` and ``test.parquet`` in --local_save_dir)::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": i, "question": question, "answer": answer}}
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import find_split_file, load_from_hub, read_records, require_columns, write_parquet  # noqa: E402

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_FINAL = re.compile(r"####\s*(-?[0-9.,]+)")


def extract_ground_truth(answer: str, where: str) -> str:
    """The number after ``####`` in a reference solution, without thousands separators."""
    found = _FINAL.search(answer)
    if not found:
        raise ValueError(f"{where}: the answer has no '#### <number>' line: {answer[-80:]!r}")
    return found.group(1).replace(",", "").rstrip(".")


def convert(records: list[dict], split: str, source: str) -> list[dict]:
    rows = []
    for i, rec in enumerate(records):
        where = f"{source} (row {i})"
        require_columns(rec, ("question", "answer"), where)
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": rec["question"] + " " + INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": extract_ground_truth(rec["answer"], where)},
            "extra_info": {"split": split, "index": i, "question": rec["question"], "answer": rec["answer"]},
        })
    return rows


def main(argv=None) -> dict[str, str]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local_dataset_path", default=None, help="directory (or file) with the train/test splits")
    p.add_argument("--local_save_dir", default="~/data/gsm8k")
    p.add_argument("--from_hub", action="store_true", help="download openai/gsm8k (config 'main') with `datasets`")
    p.add_argument("--splits", nargs="+", default=["train", "test"])
    args = p.parse_args(argv)
    if (args.local_dataset_path is None) == (not args.from_hub):
        p.error("give exactly one of --local_dataset_path DIR or --from_hub")
    out_dir = os.path.expanduser(args.local_save_dir)
    written = {}
    for split in args.splits:
        if args.from_hub:
            records, source = load_from_hub("openai/gsm8k", "main", split), f"openai/gsm8k:{split}"
        else:
            source = find_split_file(args.local_dataset_path, split)
            records = read_records(source)
        path = os.path.join(out_dir, f"{split}.parquet")
        write_parquet(convert(records, split, source), path)
        written[split] = path
        print(f"{split}: {len(records)} rows -> {path}")
    return written


if __name__ == "__main__":
    main()
