#!/usr/bin/env bash
# The whole pipeline on the embedded task (tiny model + two-digit addition, CPU is fine), with
# upstream main's entry points:
#   1. SFT warm-up from the random init (verl.trainer.sft_trainer on the shipped sft/ data)
#   2. GRPO on the warmed-up model (verl.trainer.main_ppo; validation on the test split, greedy)
#   3. generation on the test split with the RL model (verl.trainer.main_generation_server, greedy)
#   4. evaluation of those responses (verl.trainer.main_eval): its test_score equals the RL run's
#      last validation accuracy (val-core/verl_toy/addition/reward/mean@1)
#
#   bash recipes/sft_rl_eval.sh                          # 1500 SFT steps, 20 RL steps, in $OUT
#   OUT=/tmp/pipe SFT_STEPS=200 RL_STEPS=4 bash recipes/sft_rl_eval.sh
#   SFT_INIT=/models/base bash recipes/sft_rl_eval.sh    # SFT from this model instead of the random init
#   SFT_ARGS="optim.lr=1e-4 data.train_batch_size=32" bash recipes/sft_rl_eval.sh   # SFT overrides
# Every argument is a Hydra override of the RL run (e.g. actor_rollout_ref.actor.optim.lr=1e-5).
set -euo pipefail
PY=${PYTHON:-python}
OUT=${OUT:-$(mktemp -d -t verl_sft_rl_eval_XXXX)}
SFT_STEPS=${SFT_STEPS:-1500}
RL_STEPS=${RL_STEPS:-20}
HERE=$(cd "$(dirname "$0")/.." && pwd)
ASSETS=$("$PY" -c "import os, verl; print(os.path.join(os.path.dirname(verl.__file__), 'assets', 'embedded_default'))")
mkdir -p "$OUT"
echo "== outputs in $OUT"

# 1. SFT: the random init and the warm-up command (build_embedded_default.py --write_init), then run it
CMD=$("$PY" "$HERE/scripts/build_embedded_default.py" --write_init "$OUT/sft" --sft_steps "$SFT_STEPS" | tail -n 1)
# the printed command, run with this recipe's python and extra overrides
printf '"${PYTHON:-python}" -m verl.trainer.sft_trainer %s "$@"\n' "${CMD#python -m verl.trainer.sft_trainer }" \
    > "$OUT/sft_command.sh"
# shellcheck disable=SC2086  # SFT_ARGS: space-separated overrides
# hf_model: the checkpoint's huggingface/ holds the weights too (the RL step loads it as its model)
PYTHON="$PY" bash "$OUT/sft_command.sh" ${SFT_INIT:+"model.path=$SFT_INIT"} \
    'checkpoint.save_contents=[model,optimizer,extra,hf_model]' ${SFT_ARGS:-}
SFT_MODEL="$OUT/sft/sft_ckpt/global_step_${SFT_STEPS}/huggingface"

# 2. RL: the embedded default's GRPO settings on the warmed-up model; validation at the last step
"$PY" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path="$SFT_MODEL" \
    data.train_files="$ASSETS/data/train.parquet" \
    data.val_files="$ASSETS/data/test.parquet" \
    data.max_prompt_length=16 data.max_response_length=8 data.train_batch_size=32 \
    data.filter_overlong_prompts=True data.dataloader_num_workers=0 data.seed=1 \
    actor_rollout_ref.model.enable_gradient_checkpointing=False \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.optim.lr=3e-5 \
    actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.n=8 \
    trainer.n_gpus_per_node=1 trainer.balance_batch=False \
    trainer.total_training_steps="$RL_STEPS" trainer.test_freq="$RL_STEPS" trainer.save_freq="$RL_STEPS" \
    trainer.val_before_train=False \
    trainer.default_local_dir="$OUT/rl" trainer.logger='[console,file]' \
    'actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]' \
    "$@"
RL_MODEL="$OUT/rl/global_step_${RL_STEPS}/actor/huggingface"

# 3. generation on the test split, greedy (the validation's sampling settings)
"$PY" -m verl.trainer.main_generation_server \
    data.train_files="$ASSETS/data/test.parquet" data.prompt_key=prompt \
    +data.output_path="$OUT/gen_test.parquet" \
    actor_rollout_ref.model.path="$RL_MODEL" \
    actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.temperature=0 actor_rollout_ref.rollout.n=1 \
    actor_rollout_ref.rollout.prompt_length=16 actor_rollout_ref.rollout.response_length=8

# 4. evaluation
"$PY" -m verl.trainer.main_eval data.path="$OUT/gen_test.parquet" | tee "$OUT/eval.json"
