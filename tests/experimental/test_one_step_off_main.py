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


# upstream's verl/experimental/one_step_off_policy/shell/grpo_0.6b_gsm8k_fsdp2_2_6.sh (main,
# 2026-12), its overrides as written, with this machine's files for the model and the data
UPSTREAM_GRPO_2_6 = """algorithm.adv_estimator=grpo data.train_batch_size=1152 data.max_prompt_length=512
data.max_response_length=1024 data.filter_overlong_prompts=True data.truncation=error
actor_rollout_ref.actor.fsdp_config.strategy=fsdp2 critic.strategy=fsdp2 actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.hybrid_engine=False actor_rollout_ref.model.use_remove_padding=True
actor_rollout_ref.actor.ppo_mini_batch_size=192 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32
actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0
actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
actor_rollout_ref.rollout.load_format=safetensors actor_rollout_ref.rollout.layered_summon=True
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 actor_rollout_ref.ref.fsdp_config.param_offload=True
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.val_before_train=True
trainer.logger=[console,tensorboard] trainer.project_name=GRPO trainer.experiment_name=x trainer.save_freq=-1
trainer.test_freq=5 trainer.total_epochs=2 trainer.nnodes=1 trainer.n_gpus_per_node=6 rollout.nnodes=1
rollout.n_gpus_per_node=2""".split()


@pytest.mark.slow
def test_upstreams_one_step_off_script_stops_naming_the_missing_engine_or_validates_with_hf(tmp_path):
    from verl.utils import embedded_default

    local = [
        f"actor_rollout_ref.model.path={embedded_default.model_path()}",
        f"data.train_files={embedded_default.train_files()}",
        f"data.val_files={embedded_default.val_files()}",
        f"trainer.default_local_dir={tmp_path}/ckpt",
    ]
    with pytest.raises(ValueError, match=r"rollout\.name=vllm: the vllm rollout without a CUDA GPU is not available"):
        validate_config(load_config(UPSTREAM_GRPO_2_6 + local))
    v = validate_config(load_config(UPSTREAM_GRPO_2_6 + local + ["actor_rollout_ref.rollout.name=hf"]))
    plan = v.async_plan
    # one step trains its 1152 prompts in 6 mini-batches of 192, then syncs; 2 rollout processes
    assert (plan.lookahead, plan.rollout_world_size, v.trainer.v1.separate_async.parameter_sync_step) == (1, 2, 6)
