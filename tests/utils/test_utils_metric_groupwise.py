"""verl.utils.metric, verl.utils.groupwise and metric_utils.compute_variance_proxy_metrics (hand-worked)."""

import math

import numpy as np
import pytest
import torch

from verl import DataProto
from verl.trainer.ppo.metric_utils import compute_variance_proxy_metrics
from verl.trainer.ppo.metric_utils import reduce_metrics as trainer_reduce
from verl.utils.groupwise import as_torch_index, group_mean_std
from verl.utils.metric import reduce_metrics


def test_reduce_metrics_averages_per_worker_nested_lists():
    # what DataProto.concat of two workers gives: one entry per worker, each a per-micro-batch list
    metrics = {"loss": [[1.0, 2.0], [3.0]], "lr": [1e-3, 1e-3], "t": torch.tensor([1.0, 3.0]), "name": "x", "none": []}
    out = reduce_metrics(metrics)
    assert (
        out["loss"] == pytest.approx(2.0)
        and out["lr"] == pytest.approx(1e-3)
        and out["t"] == 2.0
        and out["name"] == "x"
    )
    assert math.isnan(out["none"])
    metrics.pop("none")
    assert trainer_reduce(metrics) == {k: v for k, v in out.items() if k != "none"}


def test_groupwise_ids_and_stats():
    g = as_torch_index(np.array(["b", "a", "b", "c"], dtype=object))
    assert g.tolist() == [0, 1, 0, 2]
    assert as_torch_index(torch.tensor([7, 7, 3])).tolist() == [0, 0, 1]
    mean, std, count = group_mean_std(torch.tensor([1.0, 5.0, 3.0, 7.0]), g, eps=0.0)
    # group b = {1, 3}: mean 2, unbiased std sqrt(2); singletons: mean 0, std 1
    assert mean.tolist() == [2.0, 0.0, 0.0] and count.tolist() == [2.0, 1.0, 1.0]
    assert std.tolist() == pytest.approx([math.sqrt(2.0), 1.0, 1.0])


def _proxy_batch(with_is: bool) -> DataProto:
    tensors = {
        "old_log_probs": torch.full((2, 2), math.log(0.5)),  # pi = 0.5
        "sum_pi_squared": torch.full((2, 2), 0.5),  # w per token = 1 - 2 * 0.5 + 0.5 = 0.5
        "advantages": torch.tensor([[1.0, 1.0], [-1.0, -3.0]]),  # per-sequence A = 1, -2
        "response_mask": torch.ones(2, 2),
    }
    if with_is:
        tensors["rollout_is_weights"] = torch.tensor([[2.0, 2.0], [1.0, 1.0]])
    return DataProto.from_dict(tensors=tensors)


def test_variance_proxy_metrics_hand_worked():
    out = compute_variance_proxy_metrics(_proxy_batch(False), gradient_norm=1.0)
    # W = 0.5 + 0.5 = 1 per sequence; proxy2 = mean(1 * 1, 4 * 1) = 2.5; noise = (2.5 - 1) / (2 - 1)
    assert out == pytest.approx(
        {
            "variance_proxy/proxy1_signal_strength": 1.0,
            "variance_proxy/proxy2_total_power": 2.5,
            "variance_proxy/proxy3_pure_noise": 1.5,
            "variance_proxy/expected_a_squared": 2.5,
            "variance_proxy/expected_w": 1.0,
        }
    )
    with_is = compute_variance_proxy_metrics(_proxy_batch(True))
    # W scaled by rho^2: sequence 0 = 2 * 0.5 * 4 = 4, sequence 1 = 1; proxy2 = mean(4 * 1 * 1, 1 * 4 * 1) = 4
    assert with_is["variance_proxy/expected_w"] == pytest.approx(2.5)
    assert with_is["variance_proxy/proxy2_total_power"] == pytest.approx(4.0)
    assert (
        with_is["variance_proxy/proxy1_signal_strength"] == 0.0 and with_is["variance_proxy/proxy3_pure_noise"] == 0.0
    )
    assert compute_variance_proxy_metrics(DataProto.from_dict(tensors={"advantages": torch.ones(2, 2)})) == {}


def test_debug_marked_timer_accumulates_and_hdfs_io_local_ops(tmp_path):
    import time as _time

    from verl.utils import hdfs_io
    from verl.utils.debug import log_gpu_memory_usage, marked_timer

    timing = {}
    for _ in range(2):
        with marked_timer("gen", timing, color="red"):
            _time.sleep(0.01)
    assert timing["gen"] >= 0.02
    if not torch.cuda.is_available():
        assert log_gpu_memory_usage("x") is None
    target = tmp_path / "a" / "b"
    hdfs_io.makedirs(str(target), exist_ok=True)
    (target / "f.txt").write_text("hi")
    assert hdfs_io.exists(str(target / "f.txt"))
    hdfs_io.copy(str(target), str(tmp_path / "c"))
    assert (tmp_path / "c" / "f.txt").read_text() == "hi"
    with pytest.raises(NotImplementedError, match="hdfs://nn/x"):
        hdfs_io.exists("hdfs://nn/x")
