#!/usr/bin/env bash
# One-step-off-policy GRPO (upstream's verl.experimental.one_step_off_policy): the rollout runs on
# workers of its own and generates batch t+1 with the weights after step t-1 while step t trains;
# weights reach it through the checkpoint engine after every step (docs/async.md).
#
# With no arguments this trains on the embedded default (tiny model + toy task, CPU is fine): one
# actor process and one rollout process.
#   bash recipes/one_step_off.sh
# Every extra argument is a Hydra override passed through, e.g. trainer.total_training_steps=20.
#
# On GPU nodes with a real model, e.g. 4 training GPUs and 4 rollout GPUs:
#   actor_rollout_ref.model.path=/models/Qwen2.5-7B-Instruct actor_rollout_ref.rollout.name=vllm \
#   trainer.n_gpus_per_node=4 rollout.n_gpus_per_node=4 rollout.nnodes=1 \
#   actor_rollout_ref.rollout.checkpoint_engine.backend=nccl
set -euo pipefail
exec "${PYTHON:-python}" -m verl.experimental.one_step_off_policy.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.actor.use_kl_loss=False \
    "$@"
