"""RolloutCorrectionConfig's preset factories (upstream main's names and settings)."""

from __future__ import annotations

import inspect

import pytest

from verl.trainer.config import RolloutCorrectionConfig
from verl.trainer.ppo.rollout_corr_helper import validate_rollout_correction_config

PRESETS = sorted(
    name
    for name, member in inspect.getmembers(RolloutCorrectionConfig)
    if inspect.ismethod(member) and (name.startswith(("decoupled_", "bypass_")) or name == "disabled")
)

# (rollout_is, rollout_is_threshold, rollout_rs, rollout_rs_threshold, bypass_mode, loss_type) at the defaults
EXPECTED = {
    "disabled": (None, 2.0, None, None, False, "ppo_clip"),
    "decoupled_token_is": ("token", 2.0, None, None, False, "ppo_clip"),
    "decoupled_seq_is": ("sequence", 2.0, None, None, False, "ppo_clip"),
    "decoupled_token_icepop": ("token", "0.5_5.0", None, None, False, "ppo_clip"),
    "decoupled_seq_is_rs": ("sequence", 2.0, "seq_sum_k1", "0.5_2.0", False, "ppo_clip"),
    "decoupled_geo_rs": (None, 2.0, "seq_mean_k1", "0.999_1.001", False, "ppo_clip"),
    "decoupled_geo_rs_seq_tis": ("sequence", 2.0, "seq_mean_k1", "0.999_1.001", False, "ppo_clip"),
    "decoupled_geo_rs_token_tis": ("token", 2.0, "seq_mean_k1", "0.999_1.001", False, "ppo_clip"),
    "decoupled_k3_rs": (None, 2.0, "seq_mean_k3", 0.01, False, "ppo_clip"),
    "decoupled_k3_rs_seq_tis": ("sequence", 2.0, "seq_mean_k3", 0.01, False, "ppo_clip"),
    "decoupled_k3_rs_token_tis": ("token", 2.0, "seq_mean_k3", 0.01, False, "ppo_clip"),
    "bypass_ppo_clip": (None, 2.0, None, None, True, "ppo_clip"),
    "bypass_ppo_clip_geo_rs": (None, 2.0, "seq_mean_k1", "0.999_1.001", True, "ppo_clip"),
    "bypass_ppo_clip_k3_rs": (None, 2.0, "seq_mean_k3", 0.01, True, "ppo_clip"),
    "bypass_pg_is": ("sequence", 2.0, None, None, True, "reinforce"),
    "bypass_pg_token_icepop": ("token", "0.5_5.0", None, None, True, "reinforce"),
    "bypass_pg_geo_rs": (None, 2.0, "seq_mean_k1", "0.999_1.001", True, "reinforce"),
    "bypass_pg_geo_rs_seq_tis": ("sequence", 2.0, "seq_mean_k1", "0.999_1.001", True, "reinforce"),
    "bypass_pg_geo_rs_token_tis": ("token", 2.0, "seq_mean_k1", "0.999_1.001", True, "reinforce"),
}


def test_every_upstream_preset_is_there():
    assert PRESETS == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_settings_are_valid_for_the_helper(name):
    cfg = getattr(RolloutCorrectionConfig, name)()
    got = (
        cfg.rollout_is,
        cfg.rollout_is_threshold,
        cfg.rollout_rs,
        cfg.rollout_rs_threshold,
        cfg.bypass_mode,
        cfg.loss_type,
    )
    assert got == EXPECTED[name]
    validate_rollout_correction_config(cfg)  # the thresholds parse for the rules they go with


def test_preset_arguments_reach_the_config():
    cfg = RolloutCorrectionConfig.bypass_pg_geo_rs_token_tis(is_threshold=3.0, rs_threshold="0.9_1.1")
    assert (cfg.rollout_is_threshold, cfg.rollout_rs_threshold) == (3.0, "0.9_1.1")
    assert RolloutCorrectionConfig.decoupled_token_icepop(4.0, 0.25).rollout_is_threshold == "0.25_4.0"
