"""SAPO's temperatures at upstream's place, `actor.tau_pos` / `actor.tau_neg`, reach the loss however
the ActorConfig is built (as upstream code builds it, or from a raw upstream yaml section)."""

import pytest
import torch

from verl.trainer.ppo import core_algos
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import ActorConfig, PolicyLossConfig

# one token, ratio e^0.5, A = +1 (tau_pos) and A = -1 (tau_neg)
OLD = torch.zeros(2, 1)
LOGP = torch.full((2, 1), 0.5)
ADV = torch.tensor([[1.0], [-1.0]])
MASK = torch.ones(2, 1)


def _gate(tau: float) -> float:
    # per-token loss -gate * A, gate = sigmoid(tau * (ratio - 1)) * 4 / tau
    ratio = torch.exp(torch.tensor(0.5))
    return float(torch.sigmoid(tau * (ratio - 1)) * 4 / tau)


def _sapo(cfg) -> float:
    loss, _ = core_algos.get_policy_loss_fn("sapo")(OLD, LOGP, ADV, MASK, "seq-mean-token-mean", cfg)
    return loss.item()


def test_actor_level_temperatures_reach_the_loss():
    cfg = ActorConfig(tau_pos=1.5, tau_neg=2.0)
    assert (cfg.policy_loss.tau_pos, cfg.policy_loss.tau_neg) == (1.5, 2.0)
    # seq-mean over the two rows of (-gate_pos * 1) and (-gate_neg * -1)
    assert _sapo(cfg) == pytest.approx((-_gate(1.5) + _gate(2.0)) / 2, rel=1e-6)


def test_raw_upstream_section_gives_the_same_config():
    cfg = omega_conf_to_dataclass({"tau_pos": 1.5, "tau_neg": 2.0, "policy_loss": {"loss_mode": "sapo"}}, ActorConfig)
    assert (cfg.tau_pos, cfg.policy_loss.tau_pos, cfg.policy_loss.tau_neg) == (1.5, 1.5, 2.0)


def test_policy_loss_place_wins_when_given_and_both_places_agree_after():
    cfg = ActorConfig(policy_loss=PolicyLossConfig(tau_pos=3.0))
    assert (cfg.tau_pos, cfg.policy_loss.tau_pos, cfg.tau_neg) == (3.0, 3.0, 1.05)
    cfg = ActorConfig(tau_pos=1.3, policy_loss=PolicyLossConfig(tau_pos=2.0))
    assert (cfg.tau_pos, cfg.policy_loss.tau_pos) == (2.0, 2.0)
    assert _sapo(cfg) == pytest.approx((-_gate(2.0) + _gate(1.05)) / 2, rel=1e-6)
