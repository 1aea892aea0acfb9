"""DataParallelPPOCritic: values equal a plain forward, exact micro-batch accumulation, and the
value loss goes down on a fixed batch."""

from __future__ import annotations

import copy

import pytest
import torch
from test_workers_common import PROMPTS, RESPONSES, build_tiny_llama, make_batch

from verl.protocol import DataProto
from verl.trainer.ppo.metric_utils import compute_vf_explained_var
from verl.utils.model import build_value_model
from verl.workers.config import CriticConfig
from verl.workers.critic import DataParallelPPOCritic


@pytest.fixture(scope="module")
def value_model(tmp_path_factory):
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    path = build_tiny_llama(str(tmp_path_factory.mktemp("tiny_critic")))
    tok = AutoTokenizer.from_pretrained(path)
    model = build_value_model(path)
    return tok, model


def _batch(tok):
    batch = make_batch(tok, PROMPTS, RESPONSES, prompt_len=8, resp_len=6)
    g = torch.Generator().manual_seed(0)
    batch["returns"] = torch.randn(batch["responses"].shape, generator=g) * batch["response_mask"]
    return batch


def _critic(model, lr=1e-2, optimizer="adam", use_prefix_grouper=True, **cfg):
    model = copy.deepcopy(model)
    base = dict(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=8, grad_clip=1e9, cliprange_value=0.5)
    base.update(cfg)
    opt = (
        torch.optim.SGD(model.parameters(), lr=lr)
        if optimizer == "sgd"
        else torch.optim.Adam(model.parameters(), lr=lr)
    )
    return DataParallelPPOCritic(CriticConfig(**base), model, opt, use_prefix_grouper=use_prefix_grouper), model


def test_value_model_has_one_output_and_no_dropout(value_model):
    _, model = value_model
    assert model.config.num_labels == 1
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))


def test_compute_values_matches_plain_forward(value_model):
    tok, model = value_model
    batch = _batch(tok)
    critic, _ = _critic(model)
    values = critic.compute_values(DataProto.from_dict(tensors=batch, meta_info={"micro_batch_size": 3}))
    with torch.no_grad():
        ref = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits[..., 0]
    ref = ref[:, -7:-1] * batch["response_mask"]
    torch.testing.assert_close(values, ref, atol=1e-5, rtol=0)


def test_micro_batch_split_gives_the_same_update(value_model):
    tok, model = value_model
    batch = _batch(tok)
    critic, _ = _critic(model)
    batch["values"] = critic.compute_values(DataProto.from_dict(tensors=batch, meta_info={"micro_batch_size": 8}))
    results = []
    for split in (
        {"ppo_micro_batch_size_per_gpu": 1},
        {"ppo_micro_batch_size_per_gpu": 8},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 30},
    ):
        c, updated = _critic(model, optimizer="sgd", lr=1.0, **split)
        metrics = c.update_critic(DataProto.from_dict(tensors=dict(batch)))
        results.append((updated, metrics))
    for updated, metrics in results[1:]:
        for p, q in zip(updated.parameters(), results[0][0].parameters(), strict=False):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=0)
        assert metrics["critic/vf_loss"][0] == pytest.approx(results[0][1]["critic/vf_loss"][0], rel=1e-6)


def test_value_loss_decreases_on_a_fixed_batch(value_model):
    tok, model = value_model
    batch = _batch(tok)
    critic, _ = _critic(model, lr=3e-3, ppo_micro_batch_size_per_gpu=4, cliprange_value=100.0)
    losses = []
    for _ in range(15):
        batch["values"] = critic.compute_values(DataProto.from_dict(tensors=batch, meta_info={"micro_batch_size": 4}))
        metrics = critic.update_critic(DataProto.from_dict(tensors=dict(batch)))
        losses.append(metrics["critic/vf_loss"][0])
    assert losses[-1] < 0.5 * losses[0], losses
    # the driver's compute_data_metrics is the one producer of critic/vf_explained_var
    assert "critic/vf_explained_var" not in metrics
    values = critic.compute_values(DataProto.from_dict(tensors=batch, meta_info={"micro_batch_size": 4}))
    assert compute_vf_explained_var(values, batch["returns"], batch["response_mask"]) > 0.3
    assert metrics["critic/vf_clipfrac"] == [0.0]
    assert metrics["critic/nonfinite_grad_skipped_steps"] == [0.0]


