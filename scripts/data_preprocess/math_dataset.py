#!/usr/bin/env python
"""Convert the MATH dataset (``problem`` / ``solution`` columns) into verl's RL parquet schema.

    python scripts/data_preprocess/math_dataset.py --local_dataset_path DIR --local_save_dir ~/data/math
    python scripts/data_preprocess/math_dataset.py --from_hub --local_save_dir ~/data/math   # needs network

The ground truth is the content of the last ``\\boxed{...}`` of the reference solution (rows without
one are an error naming the row). Output rows::

    {"data_source": "DigitalLearningGmbH/MATH-lighteval",
     "prompt": [{"role": "user", "content": problem + " " + INSTRUCTION}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "\\frac{1}{2}"},
     "extra_info": {"split": "train", "index": i, "level": ..., "type": ...}}
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
from _common import find_split_file, load_from_hub, read_records, require_columns, write_parquet  # noqa: E402

from verl.utils.reward_score.math import last_boxed_only_string, remove_boxed  # noqa: E402

DEFAULT_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def convert(records: list[dict], split: str, source: str, data_source: str) -> list[dict]:
    rows = []
    for i, rec in enumerate(records):
        where = f"{source} (row {i})"
        require_columns(rec, ("problem", "solution"), where)
        boxed = last_boxed_only_string(rec["solution"])
        if boxed is None:
            raise ValueError(f"{where}: the solution has no complete \\boxed{{...}} answer: {rec['solution'][-80:]!r}")
        extra = {"split": split, "index": i}
        for key in ("level", "type", "subject", "unique_id"):
            if key in rec:
                extra[key] = rec[key]
        rows.append({
            "data_source": data_source,
            "prompt": [{"role": "user", "content": rec["problem"] + " " + INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": remove_boxed(boxed)},
            "extra_info": extra,
        })
    return rows


def main(argv=None) -> dict[str, str]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local_dataset_path", default=None, help="directory (or file) with the train/test splits")
    p.add_argument("--local_save_dir", default="~/data/math")
    p.add_argument("--from_hub", action="store_true", help=f"download {DEFAULT_SOURCE} with `datasets`")
    p.add_argument("--data_source", default=DEFAULT_SOURCE,
                   help="value of the data_source column (selects the scorer; any MATH source works)")
    p.add_argument("--splits", nargs="+", default=["train", "test"])
    args = p.parse_args(argv)
    if (args.local_dataset_path is None) == (not args.from_hub):
        p.error("give exactly one of --local_dataset_path DIR or --from_hub")
    out_dir = os.path.expanduser(args.local_save_dir)
    written = {}
    for split in args.splits:
        if args.from_hub:
            records, source = load_from_hub(DEFAULT_SOURCE, "default", split), f"{DEFAULT_SOURCE}:{split}"
        else:
            source = find_split_file(args.local_dataset_path, split)
            records = read_records(source)
        path = os.path.join(out_dir, f"{split}.parquet")
        write_parquet(convert(records, split, source, args.data_source), path)
        written[split] = path
        print(f"{split}: {len(records)} rows -> {path}")
    return written


if __name__ == "__main__":
    main()
