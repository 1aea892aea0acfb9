#!/usr/bin/env bash
# DAPO (Yu et al. 2025): clip-higher (0.2 / 0.28), dynamic sampling (drop all-equal groups, keep generating), token-level loss, soft overlong penalty, no KL.
#
# With no arguments this trains on the embedded default (tiny model + toy task, CPU is fine):
#   bash recipes/dapo.sh
# Every extra argument is a Hydra override passed through, e.g. trainer.total_training_steps=20.
#
# On a GPU node with a real model, add for example (values for a 7B model on 8 GPUs):
#   actor_rollout_ref.model.path=/models/Qwen2.5-7B-Instruct \
#   data.train_files=$HOME/data/gsm8k/train.parquet data.val_files=$HOME/data/gsm8k/test.parquet \
#   data.max_prompt_length=512 data.max_response_length=1024 data.train_batch_size=1024 \
#   actor_rollout_ref.actor.ppo_mini_batch_size=256 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
#   actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.rollout.name=vllm \
#   actor_rollout_ref.rollout.gpu_memory_utilization=0.6 trainer.n_gpus_per_node=8 trainer.nnodes=1
# (scripts/data_preprocess/gsm8k.py makes the parquet files; pip install -e ".[vllm]" for vllm.)
set -euo pipefail
exec "${PYTHON:-python}" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    algorithm.filter_groups.enable=True \
    algorithm.filter_groups.metric=acc \
    algorithm.filter_groups.max_num_gen_batches=4 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.clip_ratio_c=10.0 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    reward.reward_manager.name=dapo \
    +reward.reward_kwargs.overlong_buffer_cfg.enable=True \
    +reward.reward_kwargs.overlong_buffer_cfg.len=4 \
    +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 \
    +reward.reward_kwargs.max_resp_len=16 \
    "$@"
