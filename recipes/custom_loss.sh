#!/usr/bin/env bash
# A user-defined policy loss, registered from a user file and selected by name: no edit of verl.
#
# The file docs/examples/custom_policy_loss.py registers `truncated_pg` with
# `@register_policy_loss("truncated_pg")`; `trainer.external_modules` imports it in the driver and
# in every worker process before the config is validated, so the name is accepted.
# Point LOSS_FILE at your own file to try yours:
#   LOSS_FILE=/path/to/my_loss.py bash recipes/custom_loss.sh actor_rollout_ref.actor.policy_loss.loss_mode=my_loss
#
# With no arguments this trains on the embedded default (tiny model + toy task, CPU is fine).
# Every extra argument is a Hydra override passed through. For a real model on GPUs add the
# settings shown in recipes/grpo.sh (model.path, data files, rollout.name=vllm, batch sizes).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
LOSS_FILE="${LOSS_FILE:-$here/../docs/examples/custom_policy_loss.py}"
exec "${PYTHON:-python}" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.rollout.n=8 \
    "trainer.external_modules=[$LOSS_FILE]" \
    actor_rollout_ref.actor.policy_loss.loss_mode=truncated_pg \
    +actor_rollout_ref.actor.policy_loss.extra.truncation=2.0 \
    "$@"
