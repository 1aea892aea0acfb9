"""Score a parquet of generated responses offline (upstream main's entry point and `evaluation.yaml`):

    python -m verl.trainer.main_eval data.path=gen.parquet [custom_reward_function.path=my_reward.py]

Every row holds a list of responses (`data.response_key`, as `main_generation_server` writes it),
its data source (`data.data_source_key`) and `reward_model.ground_truth`. Each response is scored
by the reward function: `custom_reward_function.{path,name}` (a user file, called with
`reward_kwargs`), else the shipped `default_compute_score` chosen by data source; it is called as
`fn(data_source, solution_str, ground_truth, extra_info)` (extra_info when the row has one) and
returns a float or a dict with `score` (and optionally `acc`).

Scoring runs in `ray_kwargs.ray_init.num_cpus` worker processes (default: the CPU count; processes
of the standard library, no Ray), each call bounded by `scoring.timeout` seconds (the worker of a
call past it is killed and replaced). A call that raises or times out scores `scoring.error_score`
and is counted (`test_score/errors`); `error_score: null` stops instead, naming the row.

Printed (and returned): per data source `test_score/<ds>` (the mean score over every response; with
the same number of responses per row, the mean of the per-prompt means that upstream prints) and
`test_score/<ds>/pass@k` for k = 1, 2, 4, ... up to the responses per row (unbiased estimator over
the rows: 1 - C(n - c, k) / C(n, k), c the correct responses of a row; correct means `acc` when the
scorer returns one, else score > 0).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import defaultdict

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

logger = logging.getLogger(__name__)

__all__ = ["evaluate", "pass_at_k", "main"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of `k` responses drawn without replacement from `n`, of
    which `c` are correct, is correct."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} responses per row, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _reward_fn(config):
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.reward_score import default_compute_score

    return get_custom_reward_fn(config) or default_compute_score


def _score_value(value) -> tuple[float, bool]:
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"the reward function returned a dict without 'score': {sorted(value)}")
        score = float(value["score"])
        return score, bool(value["acc"]) if "acc" in value else score > 0
    return float(value), float(value) > 0


def _calls(config, rows) -> tuple[list[dict], list[int]]:
    d = config.data
    calls, owner = [], []
    for i, row in enumerate(rows):
        for key in (d.response_key, d.data_source_key, d.reward_model_key):
            if key not in row:
                raise KeyError(f"{d.path} (row {i}): missing column {key!r}; columns present: {sorted(row)}")
        responses = row[d.response_key]
        responses = [responses] if isinstance(responses, str) else list(responses)
        gt = (row[d.reward_model_key] or {}).get("ground_truth")
        for r in responses:
            call = {"data_source": row[d.data_source_key], "solution_str": r, "ground_truth": gt}
            if row.get("extra_info") is not None:
                call["extra_info"] = row["extra_info"]
            calls.append(call)
            owner.append(i)
    return calls, owner


def _run_calls(fn, calls: list[dict], config) -> list:
    from verl.utils.reward_score.bounded import ScorerPool
    from verl.workers.reward_manager.registry import loaded_user_files

    workers = OmegaConf.select(config, "ray_kwargs.ray_init.num_cpus") or os.cpu_count() or 1
    timeout = OmegaConf.select(config, "scoring.timeout", default=30.0)
    pool = ScorerPool(fn, max(1, min(int(workers), len(calls))), loaded_user_files())
    try:
        return pool.run(calls, None if timeout is None else float(timeout))
    finally:
        pool.close()


def evaluate(config) -> dict[str, float]:
    """Score `data.path` and return the metrics (see the module docstring)."""
    from verl.utils.dataset.files import read_rows

    rows, _ = read_rows(config.data.path)
    calls, owner = _calls(config, rows)
    if not calls:
        raise ValueError(f"{config.data.path} holds no responses in column {config.data.response_key!r}")
    outcomes = _run_calls(_reward_fn(config), calls, config)
    error_score = OmegaConf.select(config, "scoring.error_score", default=0.0)
    per_row: dict[int, list[tuple[float, bool]]] = defaultdict(list)
    errors = 0
    for call, row, outcome in zip(calls, owner, outcomes, strict=True):
        if outcome.ok:
            per_row[row].append(_score_value(outcome.value))
            continue
        if error_score is None:
            raise RuntimeError(
                f"{config.data.path} (row {row}, {call['data_source']}): scoring failed: {outcome.error}"
            )
        errors += 1
        per_row[row].append((float(error_score), False))
    return _metrics(rows, per_row, config.data.data_source_key, errors)


def _metrics(rows, per_row, source_key: str, errors: int) -> dict[str, float]:
    by_source: dict[str, list[list[tuple[float, bool]]]] = defaultdict(list)
    for i, scored in sorted(per_row.items()):
        by_source[rows[i][source_key]].append(scored)
    metrics: dict[str, float] = {}
    for ds, groups in by_source.items():
        metrics[f"test_score/{ds}"] = float(np.mean([s for g in groups for s, _ in g]))
        n = min(len(g) for g in groups)
        k = 1
        while k <= n:
            metrics[f"test_score/{ds}/pass@{k}"] = float(
                np.mean([pass_at_k(len(g), sum(ok for _, ok in g), k) for g in groups])
            )
            k *= 2
    metrics["test_score/errors"] = float(errors)
    return metrics


@hydra.main(config_path="config", config_name="evaluation", version_base=None)
def main(config: DictConfig) -> None:
    metrics = evaluate(config)
    print(json.dumps(metrics))


if __name__ == "__main__":
    main()
