"""metric_utils: the rollout MoE load-balance metrics and accumulator, timing and throughput
(hand-worked numbers)."""

import math
from types import SimpleNamespace

import pytest
import torch

from verl import DataProto
from verl.trainer.ppo import metric_utils as mu


def _routed(*per_position):
    """routed_experts [1, S, layers, top_k] from one [layers, top_k] list per position."""
    return torch.tensor([list(per_position)], dtype=torch.long)


def test_counts_skip_the_last_valid_token_of_each_row():
    # row 0: 3 valid tokens, so positions 0 and 1 count; row 1: 1 valid token, nothing counts
    routed = torch.tensor([[[[1]], [[3]], [[0]]], [[[2]], [[2]], [[2]]]])  # [2, 3, 1 layer, top-1]
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    counts = mu._compute_rollout_moe_load_counts(routed, mask, num_experts=4)
    assert counts.tolist() == [[0, 1, 0, 1]]


def test_violation_metrics_hand_worked():
    # 2 layers, top-2, 4 experts; the prompt position (first) and the last token do not count
    routed = _routed(
        [[3, 3], [3, 3]],  # prompt position: outside the response
        [[0, 1], [1, 1]],
        [[2, 3], [1, 1]],
        [[0, 0], [0, 0]],  # last token: filler
    )
    mask = torch.ones(1, 3)
    m = mu.compute_rollout_moe_load_balance_metrics(routed, mask, num_experts=4, prefix="p")
    # layer 0: one assignment each -> share 1/4, violation 0 everywhere
    assert (m["p/max_vio/layer_0"], m["p/min_vio/layer_0"], m["p/avg_vio/layer_0"]) == (0.0, 0.0, 0.0)
    # layer 1: all four on expert 1 -> violations [-1, 3, -1, -1], mean |v| = 6 / 4
    assert (m["p/max_vio/layer_1"], m["p/min_vio/layer_1"], m["p/avg_vio/layer_1"]) == (3.0, -1.0, 1.5)
    assert m["p/max_vio/max"] == 3.0 and m["p/max_vio/avg"] == 1.5
    assert m["p/min_vio/max"] == 0.0 and m["p/min_vio/avg"] == -0.5
    assert m["p/avg_vio/max"] == 1.5 and m["p/avg_vio/avg"] == 0.75


@pytest.mark.parametrize(
    ("routed", "mask", "experts"),
    [
        (None, torch.ones(1, 2), 4),
        (torch.zeros(1, 2, 1, dtype=torch.long), torch.ones(1, 2), 4),  # not 4-D
        (torch.zeros(1, 2, 1, 1, dtype=torch.long), torch.ones(2, 2), 4),  # batch mismatch
        (torch.zeros(1, 1, 1, 1, dtype=torch.long), torch.ones(1, 2), 4),  # shorter than the response
        (torch.zeros(1, 2, 1, 1, dtype=torch.long), torch.ones(1, 0), 4),  # no response columns
        (torch.full((1, 3, 1, 1), 4, dtype=torch.long), torch.ones(1, 3), 4),  # id out of range
        (torch.zeros(1, 2, 1, 1, dtype=torch.long), torch.ones(1, 2), None),  # unknown expert count
    ],
)
def test_nothing_to_count_gives_no_metrics(routed, mask, experts):
    assert mu.compute_rollout_moe_load_balance_metrics(routed, mask, experts) == {}


def test_accumulator_sums_an_interval_then_starts_again():
    acc = mu.RolloutMoELoadBalanceMetricsAccumulator()
    mask = torch.ones(1, 2)
    assert acc.update(_routed([[0]], [[0]]), mask, num_experts=2)  # expert 0 once
    assert acc.update(_routed([[0]], [[0]]), mask, num_experts=2)  # expert 0 again
    assert not acc.update(None, mask, num_experts=2)
    assert acc.total_assignments() == 2
    assert acc.compute()["rollout/moe/max_vio/layer_0"] == 1.0  # share [1, 0] * 2 - 1
    acc.pop_metrics()
    assert acc.total_assignments() == 0 and acc.compute() == {}


