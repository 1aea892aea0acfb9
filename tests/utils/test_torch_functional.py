"""Tests of verl.utils.torch_functional: masked statistics, log-probs, entropy, masks, schedules."""

import math

import pytest
import torch

import verl.utils.torch_functional as verl_F


def test_masked_mean_sum_ignore_nan_under_mask():
    values = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert verl_F.masked_sum(values, mask).item() == pytest.approx(13.0)
    assert verl_F.masked_mean(values, mask).item() == pytest.approx(13.0 / 4)
    torch.testing.assert_close(verl_F.masked_mean(values, mask, axis=-1), torch.tensor([1.5, 5.0]))


def test_masked_mean_empty_mask_is_zero_not_nan():
    values = torch.randn(2, 3)
    mask = torch.zeros(2, 3)
    assert verl_F.masked_mean(values, mask).item() == 0.0
    assert torch.equal(verl_F.masked_mean(values, mask, axis=-1), torch.zeros(2))
    assert verl_F.masked_var(values, mask).item() == 0.0
    assert torch.isfinite(verl_F.masked_whiten(values, mask)).all()


def test_masked_var_biased_and_unbiased_match_torch():
    values = torch.tensor([1.0, 2.0, 4.0, 100.0])
    mask = torch.tensor([1, 1, 1, 0])
    sel = values[:3]
    assert verl_F.masked_var(values, mask, unbiased=True).item() == pytest.approx(sel.var(unbiased=True).item())
    assert verl_F.masked_var(values, mask, unbiased=False).item() == pytest.approx(sel.var(unbiased=False).item())
    # a single element has no spread
    assert verl_F.masked_var(values, torch.tensor([0, 1, 0, 0])).item() == 0.0


