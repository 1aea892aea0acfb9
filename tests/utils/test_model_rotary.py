"""`verl.utils.model.rotary_pos_emb`, installed in place of transformers' Llama
`apply_rotary_pos_emb` by every model builder: outputs and gradients must be bitwise those of
transformers' own function (its forward and autograd's backward of it), in the layouts the model
uses, and a whole Llama forward + backward must not change by a bit."""

from __future__ import annotations

import pytest
import torch

from verl.utils import model as model_utils
from verl.utils.model import build_causal_lm, compute_position_id_with_mask, install_rotary_pos_emb, rotary_pos_emb

LLAMA = "transformers.models.llama.modeling_llama"


@pytest.fixture(scope="module")
def transformers_rotary():
    assert install_rotary_pos_emb()
    from transformers.models.llama import modeling_llama

    assert modeling_llama.apply_rotary_pos_emb is rotary_pos_emb
    original = model_utils._TRANSFORMERS_ROTARY[LLAMA]
    assert original is not rotary_pos_emb and original.__module__ == LLAMA
    return original


def test_hand_worked_rotation():
    # d = 2: rotate_half([x1, x2]) = [-x2, x1]; q = [1, 2], cos = 0.5, sin = 0.25
    q = torch.tensor([[[[1.0, 2.0]]]])
    k = torch.tensor([[[[4.0, -8.0]]]])
    cos = torch.full((1, 1, 2), 0.5)
    sin = torch.full((1, 1, 2), 0.25)
    q_embed, k_embed = rotary_pos_emb(q, k, cos, sin)
    assert q_embed.flatten().tolist() == [1 * 0.5 - 2 * 0.25, 2 * 0.5 + 1 * 0.25]  # [0.0, 1.25]
    assert k_embed.flatten().tolist() == [4 * 0.5 + 8 * 0.25, -8 * 0.5 + 4 * 0.25]  # [4.0, -3.0]


def _qk(dtype, unsqueeze_dim: int, b=3, h=4, h_kv=2, s=7, d=16, seed=0):
    """q/k as the attention builds them: projections viewed [b, s, heads, d], transposed to
    [b, heads, s, d] (non-contiguous) for unsqueeze_dim=1, left as they are for unsqueeze_dim=2."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, h, d, generator=g).to(dtype)
    k = torch.randn(b, s, h_kv, d, generator=g).to(dtype)
    if unsqueeze_dim == 1:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    angles = torch.rand(b, s, d // 2, generator=g) * 6
    emb = torch.cat([angles, angles * 0.7], dim=-1)  # the halves need not match
    return q, k, emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_outputs_and_gradients_bitwise(transformers_rotary, dtype, unsqueeze_dim):
    q, k, cos, sin = _qk(dtype, unsqueeze_dim)
    results = []
    for fn in (transformers_rotary, rotary_pos_emb):
        qq, kk = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
        q_embed, k_embed = fn(qq, kk, cos, sin, unsqueeze_dim)
        g = torch.Generator().manual_seed(3)
        gq = torch.randn(q_embed.shape, generator=g).to(dtype)
        gk = torch.randn(k_embed.shape, generator=g).to(dtype)
        ((q_embed * gq).sum() + (k_embed * gk).sum()).backward()
        results.append((q_embed.detach(), k_embed.detach(), qq.grad, kk.grad))
    for ref, ours in zip(*results, strict=True):
        assert ref.dtype == ours.dtype and ref.shape == ours.shape
        assert torch.equal(ref, ours)
    # without autograd (the rollout's decoding step) the forward is the same
    with torch.no_grad():
        for ref, ours in zip(
            transformers_rotary(q, k, cos, sin, unsqueeze_dim),
            rotary_pos_emb(q, k, cos, sin, unsqueeze_dim),
            strict=True,
        ):
            assert torch.equal(ref, ours)


def test_gradient_of_one_input_only(transformers_rotary):
    q, k, cos, sin = _qk(torch.float32, 1)
    qq = q.detach().requires_grad_(True)
    ref_q, ref_k = transformers_rotary(qq, k, cos, sin)
    (ref_q.square().sum() + ref_k.sum()).backward()
    ref_grad = qq.grad
    qq = q.detach().requires_grad_(True)
    out_q, out_k = rotary_pos_emb(qq, k, cos, sin)
    assert not out_k.requires_grad
    (out_q.square().sum() + out_k.sum()).backward()
    assert torch.equal(ref_grad, qq.grad)


def test_other_cases_take_transformers_function(transformers_rotary):
    q, k, cos, sin = _qk(torch.float32, 1)
    # mixed dtypes (autocast): type promotion of the in-place product would differ
    qb, kb = q.to(torch.bfloat16), k.to(torch.bfloat16)
    for ref, ours in zip(transformers_rotary(qb, kb, cos, sin), rotary_pos_emb(qb, kb, cos, sin), strict=True):
        assert ours.dtype == torch.float32 and torch.equal(ref, ours)
    # cos/sin with a gradient (a learned rotary embedding): autograd of transformers' formula
    cos_leaf = cos.detach().requires_grad_(True)
    q_embed, _ = rotary_pos_emb(q, k, cos_leaf, sin)
    q_embed.sum().backward()
    ref_leaf = cos.detach().requires_grad_(True)
    transformers_rotary(q, k, ref_leaf, sin)[0].sum().backward()
    assert torch.equal(cos_leaf.grad, ref_leaf.grad)


def test_install_is_idempotent(transformers_rotary):
    assert install_rotary_pos_emb() and install_rotary_pos_emb()
    assert model_utils._TRANSFORMERS_ROTARY[LLAMA] is transformers_rotary


def test_llama_logits_and_gradients_bitwise(transformers_rotary, tmp_path, monkeypatch):
    from conftest import load_tiny_llama
    from transformers.models.llama import modeling_llama

    path, _, _ = load_tiny_llama(str(tmp_path))
    model = build_causal_lm(path)
    assert modeling_llama.apply_rotary_pos_emb is rotary_pos_emb
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, model.config.vocab_size, (5, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[3, :1] = 0
    pos = compute_position_id_with_mask(mask)

    def run():
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).sum().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    ours_logits, ours_grads = run()
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", transformers_rotary)
    ref_logits, ref_grads = run()
    assert torch.equal(ours_logits, ref_logits)
    assert ours_grads.keys() == ref_grads.keys()
    for name in ref_grads:
        assert torch.equal(ours_grads[name], ref_grads[name]), name
