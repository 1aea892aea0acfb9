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

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import rl_row, run  # noqa: E402  (also makes `verl` importable)

from verl.utils.reward_score.math import last_boxed_only_string, remove_boxed  # noqa: E402

DEFAULT_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def convert(rec: dict, split: str, index: int, where: str, args) -> dict:
    boxed = last_boxed_only_string(rec["solution"])
    if boxed is None:
        raise ValueError(f"{where}: the solution has no complete \\boxed{{...}} answer: {rec['solution'][-80:]!r}")
    extra = {"split": split, "index": index}
    extra.update({key: rec[key] for key in ("level", "type", "subject", "unique_id") if key in rec})
    return rl_row(args.data_source, rec["problem"], INSTRUCTION, remove_boxed(boxed), extra)


def _add_arguments(p) -> None:
    p.add_argument(
        "--data_source",
        default=DEFAULT_SOURCE,
        help="value of the data_source column (selects the scorer; any MATH source works)",
    )


def main(argv=None) -> dict[str, str]:
    return run(
        argv,
        description=__doc__,
        default_save_dir="~/data/math",
        hub_name=DEFAULT_SOURCE,
        hub_config="default",
        required_columns=("problem", "solution"),
        convert=convert,
        add_arguments=_add_arguments,
    )


if __name__ == "__main__":
    main()
