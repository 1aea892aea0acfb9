"""Loss aggregation: reference gradients from ALGORITHMS.md section 3 and exact micro-batching
(loss and gradient of accumulated micro-batches == full batch, for every mode, with and without
data-parallel emulation)."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import (
    LOSS_AGG_MODES,
    agg_loss,
    batch_info_of,
    compute_batch_loss_stats,
    compute_group_num_tokens,
    make_global_batch_info,
    merge_batch_loss_stats,
)

# ---------------------------------------------------------------------------------------------
# reference numbers (ALGORITHMS.md section 3)
# ---------------------------------------------------------------------------------------------


def _reference_inputs():
    ratio = torch.ones(2, 7, requires_grad=True)
    adv = torch.full((2, 7), 2.0)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    return ratio, adv, mask


def test_reference_grad_seq_mean_token_mean():
    ratio, adv, mask = _reference_inputs()
    agg_loss(ratio * adv, mask, "seq-mean-token-mean").backward()
    expected = torch.tensor([[0.25] * 4 + [0.0] * 3, [2.0 / 14] * 7])
    torch.testing.assert_close(ratio.grad, expected, atol=1e-4, rtol=0)
    assert ratio.grad[1, 0].item() == pytest.approx(0.1429, abs=1e-4)


def test_reference_grad_seq_mean_token_sum_norm():
    ratio, adv, mask = _reference_inputs()
    agg_loss(ratio * adv, mask, "seq-mean-token-sum-norm", loss_scale_factor=7).backward()
    expected = mask * (1.0 / 7)
    torch.testing.assert_close(ratio.grad, expected.float(), atol=1e-4, rtol=0)
    assert ratio.grad[0, 0].item() == pytest.approx(0.1429, abs=1e-4)


def test_reference_grad_token_mean():
    ratio, _, mask = _reference_inputs()
    agg_loss(ratio, mask, "token-mean").backward()
    torch.testing.assert_close(ratio.grad, mask * (1.0 / 11), atol=1e-4, rtol=0)
    assert ratio.grad[0, 0].item() == pytest.approx(0.0909, abs=1e-4)


def test_seq_mean_token_sum_value_and_default_scale_factor():
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert agg_loss(loss_mat, mask, "seq-mean-token-sum").item() == pytest.approx((3 + 15) / 2)
    # without a factor the padded width is the divisor (documented fallback)
    assert agg_loss(loss_mat, mask, "seq-mean-token-sum-norm").item() == pytest.approx(18 / 2 / 3)
    # the factor can come from a config: its batch info, else its loss_scale_factor
    for cfg in ({"global_batch_info": {"loss_scale_factor": 9}}, {"loss_scale_factor": 9}):
        kwargs = batch_info_of(cfg)
        assert agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", **kwargs).item() == pytest.approx(18 / 2 / 9)


def test_prompt_mean_value():
    loss_mat = torch.tensor([[1.0, 1.0, 0.0], [3.0, 0.0, 0.0], [10.0, 20.0, 30.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    index = np.array(["a", "a", "b"], dtype=object)
    gnt = compute_group_num_tokens(mask, index)
    assert gnt.tolist() == [3.0, 3.0, 3.0]
    # group a token mean = 5/3, group b = 20 -> prompt mean = (5/3 + 20)/2
    expected = (5.0 / 3 + 20.0) / 2
    assert agg_loss(loss_mat, mask, "prompt-mean", group_num_tokens=gnt).item() == pytest.approx(expected)


def test_prompt_mean_without_group_info_raises():
    with pytest.raises(ValueError, match="group token counts"):
        agg_loss(torch.ones(2, 2), torch.ones(2, 2), "prompt-mean")


def test_invalid_mode_raises_with_list():
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(torch.ones(1, 2), torch.ones(1, 2), "token-avg")


def test_token_sum_value_grad_and_dp_scaling():
    # upstream's token-sum: the plain sum of the valid tokens, times dp_size (FSDP then averages
    # the rank gradients back to the sum over all ranks)
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss = agg_loss(loss_mat, mask, "token-sum")
    assert loss.item() == pytest.approx(1 + 2 + 4 + 5 + 6)
    loss.backward()
    assert torch.equal(loss_mat.grad, mask.float())
    assert agg_loss(loss_mat, mask, "token-sum", dp_size=4).item() == pytest.approx(18 * 4)
    assert agg_loss(loss_mat, mask, "token-sum", dp_size=2, batch_num_tokens=100).item() == pytest.approx(36)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_all_zero_mask_gives_finite_zero(mode):
    loss_mat = torch.full((3, 4), float("nan"), requires_grad=True)
    mask = torch.zeros(3, 4)
    kwargs = {"group_num_tokens": torch.zeros(3)} if mode == "prompt-mean" else {}
    loss = agg_loss(loss_mat, mask, mode, **kwargs)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(loss_mat.grad, torch.zeros(3, 4))


def test_empty_rows_do_not_count_as_sequences():
    loss_mat = torch.tensor([[2.0, 2.0], [5.0, 5.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    assert agg_loss(loss_mat, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)
    assert agg_loss(loss_mat, mask, "seq-mean-token-sum").item() == pytest.approx(4.0)


def test_dp_size_without_globals_raises():
    with pytest.raises(ValueError, match="batch_num_tokens"):
        agg_loss(torch.ones(1, 2), torch.ones(1, 2), "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size"):
        agg_loss(torch.ones(1, 2), torch.ones(1, 2), "seq-mean-token-mean", dp_size=2)


def test_batch_info_of_a_config():
    # None values are dropped, a config's loss_scale_factor fills a missing factor, the info's wins
    cfg = {"global_batch_info": {"dp_size": 2, "batch_num_tokens": 10, "global_batch_size": None}}
    assert batch_info_of(cfg) == {"dp_size": 2, "batch_num_tokens": 10}
    assert agg_loss(torch.ones(1, 2), torch.ones(1, 2), "token-mean", **batch_info_of(cfg)).item() == pytest.approx(0.4)
    cfg = {"global_batch_info": {"loss_scale_factor": 4}, "loss_scale_factor": 9}
    assert batch_info_of(cfg) == {"loss_scale_factor": 4}
    assert batch_info_of(None) == {} and batch_info_of({}) == {}
    with pytest.raises(ValueError, match="unknown key"):
        batch_info_of({"global_batch_info": {"num_tokens": 3}})


# ---------------------------------------------------------------------------------------------
# exactness under micro-batching and data parallelism
# ---------------------------------------------------------------------------------------------


def _random_batch(generator, batch, length, n_groups, empty_rows=True):
    lengths = torch.randint(0 if empty_rows else 1, length + 1, (batch,), generator=generator)
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).float()
    loss_mat = torch.randn(batch, length, generator=generator)
    group = torch.randint(0, n_groups, (batch,), generator=generator).tolist()
    index = np.array([f"p{g}" for g in group], dtype=object)
    return loss_mat, mask, index


def _full_value_and_grad(param, mask, index, mode, scale):
    loss_mat = param * 1.0
    if mode == "prompt-mean":
        loss = agg_loss(
            loss_mat, mask, mode, group_num_tokens=compute_group_num_tokens(mask, index), loss_scale_factor=scale
        )
    else:
        loss = agg_loss(loss_mat, mask, mode, loss_scale_factor=scale)
    (grad,) = torch.autograd.grad(loss, param)
    return loss.detach(), grad


def _accumulated_value_and_grad(param, mask, index, mode, scale, dp_size, n_micro, through_config):
    """Emulate `dp_size` ranks x `n_micro` micro-batches; FSDP averages rank gradients."""
    batch = mask.shape[0]
    rank_rows = np.array_split(np.arange(batch), dp_size)
    local = [compute_batch_loss_stats(mask[rows], index[rows]) for rows in rank_rows]
    stats = merge_batch_loss_stats(local)
    total_loss = torch.zeros(())
    total_grad = torch.zeros_like(param)
    for rows in rank_rows:
        rank_grad = torch.zeros_like(param)
        for mb in np.array_split(rows, n_micro):
            if len(mb) == 0:
                continue
            info = make_global_batch_info(stats, index=index[mb], dp_size=dp_size, loss_scale_factor=scale)
            loss_mat = param[mb] * 1.0
            if through_config:
                loss = agg_loss(loss_mat, mask[mb], mode, **batch_info_of({"global_batch_info": info}))
            else:
                loss = agg_loss(loss_mat, mask[mb], mode, **info)
            (g,) = torch.autograd.grad(loss, param)
            rank_grad += g
            total_loss += loss.detach() / dp_size  # what the ranks' losses average to
        total_grad += rank_grad / dp_size  # FSDP all-reduce mean
    return total_loss, total_grad


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("dp_size,n_micro", [(1, 3), (2, 2), (3, 1), (4, 3)])
@pytest.mark.parametrize("through_config", [True, False])
def test_micro_batch_accumulation_is_exact(mode, dp_size, n_micro, through_config):
    gen = torch.Generator().manual_seed(1234 + dp_size * 10 + n_micro)
    loss_mat, mask, index = _random_batch(gen, batch=13, length=6, n_groups=4)
    param = loss_mat.clone().requires_grad_(True)
    full_loss, full_grad = _full_value_and_grad(param, mask, index, mode, scale=8.0)
    acc_loss, acc_grad = _accumulated_value_and_grad(param, mask, index, mode, 8.0, dp_size, n_micro, through_config)
    torch.testing.assert_close(acc_loss, full_loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(acc_grad, full_grad, atol=1e-6, rtol=1e-6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    batch=st.integers(1, 12),
    length=st.integers(1, 7),
    n_groups=st.integers(1, 5),
    dp_size=st.integers(1, 3),
    n_micro=st.integers(1, 4),
    mode=st.sampled_from(LOSS_AGG_MODES),
)
def test_micro_batch_exactness_property(seed, batch, length, n_groups, dp_size, n_micro, mode):
    gen = torch.Generator().manual_seed(seed)
    loss_mat, mask, index = _random_batch(gen, batch, length, n_groups)
    param = loss_mat.clone().requires_grad_(True)
    full_loss, full_grad = _full_value_and_grad(param, mask, index, mode, scale=float(length))
    acc_loss, acc_grad = _accumulated_value_and_grad(param, mask, index, mode, float(length), dp_size, n_micro, True)
    assert torch.isfinite(acc_loss)
    torch.testing.assert_close(acc_loss, full_loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(acc_grad, full_grad, atol=1e-6, rtol=1e-6)


def test_policy_loss_given_the_batch_info_is_micro_batch_exact():
    """A registered loss passes its config's `global_batch_info` to agg_loss: exact per micro-batch."""
    gen = torch.Generator().manual_seed(7)
    batch, length = 8, 5
    _, mask, index = _random_batch(gen, batch, length, 3, empty_rows=False)
    old = torch.randn(batch, length, generator=gen) * 0.1 - 1.0
    logp = (old + torch.randn(batch, length, generator=gen) * 0.3).requires_grad_(True)
    adv = torch.randn(batch, length, generator=gen)
    cfg = {"clip_ratio": 0.2, "clip_ratio_c": 3.0}
    for name in ("vanilla", "sapo", "cispo", "gspo", "geo_mean"):
        fn = core_algos.get_policy_loss_fn(name)
        full, _ = fn(old, logp, adv, mask, "seq-mean-token-mean", cfg)
        (g_full,) = torch.autograd.grad(full, logp)
        stats = compute_batch_loss_stats(mask, index)
        acc = torch.zeros(())
        g_acc = torch.zeros_like(logp)
        for mb in np.array_split(np.arange(batch), 3):
            mb_cfg = {**cfg, "global_batch_info": make_global_batch_info(stats, index=index[mb])}
            part, _ = fn(old[mb], logp[mb], adv[mb], mask[mb], "seq-mean-token-mean", mb_cfg)
            (g,) = torch.autograd.grad(part, logp)
            acc += part.detach()
            g_acc += g
        torch.testing.assert_close(acc, full.detach(), atol=1e-6, rtol=1e-6, msg=name)
        torch.testing.assert_close(g_acc, g_full, atol=1e-6, rtol=1e-6, msg=name)


def test_batch_loss_stats_merge_groups_across_ranks():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]])
    index = np.array(["a", "b", "a", "c"], dtype=object)
    s0 = compute_batch_loss_stats(mask[:2], index[:2])
    s1 = compute_batch_loss_stats(mask[2:], index[2:])
    merged = merge_batch_loss_stats([s0, s1])
    assert merged.num_tokens == 6 and merged.num_seqs == 3
    assert merged.group_num_tokens == {"a": 2, "b": 1, "c": 3}
    assert merged.num_groups == 3
    info = make_global_batch_info(merged, index=np.array(["c", "a"], dtype=object), dp_size=2, loss_scale_factor=3)
    assert info["group_num_tokens"].tolist() == [3.0, 2.0]
    assert info["global_num_groups"] == 3 and info["dp_size"] == 2 and info["loss_scale_factor"] == 3.0
    with pytest.raises(ValueError, match="not in the mini-batch stats"):
        make_global_batch_info(merged, index=np.array(["zz"], dtype=object))
