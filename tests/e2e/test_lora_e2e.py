"""LoRA through the trainer (`run_ppo`, the path of `python -m verl.trainer.main_ppo`): the KL
reference comes from the actor group with the adapter disabled (no reference worker), and a run
resumed from an adapter-only checkpoint reproduces the uninterrupted run's metrics."""

from __future__ import annotations

import json

import pytest
from test_e2e_ppo import assets, comparable, finite, run  # noqa: F401 (fixture)

from verl.trainer.main_ppo import load_default_config

pytest.importorskip("peft")

LORA = (
    "actor_rollout_ref.model.lora_rank=4",
    "actor_rollout_ref.model.lora_alpha=8",
    "actor_rollout_ref.actor.optim.lr=1e-2",
)


def _trainer(overrides):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager
    from verl.trainer.ppo.utils import Role

    config = load_default_config(
        ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=True", *overrides]
    )
    pools = ResourcePoolManager({"global_pool": [1]}, {Role.ActorRollout: "global_pool"}, use_gpu=False)
    return RayPPOTrainer(
        config, None, {Role.ActorRollout: object}, pools, train_dataset=[{"x": 1}] * 64, val_dataset=[{"x": 1}]
    )


def test_lora_reference_needs_no_reference_worker():
    from verl.trainer.ppo.utils import reference_in_actor

    assert reference_in_actor(load_default_config(["actor_rollout_ref.model.lora_rank=8"]))
    assert reference_in_actor(load_default_config(["actor_rollout_ref.model.lora_adapter_path=/a"]))
    assert not reference_in_actor(load_default_config([]))
    trainer = _trainer(["actor_rollout_ref.model.lora_rank=8"])
    assert trainer.use_reference_policy and trainer.ref_in_actor
    with pytest.raises(ValueError, match="has no Role.RefPolicy"):
        _trainer([])  # full fine-tuning still needs a reference worker


@pytest.mark.slow
@pytest.mark.ray
def test_grpo_lora_kl_from_the_disabled_adapter_and_exact_adapter_only_resume(ray_session, assets, tmp_path):  # noqa: F811
    common = (
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.save_freq=2",
        "actor_rollout_ref.actor.checkpoint.save_lora_only=True",
        *LORA,
    )
    _, straight = run(assets, tmp_path / "a", *common, "trainer.total_training_steps=4")
    assert sorted(straight) == [1, 2, 3, 4]
    # B = 0 at step 1: the actor equals its reference exactly, then the adapter moves it away
    assert straight[1]["actor/kl_loss"] == 0.0
    assert finite(straight[4]["actor/kl_loss"]) and straight[4]["actor/kl_loss"] > 0
    assert "timing_s/ref" in straight[1]
    step2 = tmp_path / "a" / "ckpt" / "global_step_2" / "actor"
    # adapter only: the optimizer's shards and huggingface/ with config and tokenizer, no merged weights
    assert sorted(p.name for p in step2.iterdir() if p.is_dir()) == ["dcp", "huggingface", "lora_adapter"]
    assert not (step2 / "huggingface" / "model.safetensors").exists()
    assert json.loads((step2 / "lora_adapter" / "adapter_config.json").read_text())["r"] == 4

    _, first = run(assets, tmp_path / "b", *common, "trainer.total_training_steps=2")
    _, resumed = run(assets, tmp_path / "b", *common, "trainer.total_training_steps=4")
    for step in (1, 2):
        assert comparable(first[step]) == comparable(straight[step])
    for step in (3, 4):
        assert comparable(resumed[step]) == comparable(straight[step]), step


@pytest.mark.slow
@pytest.mark.ray
def test_ppo_with_a_lora_actor_and_a_lora_critic(ray_session, assets, tmp_path):  # noqa: F811
    _, m = run(
        assets,
        tmp_path,
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=True",
        *LORA,
        "critic.model.lora_rank=4",
        "critic.model.lora_alpha=8",
        "critic.optim.lr=1e-2",
        "trainer.save_freq=2",
    )
    assert sorted(m) == [0, 1, 2]
    for key in ("critic/vf_loss", "actor/pg_loss", "actor/reward_kl_penalty"):
        assert finite(m[2][key]), key
    assert m[1]["actor/reward_kl_penalty"] == 0.0  # the LoRA actor equals its reference before the first update
    ckpt = tmp_path / "ckpt" / "global_step_2"
    assert (ckpt / "critic" / "lora_adapter" / "adapter_model.safetensors").is_file()
    assert (ckpt / "actor" / "lora_adapter" / "adapter_config.json").is_file()
