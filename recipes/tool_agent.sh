#!/usr/bin/env bash
# Multi-turn tool use (agent loop): GRPO on the embedded calculator task. A tiny model, warmed up by
# SFT on a teacher who calls the `calculator` tool in 30% of its demonstrations, learns to call
# it on every 3-digit x 2-digit product (tool_agent loop, verl_toy call format). CPU is fine:
# greedy accuracy 0% -> >= 90% within 12 steps (docs/agent_loop.md); with the tool disabled it stays 0%.
#
#   bash recipes/tool_agent.sh                                     # learns in a few minutes
#   bash recipes/tool_agent.sh actor_rollout_ref.rollout.multi_turn.tool_config_path=null   # tool disabled
#
# Every extra argument is a Hydra override passed through. For a real model with Hermes-style
# calls (Qwen2.5-Instruct) set actor_rollout_ref.model.path=..., data.train_files=... (rows with
# agent_name=tool_agent), multi_turn.format=hermes, multi_turn.use_inference_chat_template=True and
# your tool yaml; see docs/agent_loop.md.
set -euo pipefail
PY="${PYTHON:-python}"
CALC="${VERL_EMBEDDED_CALCULATOR_DIR:-$("$PY" -c 'from verl.utils.embedded_default import calculator_dir; print(calculator_dir())')}"
exec "$PY" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    actor_rollout_ref.model.path="$CALC/model" \
    data.train_files="$CALC/data/train.parquet" \
    data.val_files="$CALC/data/test.parquet" \
    data.return_raw_chat=True \
    data.max_prompt_length=16 \
    data.max_response_length=48 \
    data.train_batch_size=16 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.multi_turn.enable=True \
    actor_rollout_ref.rollout.multi_turn.format=verl_toy \
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$CALC/tool_config.yaml" \
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3 \
    actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent \
    actor_rollout_ref.actor.optim.lr=1e-4 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean \
    trainer.test_freq=4 \
    trainer.total_training_steps=40 \
    "$@"