def test_missing_returns_is_named(value_model):
    tok, model = value_model
    batch = _batch(tok)
    batch.pop("returns")
    batch["values"] = torch.zeros_like(batch["response_mask"], dtype=torch.float32)
    critic, _ = _critic(model)
    with pytest.raises(KeyError, match="returns"):
        critic.update_critic(DataProto.from_dict(tensors=batch))


def test_non_finite_loss_is_skipped_and_counted(value_model):
    tok, model = value_model
    batch = _batch(tok)
    critic, updated = _critic(model, ppo_micro_batch_size_per_gpu=1)
    batch["values"] = critic.compute_values(DataProto.from_dict(tensors=batch, meta_info={"micro_batch_size": 8}))
    batch["returns"][0, 0] = float("nan")
    metrics = critic.update_critic(DataProto.from_dict(tensors=dict(batch)))
    assert metrics["critic/nonfinite_loss_skipped"] == [1.0]
    assert metrics["critic/nonfinite_grad_skipped_steps"] == [0.0]
    assert all(torch.isfinite(p).all() for p in updated.parameters())
    # every micro-batch non-finite: no optimizer step at all (and no NaN in the parameters)
    batch["returns"][:, 0] = float("nan")
    before = [p.detach().clone() for p in updated.parameters()]
    metrics = critic.update_critic(DataProto.from_dict(tensors=dict(batch)))
    assert metrics["critic/nonfinite_loss_skipped"] == [8.0] and metrics["critic/nonfinite_grad_skipped_steps"] == [1.0]
    assert all(torch.equal(a, b) for a, b in zip(before, updated.parameters(), strict=False))


def test_dynamic_batch_without_budget_is_named(value_model):
    tok, model = value_model
    batch = _batch(tok)
    critic, _ = _critic(model)
    with pytest.raises(ValueError, match="token budget"):
        critic.compute_values(
            DataProto.from_dict(tensors=batch, meta_info={"use_dynamic_bsz": True, "max_token_len": None})
        )


def _grouped_batch(tok):
    """3 prompts x 3 samples (rows sharing a prompt are what the prefix grouper shares)."""
    prompts = [p for p in ("1+2=", "13+4=", "9=") for _ in range(3)]
    responses = ["3", "4", "three", "17", "1", "177", "nine", "9", "n"]
    batch = make_batch(tok, prompts, responses, prompt_len=8, resp_len=6)
    g = torch.Generator().manual_seed(1)
    batch["returns"] = torch.randn(batch["responses"].shape, generator=g) * batch["response_mask"]
    return batch


def test_prefix_grouper_values_and_update_equal_the_plain_forward(value_model):
    tok, model = value_model
    batch = _grouped_batch(tok)
    on, m_on = _critic(model, optimizer="sgd", lr=1.0, ppo_mini_batch_size=9, ppo_micro_batch_size_per_gpu=4)
    off, m_off = _critic(
        model, optimizer="sgd", lr=1.0, use_prefix_grouper=False, ppo_mini_batch_size=9, ppo_micro_batch_size_per_gpu=4
    )
    for micro in (9, 4):
        data = DataProto.from_dict(tensors=batch, meta_info={"micro_batch_size": micro})
        v_on, v_off = on.compute_values(data), off.compute_values(data)
        torch.testing.assert_close(v_on, v_off, atol=2e-6, rtol=0)
    assert on.engine.prefix_groups_used > 0 and off.engine.prefix_groups_used == 0
    # the update through the shared prompts: same gradient, so the same SGD step
    batch["values"] = v_off + 0.1 * batch["response_mask"]
    used = on.engine.prefix_groups_used
    m1 = on.update_critic(DataProto.from_dict(tensors=dict(batch)))
    m2 = off.update_critic(DataProto.from_dict(tensors=dict(batch)))
    assert on.engine.prefix_groups_used > used
    for p, q in zip(m_on.parameters(), m_off.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=2e-6, rtol=0)
    assert m1["critic/vf_loss"][0] == pytest.approx(m2["critic/vf_loss"][0], rel=1e-5)
    assert not torch.equal(next(m_on.parameters()), next(model.parameters()))  # a step was taken
