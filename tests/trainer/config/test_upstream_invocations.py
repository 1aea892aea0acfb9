"""A corpus of upstream-style invocations of `python -m verl.trainer.main_ppo`.

Each entry is the argument list of one of upstream verl's example scripts (examples/grpo_trainer,
examples/ppo_trainer, the algorithm folders and recipes, current and last year's versions), as
users write it; only model and data paths are replaced by local fixtures ($MODEL, $TRAIN,
$VAL). Each one either composes and validates here, or fails before anything starts with the
"not available" message naming the missing feature.

The scripts target GPU machines: the check runs as if a CUDA device were present (so that
`rollout.name=vllm` is judged as a value, not as this machine's hardware), and which logging
packages are installed (`trainer.logger=[console,wandb]`) is left to the machine as well.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from verl.trainer.main_ppo import load_default_config
from verl.trainer.ppo.utils import validate_config

NOT_AVAILABLE = r"is not available in this verl \(available: "


@dataclass(frozen=True)
class Invocation:
    name: str  # the upstream script it is written from
    feature: str  # feature class for the summary
    args: tuple[str, ...]
    expect: str = "ok"  # "ok", or a regex of the refusal message
    config_name: str = "ppo_trainer"


def inv(name, feature, args: str, expect="ok", config_name="ppo_trainer") -> Invocation:
    return Invocation(name, feature, tuple(args.split()), expect, config_name)


GRPO_QWEN3_8B = """algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=False data.train_files=['$TRAIN','$TRAIN']
 data.val_files=['$VAL','$VAL'] data.train_batch_size=1024 data.max_prompt_length=1024 data.max_response_length=2048
 data.filter_overlong_prompts=True data.truncation=error actor_rollout_ref.model.path=$MODEL
 actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.model.enable_gradient_checkpointing=True
 actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size=256
 actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576
 actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
 actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0
 actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
 actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=2
 actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
 actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24576
 actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=24576
 actor_rollout_ref.ref.fsdp_config.param_offload=True trainer.balance_batch=True trainer.logger=[console,wandb]
 trainer.project_name=verl_grpo_gsm8k_math trainer.experiment_name=qwen3_8b_grpo_vllm_fsdp trainer.n_gpus_per_node=8
 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15"""

GRPO_2024 = """algorithm.adv_estimator=grpo data.train_files=$TRAIN data.val_files=$VAL data.train_batch_size=1024
 data.max_prompt_length=512 data.max_response_length=1024 data.filter_overlong_prompts=True data.truncation=error
 actor_rollout_ref.model.path=$MODEL actor_rollout_ref.actor.optim.lr=1e-6
 actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=256
 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40 actor_rollout_ref.actor.use_kl_loss=True
 actor_rollout_ref.actor.kl_loss_coef=0.001 actor_rollout_ref.actor.kl_loss_type=low_var_kl
 actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.model.enable_gradient_checkpointing=True
 actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40 actor_rollout_ref.rollout.tensor_model_parallel_size=2
 actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40 actor_rollout_ref.ref.fsdp_config.param_offload=True
 algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger=[console,wandb]
 trainer.project_name=verl_grpo_example_gsm8k trainer.experiment_name=qwen2_7b_function_rm trainer.n_gpus_per_node=8
 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15"""

PPO_QWEN3_8B = """algorithm.adv_estimator=gae data.train_files=['$TRAIN','$TRAIN'] data.val_files=['$VAL','$VAL']
 data.train_batch_size=1024 data.max_prompt_length=1024 data.max_response_length=2048 data.filter_overlong_prompts=True
 data.truncation=error actor_rollout_ref.model.path=$MODEL actor_rollout_ref.model.use_remove_padding=True
 actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.optim.lr=1e-6
 actor_rollout_ref.actor.ppo_mini_batch_size=256 actor_rollout_ref.actor.use_dynamic_bsz=True
 actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576 actor_rollout_ref.actor.entropy_coeff=0
 actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
 actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async
 actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.gpu_memory_utilization=0.6
 actor_rollout_ref.rollout.n=1 actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True
 actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24576 actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True
 actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=24576 actor_rollout_ref.ref.fsdp_config.param_offload=True
 critic.model.path=$MODEL critic.model.use_remove_padding=True critic.model.enable_gradient_checkpointing=True
 critic.optim.lr=1e-5 critic.use_dynamic_bsz=True critic.ppo_max_token_len_per_gpu=24576 critic.fsdp.param_offload=False
 critic.fsdp.optimizer_offload=False trainer.balance_batch=True trainer.critic_warmup=0 trainer.logger=[console,wandb]
 trainer.project_name=verl_ppo_gsm8k_math trainer.experiment_name=qwen3_8b_vllm_fsdp trainer.n_gpus_per_node=8
 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15"""

PPO_2024 = """algorithm.adv_estimator=gae data.train_files=$TRAIN data.val_files=$VAL data.train_batch_size=1024
 data.max_prompt_length=512 data.max_response_length=512 data.filter_overlong_prompts=True data.truncation=error
 actor_rollout_ref.model.path=$MODEL actor_rollout_ref.actor.optim.lr=1e-6
 actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=256
 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 actor_rollout_ref.actor.fsdp_config.param_offload=False
 actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.actor.use_kl_loss=False
 actor_rollout_ref.model.enable_gradient_checkpointing=True
 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 actor_rollout_ref.rollout.tensor_model_parallel_size=4
 actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.4 critic.optim.lr=1e-5
 critic.model.use_remove_padding=True critic.model.path=$MODEL critic.model.enable_gradient_checkpointing=True
 critic.ppo_micro_batch_size_per_gpu=32 critic.model.fsdp_config.param_offload=False
 critic.model.fsdp_config.optimizer_offload=False algorithm.use_kl_in_reward=False trainer.critic_warmup=0
 trainer.logger=[console,wandb] trainer.project_name=verl_example_gsm8k
 trainer.experiment_name=deepseek_llm_7b_function_rm trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=20
 trainer.test_freq=1 trainer.total_epochs=15"""

RM_SEQ_BALANCE = """algorithm.adv_estimator=gae data.train_files=['$TRAIN','$TRAIN'] data.val_files=['$VAL','$VAL']
 data.train_batch_size=4096 data.max_prompt_length=4096 data.max_response_length=4096 data.filter_overlong_prompts=True
 data.truncation=error data.return_raw_chat=True actor_rollout_ref.model.path=$MODEL
 actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.model.use_remove_padding=True
 actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.ppo_mini_batch_size=512
 actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000
 actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
 actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.rollout.tensor_model_parallel_size=2
 actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.5
 actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24000 critic.optim.lr=1e-5
 critic.model.use_remove_padding=True critic.model.path=$MODEL critic.model.enable_gradient_checkpointing=True
 critic.use_dynamic_bsz=True critic.ppo_max_token_len_per_gpu=98304 critic.model.fsdp_config.param_offload=False
 critic.model.fsdp_config.optimizer_offload=False reward_model.enable=True reward_model.model_path=$MODEL
 reward_model.use_reward_loop=True reward_model.inference.name=vllm reward_model.inference.gpu_memory_utilization=0.8
 reward_model.inference.tensor_model_parallel_size=1 reward_model.inference.prompt_length=8192
 reward_model.inference.response_length=4096 reward_model.num_workers=8 algorithm.use_kl_in_reward=False
 trainer.critic_warmup=0 trainer.logger=[console,wandb] trainer.project_name=verl_example_gsm8k
 trainer.experiment_name=qwen2-7b_hybrid_rm trainer.n_gpus_per_node=8 trainer.val_before_train=False trainer.nnodes=1
 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15"""

REWARD_LOOP_COLOCATE = """algorithm.adv_estimator=gae data.train_files=$TRAIN data.val_files=$VAL
 data.train_batch_size=1024 data.max_prompt_length=1024 data.max_response_length=1024
 actor_rollout_ref.model.path=$MODEL actor_rollout_ref.actor.ppo_mini_batch_size=256
 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 actor_rollout_ref.rollout.name=vllm critic.model.path=$MODEL
 critic.ppo_micro_batch_size_per_gpu=16 reward.reward_model.enable=True reward.reward_model.model_path=$MODEL
 reward.reward_model.rollout.name=vllm reward.reward_model.rollout.gpu_memory_utilization=0.8
 reward.reward_model.rollout.tensor_model_parallel_size=1 reward.reward_model.rollout.prompt_length=2048
 reward.reward_model.rollout.response_length=1024 reward.num_workers=8 trainer.logger=[console,wandb]
 trainer.n_gpus_per_node=8 trainer.nnodes=1"""

# the same GRPO base with an algorithm's flags, as the algorithm folders' scripts write them
_BASE = """algorithm.adv_estimator=grpo data.train_files=$TRAIN data.val_files=$VAL data.train_batch_size=512
 data.max_prompt_length=1024 data.max_response_length=4096 actor_rollout_ref.model.path=$MODEL
 actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.actor.use_dynamic_bsz=True
 actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480 actor_rollout_ref.rollout.name=vllm
 actor_rollout_ref.rollout.n=16 actor_rollout_ref.rollout.tensor_model_parallel_size=4 trainer.logger=[console,wandb]
 trainer.n_gpus_per_node=8 trainer.nnodes=1 """

CORPUS: tuple[Invocation, ...] = (
    inv("grpo_trainer/run_qwen3_8b_fsdp.sh", "GRPO FSDP", GRPO_QWEN3_8B),
    inv("grpo_trainer/run_qwen2-7b.sh (2024)", "GRPO FSDP", GRPO_2024),
    inv(
        "grpo_trainer/run_qwen2-7b_seq_balance.sh",
        "GRPO FSDP",
        GRPO_2024.replace(
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
            "actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000",
        ),
    ),
    inv(
        "grpo_trainer/run_qwen3_8b_fsdp.sh MACHINE=gb200",
        "GRPO FSDP",
        GRPO_QWEN3_8B + " actor_rollout_ref.rollout.enforce_eager=True "
        "actor_rollout_ref.rollout.free_cache_engine=True actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16 "
        "+ray_kwargs.ray_init.num_gpus=4",
    ),
    inv(
        "grpo_trainer (uv runtime_env)",
        "GRPO FSDP",
        GRPO_QWEN3_8B + " +ray_kwargs.ray_init.runtime_env.env_vars.TOKENIZERS_PARALLELISM=true",
    ),
    inv(
        "grpo_trainer (old micro-batch spelling)",
        "GRPO FSDP",
        GRPO_2024.replace(
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
            "actor_rollout_ref.actor.ppo_micro_batch_size=320",
        ),
    ),
    inv("grpo_trainer (+model.torch_dtype)", "GRPO FSDP", GRPO_2024 + " +actor_rollout_ref.model.torch_dtype=bfloat16"),
    inv("ppo_trainer/run_qwen3_8b_vllm_fsdp.sh", "PPO FSDP", PPO_QWEN3_8B),
    inv("ppo_trainer/run_deepseek7b_llm.sh (2024)", "PPO FSDP", PPO_2024),
    inv("ppo_trainer/run_qwen2-7b_rm_seq_balance.sh", "PPO + reward model", RM_SEQ_BALANCE),
    inv("ppo_trainer/run_qwen2.5-3b_rm_reward_loop_colocate.sh", "PPO + reward model", REWARD_LOOP_COLOCATE),
    inv(
        "ppo_trainer/run_qwen2-7b_rm_seq_balance_fused_kernels.sh",
        "PPO FSDP",
        RM_SEQ_BALANCE + " actor_rollout_ref.model.use_fused_kernels=True "
        "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton",
    ),
    inv(
        "dapo (recipe)",
        "algorithms",
        _BASE
        + """data.gen_batch_size=1536 algorithm.filter_groups.enable=True algorithm.filter_groups.metric=acc
        algorithm.filter_groups.max_num_gen_batches=10 actor_rollout_ref.actor.clip_ratio_low=0.2
        actor_rollout_ref.actor.clip_ratio_high=0.28 actor_rollout_ref.actor.clip_ratio_c=10.0
        actor_rollout_ref.actor.loss_agg_mode=token-mean reward_model.reward_manager=dapo
        +reward_model.reward_kwargs.overlong_buffer_cfg.enable=True
        +reward_model.reward_kwargs.overlong_buffer_cfg.len=512
        +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0
        +reward_model.reward_kwargs.overlong_buffer_cfg.log=False +reward_model.reward_kwargs.max_resp_len=4096
        actor_rollout_ref.rollout.val_kwargs.top_k=-1 actor_rollout_ref.rollout.val_kwargs.top_p=0.7
        actor_rollout_ref.rollout.val_kwargs.temperature=1.0 actor_rollout_ref.rollout.val_kwargs.n=1
        actor_rollout_ref.rollout.val_kwargs.do_sample=True actor_rollout_ref.actor.ulysses_sequence_parallel_size=1""",
    ),
    inv(
        "dapo (reward.* spelling)",
        "algorithms",
        _BASE + "algorithm.filter_groups.enable=True algorithm.filter_groups.metric=acc "
        "reward.reward_manager.name=dapo",
    ),
    inv(
        "gspo_trainer",
        "algorithms",
        _BASE + "actor_rollout_ref.actor.policy_loss.loss_mode=gspo "
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean actor_rollout_ref.actor.clip_ratio_low=0.0003 "
        "actor_rollout_ref.actor.clip_ratio_high=0.0004",
    ),
    inv(
        "sapo_trainer/run_qwen3_8b_fsdp.sh",
        "algorithms",
        _BASE + "actor_rollout_ref.actor.policy_loss.loss_mode=sapo "
        "+actor_rollout_ref.actor.policy_loss.tau_pos=1.0 +actor_rollout_ref.actor.policy_loss.tau_neg=1.05 "
        "actor_rollout_ref.actor.strategy=fsdp2",
    ),
    inv(
        "sapo (actor-level tau)",
        "algorithms",
        _BASE + "actor_rollout_ref.actor.policy_loss.loss_mode=sapo "
        "actor_rollout_ref.actor.tau_pos=1.0 actor_rollout_ref.actor.tau_neg=1.05",
    ),
    inv(
        "cispo",
        "algorithms",
        _BASE + "actor_rollout_ref.actor.policy_loss.loss_mode=cispo "
        "actor_rollout_ref.actor.clip_ratio_low=10 actor_rollout_ref.actor.clip_ratio_high=0.2",
    ),
    inv(
        "gpg_trainer",
        "algorithms",
        _BASE.replace("adv_estimator=grpo", "adv_estimator=gpg") + "actor_rollout_ref.actor.policy_loss.loss_mode=gpg",
    ),
    inv("rloo_trainer", "algorithms", _BASE.replace("adv_estimator=grpo", "adv_estimator=rloo")),
    inv("remax_trainer", "algorithms", _BASE.replace("adv_estimator=grpo", "adv_estimator=remax")),
    inv(
        "reinforce_plus_plus_trainer",
        "algorithms",
        _BASE.replace("adv_estimator=grpo", "adv_estimator=reinforce_plus_plus"),
    ),
    inv("gdpo_trainer", "algorithms", _BASE.replace("adv_estimator=grpo", "adv_estimator=gdpo")),
    inv(
        "otb (optimal_token_baseline)",
        "algorithms",
        _BASE.replace("adv_estimator=grpo", "adv_estimator=optimal_token_baseline")
        + " actor_rollout_ref.actor.calculate_sum_pi_squared=True",
        expect=r"calculate_sum_pi_squared=true: sum of squared policy probabilities .* " + NOT_AVAILABLE,
    ),
    inv(
        "rollout_correction (token TIS)",
        "rollout correction",
        _BASE + "algorithm.rollout_correction.rollout_is=token "
        "algorithm.rollout_correction.rollout_is_threshold=2.0 actor_rollout_ref.rollout.calculate_log_probs=True",
    ),
    inv(
        "rollout_correction (bypass mode)",
        "rollout correction",
        _BASE + "algorithm.rollout_correction.bypass_mode=True "
        "algorithm.rollout_correction.loss_type=ppo_clip algorithm.rollout_correction.rollout_is_batch_normalize=True",
    ),
    inv(
        "rollout_correction (multi-rule RS)",
        "rollout correction",
        _BASE + "algorithm.rollout_correction.rollout_rs='token_k1,seq_max_k2' "
        "algorithm.rollout_correction.rollout_rs_threshold='0.5_2.0,0.01'",
    ),
    inv(
        "grpo_trainer/run_qwen3-4b_gsm8k_grpo_lora_merge.sh",
        "LoRA",
        GRPO_2024 + " actor_rollout_ref.model.lora_rank=64 "
        "actor_rollout_ref.model.lora_alpha=32 actor_rollout_ref.model.target_modules=all-linear",
    ),
    inv(
        "grpo_trainer/run_qwen2_5_vl_7b_fsdp.sh",
        "multimodal",
        GRPO_2024 + " data.image_key=pixel_values",
        expect=r"data\.image_key=pixel_values: multimodal \(image/video/audio\) inputs " + NOT_AVAILABLE,
    ),
    inv(
        "grpo_trainer (vision tower)",
        "multimodal",
        GRPO_2024 + " actor_rollout_ref.actor.freeze_vision_tower=True",
        expect=r"freeze_vision_tower=true: multimodal",
    ),
    inv(
        "grpo_trainer/run_qwen2_5_vl_7b_sglang_fsdp.sh",
        "SGLang / TensorRT-LLM",
        GRPO_2024.replace("rollout.name=vllm", "rollout.name=sglang"),
        expect=r"actor_rollout_ref\.rollout\.name=sglang: this rollout engine \(SGLang, TensorRT-LLM\) "
        + NOT_AVAILABLE,
    ),
    inv(
        "grpo_trainer/run_qwen2-7b_math_trtllm.sh",
        "SGLang / TensorRT-LLM",
        GRPO_2024.replace("rollout.name=vllm", "rollout.name=trtllm"),
        expect=r"actor_rollout_ref\.rollout\.name=trtllm: this rollout engine",
    ),
    inv(
        "ppo_trainer/run_qwen3_8b_megatron.sh",
        "Megatron",
        PPO_2024.replace("critic.model.fsdp_config.param_offload=False", "").replace(
            "critic.model.fsdp_config.optimizer_offload=False", ""
        )
        + " actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"
        " actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 critic.megatron.tensor_model_parallel_size=2",
        expect=r"^actor_rollout_ref\.actor\.strategy=megatron: Megatron-LM training " + NOT_AVAILABLE,
        config_name="ppo_megatron_trainer",
    ),
    inv(
        "grpo_trainer/run_qwen3_8b_fsdp.sh DEVICE=npu",
        "NPU / Ulysses",
        GRPO_QWEN3_8B + " actor_rollout_ref.actor.use_torch_compile=False "
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4 "
        "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size=4 "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 "
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 "
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096",
        expect=r"ulysses_sequence_parallel_size=4: Ulysses sequence parallelism " + NOT_AVAILABLE,
    ),
    inv(
        "ulysses sp (2024)",
        "NPU / Ulysses",
        GRPO_2024 + " actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        expect=r"actor_rollout_ref\.actor\.ulysses_sequence_parallel_size=2: Ulysses",
    ),
    inv(
        "multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh",
        "multi-turn / agent",
        GRPO_2024 + " actor_rollout_ref.rollout.mode=async "
        "actor_rollout_ref.rollout.multi_turn.enable=True actor_rollout_ref.rollout.multi_turn.tool_config_path=$TRAIN "
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5",
    ),
    inv(
        "agent loop",
        "multi-turn / agent",
        GRPO_2024 + " actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
    ),
    inv(
        "ppo_trainer/run_qwen2-7b_rm_seq_balance_nsys.sh",
        "profiler",
        GRPO_2024 + " global_profiler.tool=nsys "
        "global_profiler.steps=[1,2,5] actor_rollout_ref.actor.profiler.enable=True "
        "actor_rollout_ref.actor.profiler.all_ranks=True",
        expect=r"the per-role profilers .* " + NOT_AVAILABLE,
    ),
    inv(
        "distillation",
        "other features",
        GRPO_2024 + " distillation.enabled=True",
        expect=r"distillation\.enabled=true: on-policy distillation from teacher models " + NOT_AVAILABLE,
    ),
    inv(
        "data limits",
        "other features",
        GRPO_2024 + " data.train_max_samples=1000",
        expect=r"data\.train_max_samples=1000: limiting the number of training samples " + NOT_AVAILABLE,
    ),
    inv(
        "engine knobs (no effect)",
        "GRPO FSDP",
        GRPO_2024 + " actor_rollout_ref.actor.fsdp_config.forward_prefetch=True "
        "actor_rollout_ref.actor.entropy_checkpointing=True actor_rollout_ref.rollout.max_model_len=4096 "
        "trainer.use_legacy_worker_impl=disable",
    ),
)


@pytest.fixture()
def paths(tmp_path, monkeypatch):
    import torch

    import verl.utils.tracking as tracking

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # a local model directory (validate_config checks for it)
    train, val = tmp_path / "train.parquet", tmp_path / "test.parquet"
    train.write_bytes(b"PAR1")  # present and not empty: validation checks no more (a 0-byte file fails)
    val.write_bytes(b"PAR1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the scripts' GPU machine
    monkeypatch.setattr(tracking, "check_backends_available", lambda backends: None)
    return {"$MODEL": str(model), "$TRAIN": str(train), "$VAL": str(val)}


def substitute(args: tuple[str, ...], paths: dict[str, str]) -> list[str]:
    out = []
    for a in args:
        for k, v in paths.items():
            a = a.replace(k, v)
        out.append(a)
    return out


def check(invocation: Invocation, paths: dict[str, str]) -> tuple[bool, str]:
    """(passed, what happened)."""
    try:
        cfg = load_default_config(substitute(invocation.args, paths), config_name=invocation.config_name)
        validate_config(cfg)
    except Exception as exc:  # noqa: BLE001 - any failure is a result to judge
        message = f"{type(exc).__name__}: {exc}"
        if invocation.expect != "ok" and isinstance(exc, ValueError) and re.search(invocation.expect, str(exc)):
            return True, "refused as expected: " + str(exc)[:160]
        return False, message[:400]
    if invocation.expect == "ok":
        return True, "composes and validates"
    return False, f"validated, but a refusal matching {invocation.expect!r} was expected"


def _params():
    for i in CORPUS:
        yield pytest.param(i, id=i.name)


@pytest.mark.slow
@pytest.mark.parametrize("invocation", list(_params()))
def test_upstream_invocation(invocation, paths):
    passed, what = check(invocation, paths)
    assert passed, f"{invocation.name}: {what}"


def test_corpus_covers_the_feature_classes():
    classes = {i.feature for i in CORPUS}
    assert {
        "GRPO FSDP",
        "PPO FSDP",
        "algorithms",
        "LoRA",
        "multimodal",
        "Megatron",
        "SGLang / TensorRT-LLM",
        "multi-turn / agent",
    } <= classes
    assert len(CORPUS) >= 40
