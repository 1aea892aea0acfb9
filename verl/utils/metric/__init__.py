"""Metric reduction shared by the trainers (upstream's `verl.utils.metric` package)."""

from verl.utils.metric.utils import AggregationType, Metric, reduce_metrics

__all__ = ["reduce_metrics", "AggregationType", "Metric"]
