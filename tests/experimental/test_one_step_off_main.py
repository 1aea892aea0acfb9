"""The one-step-off entry point's config (`one_step_off_ppo_trainer`): what it sets and refuses."""

from __future__ import annotations

import pytest

from verl.experimental.one_step_off_policy.main_ppo import load_config
from verl.trainer.ppo.utils import validate_config


@pytest.mark.slow  # validates a whole config; the other two tests here only compose it
def test_the_preset_is_the_async_trainer_one_batch_ahead():
    cfg = load_config(["algorithm.adv_estimator=grpo", "rollout.nnodes=1", "rollout.n_gpus_per_node=3"])
    assert "rollout" not in cfg  # upstream's top-level section, moved into actor_rollout_ref.rollout
    ro = cfg.actor_rollout_ref.rollout
    assert (ro.nnodes, ro.n_gpus_per_node, cfg.actor_rollout_ref.hybrid_engine) == (1, 3, False)
    v = validate_config(cfg)
    plan = v.async_plan
    assert (plan.mode, plan.lookahead, plan.max_staleness, plan.rollout_world_size) == ("separate_async", 1, 1, 3)
    assert plan.backend == "gloo"  # upstream's nccl default, on CPU
    assert v.trainer.v1.separate_async.parameter_sync_step == 1  # 32 prompts in one mini-batch of 32
    assert v.algorithm.rollout_correction.bypass_mode is True


def test_the_embedded_default_runs_one_rollout_process():
    cfg = load_config(["algorithm.adv_estimator=grpo"])
    assert cfg.actor_rollout_ref.rollout.n_gpus_per_node == 1


def test_trainer_v1_on_its_command_line_is_refused():
    with pytest.raises(
        ValueError, match=r"trainer\.v1\.separate_async\.num_warmup_batches: .* sets trainer\.v1 itself"
    ):
        load_config(["trainer.v1.separate_async.num_warmup_batches=2"])
