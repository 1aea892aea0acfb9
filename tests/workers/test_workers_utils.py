"""Engine utilities: micro-batch planning and row compaction, rank balancing, FSDP helpers on one
process (clipping, schedules, autocast dtype), user-module imports, tokenizer loading."""

from __future__ import annotations

import functools
import math
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.utils.seqlen_balancing import (
    get_reverse_idx,
    get_seqlen_balanced_partitions,
    log_seqlen_unbalance,
    micro_batch_cost,
    padding_stats,
    plan_micro_batches,
    plan_micro_batches_for_mask,
    rearrange_micro_batches,
)
from verl.workers.engine.padding_free import compact_rows, response_outputs

# ---------------------------------------------------------------------------------------------
# micro-batch planning
# ---------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=40), budget=st.integers(50, 300))
def test_token_budget_plan_covers_rows_once_and_respects_budget(lengths, budget):
    groups = plan_micro_batches(lengths, max_token_len=budget, same_micro_num_in_dp=False)
    flat = sorted(i for g in groups for i in g)
    assert flat == list(range(len(lengths)))
    assert all(g for g in groups)
    assert all(micro_batch_cost(lengths, g) <= budget for g in groups)


def test_forced_micro_batch_count_and_minimum():
    lengths = [10, 9, 8, 2, 2, 2, 1, 1]
    groups = plan_micro_batches(lengths, max_token_len=100, min_num_micro_batch=3, same_micro_num_in_dp=False)
    assert len(groups) == 3 and sorted(i for g in groups for i in g) == list(range(8))
    with pytest.raises(ValueError, match="does not fit the token budget"):
        plan_micro_batches([5, 120], max_token_len=100)


def test_sorted_fixed_size_plan_reduces_padding():
    lengths = [30, 3, 28, 4, 29, 2, 27, 5]
    unsorted = plan_micro_batches(lengths, micro_batch_size=2, sort_by_length=False)
    sorted_ = plan_micro_batches(lengths, micro_batch_size=2)
    assert unsorted == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert padding_stats(lengths, sorted_)["padding_waste"] < 0.1 < padding_stats(lengths, unsorted)["padding_waste"]


def test_rearrange_micro_batches_and_reverse_index():
    from tensordict import TensorDict

    mask = torch.tensor([[1] * n + [0] * (6 - n) for n in (6, 1, 4, 2, 5, 3)])
    td = TensorDict({"attention_mask": mask, "x": torch.arange(6)}, batch_size=[6])
    micro, idx = rearrange_micro_batches(td, max_token_len=8)
    flat = [i for g in idx for i in g]
    restored = torch.cat([m["x"] for m in micro])[get_reverse_idx(flat)]
    assert torch.equal(restored, torch.arange(6))
    micro, idx = rearrange_micro_batches(td, max_token_len=100, num_batches_divided_by=3)
    assert len(micro) == 3


def test_balanced_partitions():
    lengths = [100, 1, 90, 2, 80, 3, 70, 4]
    parts = get_seqlen_balanced_partitions(lengths, 2, equal_size=True)
    assert sorted(i for p in parts for i in p) == list(range(8)) and all(len(p) == 4 for p in parts)
    sums = [sum(lengths[i] for i in p) for p in parts]
    assert max(sums) - min(sums) <= 20  # consecutive chunks would differ by 166
    metrics = log_seqlen_unbalance(lengths, parts, prefix="balance")
    assert metrics["balance/balanced_max"] < metrics["balance/max"]
    with pytest.raises(ValueError, match="divisible"):
        get_seqlen_balanced_partitions(lengths, 3, equal_size=True)


def test_compact_rows_removes_padding_and_keeps_positions():
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 0], [9, 10, 11, 12, 13, 0, 0], [0, 14, 0, 15, 16, 17, 18]])
    mask = (ids != 0).long()
    pos = torch.clip(mask.cumsum(-1) - 1, min=0)
    packed = compact_rows(ids, mask, pos)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 0], [9, 10, 11, 12, 13], [14, 15, 16, 17, 18]]
    assert packed.attention_mask.tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert packed.position_ids[2].tolist() == [0, 1, 2, 3, 4]  # the hole at column 2 is dropped
    assert packed.column_index[0, 5].item() == 3 and packed.column_index[2, 6].item() == 4
    full = compact_rows(ids[1:2, :5], mask[1:2, :5], pos[1:2, :5])
    assert full.attention_mask is None  # no padding left: models use pure causal attention


def test_plan_for_mask_modes_and_missing_budget():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0], [1, 1, 1, 0]])
    # fixed size, compacted: longest first; padded: consecutive rows
    assert plan_micro_batches_for_mask(mask, micro_batch_size=2) == [[1, 3], [0, 2]]
    assert plan_micro_batches_for_mask(mask, micro_batch_size=2, remove_padding=False) == [[0, 1], [2, 3]]
    assert plan_micro_batches_for_mask(mask) == [[1, 3, 0, 2]]  # no size: one micro-batch
    groups = plan_micro_batches_for_mask(mask, use_dynamic_bsz=True, max_token_len=6)
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3] and len(groups) == 3
    with pytest.raises(ValueError, match="token budget"):
        plan_micro_batches_for_mask(mask, use_dynamic_bsz=True, max_token_len=None)