def test_compute_moe_lb_metrics_reports_on_interval_steps():
    acc = mu.RolloutMoELoadBalanceMetricsAccumulator(model_config={"model_type": "mixtral", "num_local_experts": 2})
    batch = SimpleNamespace(batch={"routed_experts": _routed([[1]], [[0]], [[0]]), "response_mask": torch.ones(1, 3)})
    assert mu.compute_moe_lb_metrics(batch, 0, 2, acc) == {}  # off
    assert mu.compute_moe_lb_metrics(batch, 2, 1, acc) == {}  # counted, not reported
    out = mu.compute_moe_lb_metrics(batch, 2, 2, acc)
    # two steps of [expert 1, expert 0]: balanced
    assert out["rollout/moe/routed_expert_assignments"] == 4 and out["rollout/moe/routed_experts_found"] == 1.0
    assert out["rollout/moe/avg_vio/avg"] == 0.0 and acc.total_assignments() == 0


def test_infer_num_experts_reads_nested_configs_and_the_model_dir(tmp_path):
    assert mu.infer_moe_num_experts({"hf_config": {"text_config": {"n_routed_experts": 6}}}) == 6
    assert mu.infer_moe_num_experts({"override_config": {"model_config": {"num_experts": 3}}}) == 3
    assert mu.infer_moe_num_experts({"model_type": "qwen3_moe", "num_local_experts": 4}) is None
    from transformers import MixtralConfig

    MixtralConfig(num_local_experts=8, hidden_size=16, intermediate_size=16, num_hidden_layers=1).save_pretrained(
        tmp_path
    )
    assert mu.infer_rollout_moe_num_experts({"path": str(tmp_path)}) == 8
    model = {"path": str(tmp_path), "override_config": {"model_config": {"num_local_experts": 4}}}
    assert mu.infer_rollout_moe_num_experts(model) == 4


def test_optional_routed_experts_fetch_falls_back_and_waits_an_interval():
    asked = []

    def get(keys, partition_id, select_fields):
        asked.append(list(select_fields))
        if "routed_experts" in select_fields:
            raise ValueError("no field routed_experts")
        return "data"

    acc = mu.RolloutMoELoadBalanceMetricsAccumulator()
    for step in (3, 4, 6):
        assert mu.get_metric_data_with_optional_routed_experts(["k"], "train", ["a"], 3, step, acc, get) == "data"
    assert asked == [["a", "routed_experts"], ["a"], ["a"], ["a", "routed_experts"], ["a"]]


def _batch(prompt_valid, response_valid):
    """Batch of 2 with 2 prompt and 2 response columns, valid tokens as given per row."""
    rows = zip(prompt_valid, response_valid, strict=True)
    attn = torch.tensor([[1] * p + [0] * (2 - p) + [1] * r + [0] * (2 - r) for p, r in rows])
    return DataProto.from_dict({"responses": torch.zeros(2, 2, dtype=torch.long), "attention_mask": attn})


def test_timing_per_token_divides_by_the_phase_tokens():
    batch = _batch([2, 1], [2, 0])  # 3 prompt + 2 response tokens
    m = mu.compute_timing_metrics(batch, {"gen": 0.5, "update_actor": 1.0, "step": 2.0})
    assert m["timing_per_token_ms/gen"] == pytest.approx(500 / 2)
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(1000 / 5)
    assert m["timing_s/step"] == 2.0 and "timing_per_token_ms/step" not in m
    assert mu.compute_timing_metrics(_batch([0, 0], [0, 0]), {"gen": 0.5})["timing_per_token_ms/gen"] == 0.0


def test_throughput_prefers_the_trainers_token_count():
    batch = _batch([2, 1], [2, 0])
    assert mu.compute_throughout_metrics(batch, {"step": 2.0}, n_gpus=1)["perf/total_num_tokens"] == 5
    batch.meta_info["global_token_num"] = [10, 20]
    m = mu.compute_throughout_metrics(batch, {"step": 2.0}, n_gpus=3)
    assert m["perf/total_num_tokens"] == 30 and math.isclose(m["perf/throughput"], 30 / 6)
