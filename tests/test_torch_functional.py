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


def test_logprobs_from_logits_bf16_upcasts():
    torch.manual_seed(1)
    logits = (torch.randn(4, 50) * 5).to(torch.bfloat16)
    labels = torch.randint(0, 50, (4,))
    out = verl_F.logprobs_from_logits(logits, labels)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, verl_F.logprobs_from_logits_naive(logits.float(), labels))


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
    ids, att = verl_F.postprocess_data(torch.tensor([[1, 2, 3, 4, 5]]), torch.ones(1, 5, dtype=torch.long), 3, 0, truncation="left")
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
