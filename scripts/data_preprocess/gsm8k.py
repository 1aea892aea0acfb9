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

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import rl_row, run  # noqa: E402

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_FINAL = re.compile(r"####\s*(-?[0-9.,]+)")


def extract_ground_truth(answer: str, where: str) -> str:
    """The number after ``####`` in a reference solution, without thousands separators."""
    found = _FINAL.search(answer)
    if not found:
        raise ValueError(f"{where}: the answer has no '#### <number>' line: {answer[-80:]!r}")
    return found.group(1).replace(",", "").rstrip(".")


def convert(rec: dict, split: str, index: int, where: str, args) -> dict:
    extra = {"split": split, "index": index, "question": rec["question"], "answer": rec["answer"]}
    return rl_row(DATA_SOURCE, rec["question"], INSTRUCTION, extract_ground_truth(rec["answer"], where), extra)


def main(argv=None) -> dict[str, str]:
    return run(
        argv,
        description=__doc__,
        default_save_dir="~/data/gsm8k",
        hub_name=DATA_SOURCE,
        hub_config="main",
        required_columns=("question", "answer"),
        convert=convert,
    )


if __name__ == "__main__":
    main()
