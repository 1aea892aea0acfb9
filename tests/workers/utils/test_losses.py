"""The loss functions of `verl.workers.utils.losses` on hand-worked micro-batches: what they return
(loss, `LossShare` metrics, token-weighted metrics) and that they use the mini-batch
denominators (the engine's `batch_info`) rather than the micro-batch's own."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig, CriticConfig
from verl.workers.engine.dp_engine import LossShare
from verl.workers.utils.losses import ppo_loss, value_loss

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # 3 valid tokens


def _td(**tensors):
    return TensorDict(tensors, batch_size=[2])


def test_ppo_loss_on_policy_is_minus_the_token_mean_advantage():
    cfg = ActorConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2, loss_scale_factor=3.0)
    log_probs = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])  # 9s sit on padding
    data = _td(response_mask=MASK, advantages=adv, old_log_probs=log_probs.detach())
    loss, metrics = ppo_loss(cfg, {"log_probs": log_probs}, data)
    # ratio 1 everywhere: token-mean of -A over the 3 valid tokens = -(1 + 2 + 3) / 3
    assert loss.item() == pytest.approx(-2.0)
    assert isinstance(metrics["actor/pg_loss"], LossShare) and metrics["actor/pg_loss"] == pytest.approx(-2.0)
    assert metrics["actor/loss"] == pytest.approx(-2.0)
    assert not isinstance(metrics["actor/ppo_kl"], LossShare) and metrics["actor/ppo_kl"] == 0.0
    assert "actor/entropy" not in metrics and "actor/kl_loss" not in metrics


def test_ppo_loss_reads_the_mini_batch_denominator_and_adds_entropy_and_kl():
    cfg = ActorConfig(
        ppo_mini_batch_size=2,
        ppo_micro_batch_size_per_gpu=2,
        loss_scale_factor=3.0,
        entropy_coeff=0.5,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        kl_loss_type="low_var_kl",
    )
    log_probs = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    entropys = torch.tensor([[0.3, 0.6, 0.0], [0.9, 0.0, 0.0]])
    data = _td(response_mask=MASK, advantages=adv, old_log_probs=log_probs.detach(), ref_log_prob=log_probs.detach())
    # this micro-batch is part of a mini-batch of 6 valid tokens over all ranks
    stats = core_algos.BatchLossStats(num_tokens=6, num_seqs=4)
    info = core_algos.make_global_batch_info(stats)
    loss, metrics = ppo_loss(cfg, {"log_probs": log_probs, "entropys": entropys}, data, batch_info=info)
    assert cfg.global_batch_info == info  # written into the actor's config, as upstream's ppo_loss does
    # pg: -(1+2+3)/6 = -1; entropy: (0.3+0.6+0.9)/6 = 0.3; kl of identical policies: 0
    assert metrics["actor/pg_loss"] == pytest.approx(-1.0)
    assert metrics["actor/entropy"] == pytest.approx(0.3)
    assert metrics["actor/kl_loss"] == pytest.approx(0.0, abs=1e-7)
    assert loss.item() == pytest.approx(-1.0 - 0.5 * 0.3)


def test_value_loss_hand_worked():
    cfg = CriticConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2, cliprange_value=0.5)
    vpreds = torch.tensor([[1.0, 0.0, 7.0], [2.0, 7.0, 7.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    returns = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    loss, metrics = value_loss(cfg, {"values": vpreds}, _td(response_mask=MASK, values=old, returns=returns))
    # token 1: V=1 (clipped to 0.5), R=1: max(0, 0.5*0.25) = 0.125 (clipped)
    # token 2: V=0 (inside the clip range), R=1: 0.5
    # token 3: V=2 (V_old=2: inside), R=0: 2.0
    assert loss.item() == pytest.approx((0.125 + 0.5 + 2.0) / 3)
    assert isinstance(metrics["critic/vf_loss"], LossShare)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(1 / 3)
    assert metrics["critic/vpred_mean"] == pytest.approx(1.0)  # (1 + 0 + 2) / 3, padding ignored
    loss.backward()
    assert math.isclose(float(vpreds.grad[0, 0]), 0.0)  # the clipped branch is constant in V