def test_masked_whiten_uses_only_valid_positions():
    values = torch.tensor([[1.0, 2.0, 3.0, 1000.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    out = verl_F.masked_whiten(values, mask)
    valid = out[mask.bool()]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert valid.std().item() == pytest.approx(1.0, abs=1e-4)
    shifted = verl_F.masked_whiten(values, mask, shift_mean=False)
    assert shifted[mask.bool()].mean().item() == pytest.approx(2.0, abs=1e-5)


def test_logprobs_from_logits_matches_log_softmax_and_chunks():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    labels = torch.randint(0, 11, (3, 5))
    ref = verl_F.logprobs_from_logits_naive(logits, labels)
    fast = verl_F.logprobs_from_logits(logits, labels)
    chunked = verl_F.logprobs_from_logits(logits, labels, chunk_rows=4)  # 15 rows in 4 chunks
    torch.testing.assert_close(fast, ref)
    torch.testing.assert_close(chunked, ref)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    (g_chunk,) = torch.autograd.grad(chunked.sum(), logits)
    torch.testing.assert_close(g_chunk, g_ref)


def test_logprobs_and_entropy_keep_bf16_dtype_computed_in_fp32():
    # upstream contract: bf16 in, bf16 out; the arithmetic is done in fp32 and rounded once
    torch.manual_seed(1)
    logits = (torch.randn(4, 50) * 5).to(torch.bfloat16)
    labels = torch.randint(0, 50, (4,))
    ref = verl_F.logprobs_from_logits_naive(logits.float(), labels)
    for fn in (verl_F.logprobs_from_logits, verl_F.logprobs_from_logits_v2, verl_F.logprobs_from_logits_naive):
        out = fn(logits, labels)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out, ref.to(torch.bfloat16))
    ent = verl_F.entropy_from_logits(logits)
    assert ent.dtype == torch.bfloat16
    torch.testing.assert_close(ent, verl_F.entropy_from_logits(logits.float()).to(torch.bfloat16))
    # the chunked entropy stays fp32 (as upstream)
    assert verl_F.entropy_from_logits_with_chunking(logits).dtype == torch.float32


def test_logprobs_shape_mismatch_raises():
    with pytest.raises(ValueError, match="disagree"):
        verl_F.logprobs_from_logits(torch.randn(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))


def test_entropy_from_logits_and_chunked_agree():
    torch.manual_seed(2)
    logits = torch.randn(2, 7, 13, requires_grad=True)
    probs = torch.softmax(logits, -1)
    ref = -(probs * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(verl_F.entropy_from_logits(logits), ref)
    chunked = verl_F.entropy_from_logits_with_chunking(logits, chunk_size=3)
    torch.testing.assert_close(chunked, ref)
    (g1,) = torch.autograd.grad(ref.sum(), logits)
    (g2,) = torch.autograd.grad(chunked.sum(), logits)
    torch.testing.assert_close(g2, g1)
    # uniform distribution: entropy = log V
    assert verl_F.entropy_from_logits(torch.zeros(1, 8)).item() == pytest.approx(math.log(8))


def test_get_response_mask_includes_first_eos_only():
    ids = torch.tensor([[5, 6, 2, 7, 2], [2, 0, 0, 0, 0], [5, 5, 5, 5, 5]])
    mask = verl_F.get_response_mask(ids, eos_token=2)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    multi = verl_F.get_response_mask(torch.tensor([[5, 9, 2]]), eos_token=[9, 2], dtype=torch.float32)
    assert multi.tolist() == [[1.0, 1.0, 0.0]]
    assert torch.equal(verl_F.get_eos_mask(ids, 2), mask)


def test_clip_by_value_with_tensor_bounds():
    x = torch.tensor([0.0, 5.0, -5.0])
    out = verl_F.clip_by_value(x, torch.tensor([-1.0, -1.0, -2.0]), torch.tensor([1.0, 3.0, 1.0]))
    assert out.tolist() == [0.0, 3.0, -2.0]


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    assert verl_F.explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    assert verl_F.explained_variance(torch.zeros(1, 4), torch.ones(1, 4), mask).item() == 0.0


def test_padding_helpers():
    t = torch.tensor([[1, 2]])
    assert verl_F.pad_sequence_to_length(t, 4, 0).tolist() == [[1, 2, 0, 0]]
    assert verl_F.pad_sequence_to_length(t, 4, 0, left_pad=True).tolist() == [[0, 0, 1, 2]]
    assert verl_F.pad_2d_list_to_length([[1], [1, 2, 3]], 0, max_length=4).tolist() == [[1, 0, 0, 0], [1, 2, 3, 0]]
    ids, att = verl_F.postprocess_data(
        torch.tensor([[1, 2, 3, 4, 5]]), torch.ones(1, 5, dtype=torch.long), 3, 0, truncation="left"
    )
    assert ids.tolist() == [[3, 4, 5]] and att.tolist() == [[1, 1, 1]]
    with pytest.raises(ValueError, match="exceeds max_length"):
        verl_F.postprocess_data(torch.tensor([[1, 2, 3]]), torch.ones(1, 3), 2, 0)


def test_lr_schedules():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = verl_F.get_cosine_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=10, min_lr_ratio=0.1)
    lrs = []
    for _ in range(11):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(0.5) and lrs[2] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(0.1)
    opt2 = torch.optim.SGD([param], lr=2.0)
    const = verl_F.get_constant_schedule_with_warmup(opt2, num_warmup_steps=0)
    opt2.step()
    const.step()
    assert opt2.param_groups[0]["lr"] == 2.0


def _lrs(sched, opt, n):
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_cosine_schedule_init_lr_ratio_and_one_indexed_steps():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    # warm-up over 4 steps starting at 0.2: 0.2, 0.4, 0.6, 0.8, then the cosine from 1.0
    sched = verl_F.get_cosine_schedule_with_warmup(opt, 4, 8, init_lr_ratio=0.2)
    lrs = _lrs(sched, opt, 9)
    assert lrs[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    # step 6: p = 2/4, 0.5 * (1 + cos(pi/2)) = 0.5; step 8: floor 0
    assert lrs[6] == pytest.approx(0.5) and lrs[8] == pytest.approx(0.0, abs=1e-12)
    # zero_indexed_step=False: the first optimizer step already uses curve point 1
    opt1 = torch.optim.SGD([param], lr=1.0)
    sched1 = verl_F.get_cosine_schedule_with_warmup(opt1, 4, 8, zero_indexed_step=False)
    assert _lrs(sched1, opt1, 3) == pytest.approx([0.25, 0.5, 0.75])
    with pytest.raises(ValueError, match="init_lr_ratio"):
        verl_F.get_cosine_schedule_with_warmup(opt, 1, 2, init_lr_ratio=1.5)


def test_wsd_schedule_phases():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    # warmup 2, remaining 8: stable int(8 * 0.5) = 4 steps, decay 4 steps to min 0.2
    sched = verl_F.get_wsd_schedule_with_warmup(opt, 2, 10, min_lr_ratio=0.2, stable_ratio=0.5)
    lrs = _lrs(sched, opt, 12)
    assert lrs[:6] == pytest.approx([0.0, 0.5, 1.0, 1.0, 1.0, 1.0])
    # step 8: p = 2/4 -> 0.2 + 0.8 * 0.5 = 0.6; from step 10 on: 0.2
    assert lrs[8] == pytest.approx(0.6) and lrs[10] == pytest.approx(0.2) and lrs[11] == pytest.approx(0.2)


def test_gather_and_response_logprob_helpers():
    data = torch.tensor([[[0.1, 0.2, 0.3], [1.0, 2.0, 3.0]]])
    assert verl_F.gather_from_labels(data, torch.tensor([[2, 0]])).tolist() == [[pytest.approx(0.3), 1.0]]
    torch.manual_seed(0)
    ids = torch.randint(0, 7, (2, 5))
    logits = torch.randn(2, 5, 7)
    resp = verl_F.log_probs_from_logits_response(ids, logits, response_length=2)
    # response token t (positions 3, 4) is scored by logits at t - 1
    expected = torch.log_softmax(logits, -1)[:, 2:4].gather(-1, ids[:, 3:5].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(resp, expected)
    # rmpad variant: row 0 is left-padded by one token; valid-token logits only
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    flat = torch.nonzero(mask.reshape(-1)).flatten()
    logits_rmpad = logits.reshape(10, 7)[flat]
    rm = verl_F.log_probs_from_logits_response_rmpad(ids, mask, logits_rmpad, response_length=2)
    torch.testing.assert_close(rm, expected)
    ids_rmpad = ids.reshape(-1)[flat].unsqueeze(0)
    allr = verl_F.log_probs_from_logits_all_rmpad(ids_rmpad, logits_rmpad, flat, 2, 5, 2)
    torch.testing.assert_close(allr, expected)


def test_padding_unpad_and_nested_helpers():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert verl_F.remove_pad_token(torch.tensor([[0, 5, 6], [1, 2, 3]]), mask) == [[5, 6], [1, 2, 3]]
    indices, cu, longest = verl_F.get_unpad_data(mask)
    assert indices.tolist() == [1, 2, 3, 4, 5] and cu.tolist() == [0, 2, 5] and cu.dtype == torch.int32 and longest == 3
    stacked = verl_F.pad_and_stack([torch.ones(3, 5), torch.full((2, 8), 2.0)], pad_value=-1)
    assert (
        stacked.shape == (2, 3, 8)
        and stacked[0, 0, 5].item() == -1
        and stacked[1, 2, 0].item() == -1
        and stacked[1, 1, 7].item() == 2
    )
    assert verl_F.pad_along_dim(torch.ones(2, 3), 5, pad_value=7, dim=1)[:, 3:].tolist() == [[7, 7], [7, 7]]
    with pytest.raises(ValueError, match="exceeds target length"):
        verl_F.pad_along_dim(torch.ones(2, 3), 2)
    nt = torch.nested.as_nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    assert verl_F.expand_as_nested(torch.tensor([1.0, 2.0]), nt).values().tolist() == [1, 1, 2, 2, 2]
    am = verl_F.prepare_decoder_attention_mask(mask, (2, 3), torch.zeros(2, 3, 4))
    allowed = am == 0
    # row 0: key 0 is padding, so query 1 sees key 1 only and query 2 sees keys 1, 2
    assert allowed[0, 0].tolist() == [[False, False, False], [False, True, False], [False, True, True]]
    assert allowed[1, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_grad_norm_split_and_sum_pi_squared():
    model = torch.nn.Linear(2, 1, bias=True)
    model.weight.grad = torch.tensor([[3.0, 4.0]])
    model.bias.grad = torch.tensor([1.0])
    assert verl_F.compute_grad_norm(model) == pytest.approx(26.0)  # squared norm, as upstream
    from tensordict import TensorDict

    td = TensorDict({"x": torch.arange(6)}, batch_size=[6])
    parts = verl_F.split_dict_tensor_into_batches(td, 2)
    assert [p["x"].tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError, match="split batch size: 4"):
        verl_F.split_dict_tensor_into_batches(td, 4)
    # uniform over 4 -> sum p^2 = 4 * (1/4)^2 = 0.25
    assert verl_F.calculate_sum_pi_squared_from_logits(torch.zeros(4)).item() == pytest.approx(0.25)
    with pytest.raises(ImportError, match="flash-attn"):
        if verl_F.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE:
            raise ImportError("flash-attn present: nothing to check")
        verl_F.logprobs_from_logits_flash_attn(torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))


def test_masked_sum_and_mean_weight_by_float_masks_as_upstream():
    values = torch.tensor([[2.0, 4.0, float("nan")], [1.0, 3.0, 5.0]])
    weights = torch.tensor([[0.5, 0.25, 0.0], [1.0, 0.0, 0.5]])
    # sum: 2 * 0.5 + 4 * 0.25 + 1 * 1 + 5 * 0.5 = 5.5; weight total 2.25
    assert verl_F.masked_sum(values, weights).item() == pytest.approx(5.5)
    assert verl_F.masked_mean(values, weights).item() == pytest.approx(5.5 / 2.25)
    # per row: (1 + 1) / 0.75 and (1 + 2.5) / 1.5; a fractional total below 1 is not clamped to 1
    torch.testing.assert_close(verl_F.masked_mean(values, weights, axis=-1), torch.tensor([2.0 / 0.75, 3.5 / 1.5]))
    assert verl_F.masked_mean(values, torch.zeros(2, 3)).item() == 0.0