@pytest.mark.parametrize("remove_padding", [True, False])
def test_response_outputs_reads_the_predicting_positions_with_or_without_keep(remove_padding):
    # prompt width 3 (left-padded), response width 3 (right-padded); a fake model whose output at
    # position t is (position id, token id), so the read positions are visible
    ids = torch.tensor([[4, 5, 6, 7, 8, 0], [4, 5, 6, 7, 0, 0], [0, 5, 6, 7, 8, 9]])
    mask = (ids != 0).long()
    pos = torch.clip(mask.cumsum(-1) - 1, min=0)
    keeps = []

    def forward(keep, *, input_ids, attention_mask, position_ids, truncate):
        keeps.append(keep)
        out = torch.stack([position_ids, input_ids], dim=-1)
        return out[:, -keep:] if truncate else out

    for truncate in (False, True):
        out, valid, (n_valid, slots) = response_outputs(
            functools.partial(forward, truncate=truncate), ids, mask, pos, 3, remove_padding=remove_padding
        )
        assert valid.tolist() == [[True, True, False], [True, False, False], [True, True, True]]
        # response token j is predicted by the token before it: (its position - 1, the previous id)
        assert out[0, :2].tolist() == [[2, 6], [3, 7]]
        assert out[1, :1].tolist() == [[2, 6]]
        assert out[2].tolist() == [[1, 6], [2, 7], [3, 8]]
        assert n_valid == int(mask.sum()) and slots == (3 * 5 if remove_padding else ids.numel())
    # only the positions from the first response predictor on are asked for (compact width 5:
    # row 2's first predictor is at 1; padded width 6: R + 1)
    assert keeps[0] == 4


# ---------------------------------------------------------------------------------------------
# FSDP helpers (single process)
# ---------------------------------------------------------------------------------------------


def test_clip_grad_norm_measures_clips_and_detects_non_finite():
    from verl.utils.fsdp_utils import clip_grad_norm_

    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.tensor([3.0, 4.0, 0.0, 0.0])
    norm = clip_grad_norm_([p], max_norm=1.0)
    assert norm.item() == pytest.approx(5.0)
    assert p.grad.norm().item() == pytest.approx(1.0, rel=1e-5)
    p.grad = torch.tensor([float("inf"), 1.0, 0.0, 0.0])
    norm = clip_grad_norm_([p], max_norm=1.0)
    assert not math.isfinite(norm.item()) and p.grad[1].item() == 1.0  # untouched


def test_lr_schedules_warmup_constant_and_cosine():
    from verl.utils.fsdp_utils import build_lr_scheduler
    from verl.workers.config import OptimizerConfig

    def lrs(cfg, steps):
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
        sched = build_lr_scheduler(opt, cfg)
        out = []
        for _ in range(steps):
            out.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        return out

    const = lrs(OptimizerConfig(lr=1.0, lr_warmup_steps=2), 4)
    assert const == pytest.approx([0.0, 0.5, 1.0, 1.0])
    cos = lrs(
        OptimizerConfig(
            lr=1.0, lr_warmup_steps=0, lr_scheduler_type="cosine", total_training_steps=4, min_lr_ratio=0.1
        ),
        5,
    )
    assert cos[0] == pytest.approx(1.0) and cos[4] == pytest.approx(0.1) and cos[2] == pytest.approx(0.55)
    ratio = lrs(OptimizerConfig(lr=1.0, lr_warmup_steps_ratio=0.5, total_training_steps=4), 3)
    assert ratio == pytest.approx([0.0, 0.5, 1.0])
    with pytest.raises(ValueError, match="total_training_steps"):
        lrs(OptimizerConfig(lr=1.0, lr_scheduler_type="cosine"), 1)


def test_compute_dtype_resolution():
    from verl.utils.fsdp_utils import resolve_compute_dtype
    from verl.workers.config import FSDPEngineConfig, MixedPrecisionConfig

    assert resolve_compute_dtype(FSDPEngineConfig(), "cpu") is None
    assert resolve_compute_dtype(FSDPEngineConfig(cpu_autocast_bf16=True), "cpu") is torch.bfloat16
    assert resolve_compute_dtype(FSDPEngineConfig(), "cuda") is torch.bfloat16
    assert (
        resolve_compute_dtype(FSDPEngineConfig(mixed_precision=MixedPrecisionConfig(param_dtype="fp32")), "cuda")
        is None
    )


# ---------------------------------------------------------------------------------------------
# imports and tokenizers
# ---------------------------------------------------------------------------------------------


def test_import_external_libs_files_modules_and_errors(tmp_path):
    from verl.utils.import_utils import import_external_libs, load_extern_type

    f = tmp_path / "my_ext.py"
    f.write_text("COUNT = 0\nCOUNT += 1\ndef fn():\n    return 42\n")
    (mod,) = import_external_libs(str(f))
    again = import_external_libs([str(f)])[0]
    assert mod is again and mod.COUNT == 1  # imported once per process
    assert load_extern_type(str(f), "fn")() == 42
    assert import_external_libs("json, math")[1] is sys.modules["math"]
    assert import_external_libs(None) == []
    with pytest.raises(FileNotFoundError, match="does not exist"):
        import_external_libs(str(tmp_path / "missing.py"))
    with pytest.raises(ImportError, match="no_such_module_xyz"):
        import_external_libs("no_such_module_xyz")
    with pytest.raises(AttributeError, match="defines no 'nope'"):
        load_extern_type(str(f), "nope")


def test_hf_tokenizer_sets_pad_and_processor_is_none_for_text(tmp_path):
    from test_workers_common import build_tokenizer

    from verl.utils.tokenizer import hf_processor, hf_tokenizer

    build_tokenizer(str(tmp_path))
    tok = hf_tokenizer(str(tmp_path))
    assert tok.pad_token_id == 0
    assert hf_processor(str(tmp_path)) is None
