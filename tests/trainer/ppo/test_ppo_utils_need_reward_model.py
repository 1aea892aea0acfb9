"""need_reward_model reads upstream main's reward.reward_model.enable; the old key is an alias."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl.trainer.ppo.utils import need_reward_model


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"reward": {"reward_model": {"enable": True}}}, True),  # upstream main: the new key alone
        ({"reward_model": {"enable": None}, "reward": {"reward_model": {"enable": True}}}, True),
        ({"reward_model": {"enable": True}}, True),  # the old key alone
        ({"reward_model": {"enable": False}, "reward": {"reward_model": {"enable": True}}}, False),  # set: it wins
        ({}, False),
    ],
)
def test_need_reward_model(config, expected):
    assert need_reward_model(OmegaConf.create(config)) is expected
    assert need_reward_model(config) is expected
