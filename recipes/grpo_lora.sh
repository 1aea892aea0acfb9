#!/usr/bin/env bash
# GRPO with a LoRA adapter (peft): the base model is frozen, only a rank-r adapter on every linear
# layer is trained, and the reference policy of the KL loss is the actor with its adapter disabled
# (no second model, no reference worker). See docs/lora.md.
#
# With no arguments this trains on the embedded default (tiny model + toy task, CPU is fine):
#   bash recipes/grpo_lora.sh
# Every extra argument is a Hydra override passed through, e.g. actor_rollout_ref.model.lora_rank=16.
#
# LoRA needs a higher learning rate than full fine-tuning (the embedded default: 1e-3 against 3e-5;
# measured with scripts/bench_lora.py, figures in docs/lora.md). On a GPU node with a real model,
# add for example:
#   actor_rollout_ref.model.path=/models/Qwen2.5-7B-Instruct actor_rollout_ref.model.lora_rank=32 \
#   actor_rollout_ref.model.lora_alpha=32 actor_rollout_ref.actor.optim.lr=3e-5 \
#   actor_rollout_ref.rollout.name=vllm trainer.n_gpus_per_node=8
# (vLLM gets the merged weights W + (alpha/r) B A at every sync.)
# Checkpoints hold global_step_N/actor/lora_adapter/ (peft format); with
# actor_rollout_ref.actor.checkpoint.save_lora_only=True nothing else of the weights is written.
set -euo pipefail
exec "${PYTHON:-python}" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.norm_adv_by_std_in_grpo=True \
    algorithm.use_kl_in_reward=False \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.model.lora_rank=8 \
    actor_rollout_ref.model.lora_alpha=16 \
    actor_rollout_ref.model.target_modules=all-linear \
    actor_rollout_ref.actor.optim.lr=1e-3 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean \
    "$@"
