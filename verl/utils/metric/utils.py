"""`reduce_metrics` and the `Metric` accumulator (upstream's `verl.utils.metric.utils`).

Workers report one value per micro-batch; the driver collects them per worker (one list entry
per worker after `DataProto.concat`) and reduces each key to one number before logging.
A `Metric` says how its values combine (mean / sum / min / max) instead of leaving it to the
key's name.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import numpy as np
import torch

__all__ = ["AggregationType", "Metric", "Numeric", "NumericType", "reduce_metrics"]

# what a `Metric` accepts: the tuple for isinstance checks, the union for annotations
NumericType = (int, float, torch.Tensor, np.integer, np.floating, np.ndarray)
Numeric = int | float | torch.Tensor | np.ndarray


class AggregationType(Enum):
    """How a `Metric`'s values combine into one number."""

    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


_REDUCERS = {
    AggregationType.MEAN: np.mean,
    AggregationType.SUM: np.sum,
    AggregationType.MIN: np.min,
    AggregationType.MAX: np.max,
}


class Metric:
    """Numbers collected for one metric key and the rule that combines them.

    `aggregation` is an `AggregationType` or its value (``"mean"``, ``"sum"``, ``"min"``,
    ``"max"``); `value` an optional first number (or list of numbers, or another `Metric`).
    Scalar tensors are stored as Python numbers (detached), so a `Metric` never keeps a graph.
    """

    def __init__(self, aggregation: str | AggregationType, value: Any = None) -> None:
        try:
            self.aggregation = AggregationType(aggregation)
        except ValueError:
            accepted = [a.value for a in AggregationType]
            raise ValueError(f"Unsupported aggregation type: {aggregation!r}; accepted: {accepted}") from None
        self.values: list = []
        if isinstance(value, (list, tuple)):
            self.extend(list(value))
        elif value is not None:
            self.append(value)

    def __repr__(self) -> str:
        return f"Metric({self.aggregation.value!r}, {self.values!r})"

    def append(self, value: Any) -> None:
        """Add one number (a scalar tensor counts as one); another `Metric` adds all of its values."""
        if isinstance(value, Metric):
            self.extend(value)
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"Only scalar tensors can be added to a Metric, got shape {tuple(value.shape)}")
            value = value.detach().item()
        if not isinstance(value, NumericType):
            raise ValueError(f"Unsupported value type for a Metric: {type(value).__name__}")
        self.values.append(value)

    def extend(self, values: Metric | list) -> None:
        """Add several numbers; a `Metric` must have the same aggregation."""
        if isinstance(values, Metric):
            if values.aggregation != self.aggregation:
                raise ValueError(f"Aggregation type mismatch: {self.aggregation} != {values.aggregation}")
            values = values.values
        for value in values:
            self.append(value)

    def aggregate(self) -> float:
        """The values combined by the aggregation (nan when empty)."""
        return self._aggregate(self.values, self.aggregation)

    @classmethod
    def _aggregate(cls, values, aggregation: AggregationType) -> float:
        if len(values) == 0:
            return float("nan")
        return _REDUCERS[aggregation](values)

    @classmethod
    def aggregate_dp(cls, metric_lists: list[Metric]) -> float:
        """Combine the same metric from several data-parallel ranks.

        Each rank holds one value per gradient-accumulation step (same count on every rank).
        mean / sum: average the ranks step by step, then aggregate over steps (a rank's sum
        over its micro-batches is one replica's share of the global value); min / max: over
        every value of every rank.
        """
        if not metric_lists:
            raise ValueError("Cannot aggregate an empty list of metrics.")
        lengths = [len(m.values) for m in metric_lists]
        if len(set(lengths)) != 1:
            raise ValueError(f"All Metric instances must have the same number of values for dp aggregation: {lengths}")
        aggregation = metric_lists[0].aggregation
        table = np.array([m.values for m in metric_lists], dtype=np.float64)  # [ranks, steps]
        if aggregation in (AggregationType.MEAN, AggregationType.SUM):
            return cls._aggregate(table.mean(axis=0), aggregation)
        return cls._aggregate(table.reshape(-1), aggregation)

    @classmethod
    def from_dict(cls, data: dict[str, Any], aggregation: str | AggregationType) -> dict[str, Metric]:
        """One `Metric` per key of `data`, each starting with that key's value."""
        return {key: cls(aggregation=aggregation, value=value) for key, value in data.items()}

    def init_list(self) -> Metric:
        """An empty `Metric` with the same aggregation."""
        return Metric(aggregation=self.aggregation)


def _flat_numbers(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in _flat_numbers(item)]
    if isinstance(value, np.ndarray):
        return _flat_numbers(value.tolist()) if value.dtype == object else value.reshape(-1).tolist()
    if isinstance(value, torch.Tensor):
        return value.detach().float().reshape(-1).tolist()
    if isinstance(value, Metric):
        return list(value.values)
    return [value]


def _key_reducer(key: str):
    """Upstream's rule for plain lists: a key naming a maximum (minimum) keeps the largest
    (smallest) value, every other key the mean."""
    if "max" in key:
        return np.max
    if "min" in key:
        return np.min
    return np.mean


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """One number per metric key (a new dict; `metrics` is not changed).

    - a `Metric`: its own aggregation; a list of `Metric`s (one per rank): `Metric.aggregate_dp`;
    - a list / tuple / array / tensor of numbers, possibly nested (one entry per worker, each a
      list of per-micro-batch values whose counts may differ): reduced over all its numbers,
      with the max for keys containing ``"max"``, the min for keys containing ``"min"``, the
      mean otherwise; an empty list gives nan;
    - anything else (a number, a string) is passed through.
    """
    out = {}
    for key, value in metrics.items():
        if isinstance(value, Metric):
            out[key] = value.aggregate()
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, Metric) for v in value):
            out[key] = Metric.aggregate_dp(list(value))
        elif isinstance(value, (list, tuple, np.ndarray, torch.Tensor)):
            numbers = np.asarray(_flat_numbers(value), dtype=np.float64)
            out[key] = float(_key_reducer(key)(numbers)) if numbers.size else float("nan")
        else:
            out[key] = value
    return out
