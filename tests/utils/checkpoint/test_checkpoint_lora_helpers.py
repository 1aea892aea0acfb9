"""Upstream's LoRA checkpoint helpers: BaseCheckpointManager.should_save_lora_only /
is_lora_only_state_dict, and verl.trainer.config.CheckpointConfig accepted by the managers."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl.trainer.config import CheckpointConfig
from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (None, False),
        ({"save_lora_only": True}, True),
        (OmegaConf.create({"save_contents": ["model"], "save_lora_only": True}), True),
        (CheckpointConfig(save_lora_only=True), True),
        (CheckpointConfig(), False),
    ],
)
def test_should_save_lora_only_reads_every_config_form(config, expected):
    manager = BaseCheckpointManager(object(), checkpoint_config=config)
    assert manager.should_save_lora_only is expected
    assert FSDPCheckpointManager(object(), checkpoint_config=config).save_lora_only is expected


def test_checkpoint_config_object_sets_the_contents():
    manager = BaseCheckpointManager(object(), checkpoint_config=CheckpointConfig(save_contents=["model", "hf_model"]))
    assert manager.save_contents == ["model", "hf_model"] and manager.load_contents == ["model", "hf_model"]
    with pytest.raises(ValueError, match=r"checkpoint.save_contents has unknown entries \['weights'\]"):
        CheckpointConfig(save_contents=["weights"])
    assert FSDPCheckpointManager(object(), checkpoint_config=CheckpointConfig(async_save=True)).async_save is True


def test_is_lora_only_state_dict():
    lora = {"base_model.model.x.lora_A.weight": 0, "y.adapter_B.weight": 0}
    assert BaseCheckpointManager.is_lora_only_state_dict(lora) is True
    assert BaseCheckpointManager.is_lora_only_state_dict({**lora, "x.weight": 0}) is False
    assert BaseCheckpointManager.is_lora_only_state_dict({}) is False
    assert BaseCheckpointManager.is_lora_only_state_dict(None) is False
