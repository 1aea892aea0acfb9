"""verl.utils.metric as a package: `Metric`, `AggregationType`, `reduce_metrics` (hand-worked)."""

import importlib
import math

import numpy as np
import pytest
import torch

from verl.utils.metric import AggregationType, Metric, reduce_metrics


def test_package_paths_are_the_same_objects():
    utils = importlib.import_module("verl.utils.metric.utils")
    assert utils.Metric is Metric and utils.reduce_metrics is reduce_metrics
    assert utils.AggregationType is AggregationType


@pytest.mark.parametrize(("aggregation", "expected"), [("mean", 2.5), ("sum", 10.0), ("min", 1.0), ("max", 4.0)])
def test_metric_aggregates_by_its_rule(aggregation, expected):
    m = Metric(aggregation, value=[3.0, 1.0])
    m.append(torch.tensor(4.0))  # a scalar tensor is stored as a number
    m.extend([2])
    assert m.values == [3.0, 1.0, 4.0, 2] and m.aggregate() == expected


def test_metric_rejects_bad_input_with_the_accepted_values():
    with pytest.raises(ValueError, match=r"'median'.*'mean', 'sum', 'min', 'max'"):
        Metric("median")
    with pytest.raises(ValueError, match=r"scalar tensors.*\(2,\)"):
        Metric("mean").append(torch.ones(2))
    with pytest.raises(ValueError, match="str"):
        Metric("mean").append("1.0")
    with pytest.raises(ValueError, match="mismatch"):
        Metric("mean").extend(Metric("sum", 1.0))
    assert math.isnan(Metric("max").aggregate())


def test_aggregate_dp_means_ranks_step_by_step_for_sums():
    # two ranks, two accumulation steps each: sum over steps of the per-step rank mean
    ranks = [Metric("sum", [1.0, 5.0]), Metric("sum", [3.0, 7.0])]
    assert Metric.aggregate_dp(ranks) == (1 + 3) / 2 + (5 + 7) / 2
    assert Metric.aggregate_dp([Metric("min", [4.0, 2.0]), Metric("min", [3.0, 9.0])]) == 2.0
    with pytest.raises(ValueError, match=r"\[2, 1\]"):
        Metric.aggregate_dp([Metric("sum", [1.0, 2.0]), Metric("sum", [1.0])])
    with pytest.raises(ValueError, match="empty"):
        Metric.aggregate_dp([])


def test_from_dict_and_init_list():
    ms = Metric.from_dict({"a": 1.0, "b": 2}, aggregation=AggregationType.SUM)
    assert {k: (m.aggregation, m.values) for k, m in ms.items()} == {
        "a": (AggregationType.SUM, [1.0]),
        "b": (AggregationType.SUM, [2]),
    }
    fresh = ms["a"].init_list()
    assert fresh.aggregation is AggregationType.SUM and fresh.values == [] and ms["a"].values == [1.0]


def test_reduce_metrics_uses_metric_rules_then_key_names():
    metrics = {
        "actor/loss": [[1.0, 2.0], [6.0]],  # nested per-worker lists: mean over all numbers
        "agent/decode_batch_size/max": [[3, 9], [4]],  # a maximum stays a maximum
        "x/min": np.array([5.0, -2.0]),
        "tokens": Metric("sum", [10, 20]),
        "per_rank": [Metric("sum", [1.0, 2.0]), Metric("sum", [3.0, 4.0])],
        "note": "kept",
    }
    before = {k: v for k, v in metrics.items()}
    out = reduce_metrics(metrics)
    assert out == {
        "actor/loss": 3.0,
        "agent/decode_batch_size/max": 9.0,
        "x/min": -2.0,
        "tokens": 30,
        "per_rank": 5.0,  # (1 + 3) / 2 + (2 + 4) / 2
        "note": "kept",
    }
    assert metrics == before  # a new dict: the caller's metrics are left as they were
