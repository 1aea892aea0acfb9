"""Every public name of upstream verl's user-facing modules exists here with a compatible signature.

`UPSTREAM_NAMES` lists, per module, the public names of upstream's module (verl-project/verl,
main branch and latest release, read from its source) and, per callable, the parameter names
upstream callers pass by keyword (``None``: the name only has to exist). A name is compatible
when it resolves (``Class.method`` through the class) and its signature (``__init__`` for a
class) has each listed parameter, or takes ``**kwargs``.

For the algorithm modules (`POSITIONAL`) the lists are upstream's parameters in order, and the
check is stricter (`test_upstream_positional_order`): our function takes them at the same
positions, so positional calls work too, and any parameter we add comes after them with a default.

Two rules:

- `NOT_PROVIDED`: names this project deliberately does not provide, each with its reason; the
  same reasons are listed in docs/extending.md ("What upstream modules are not provided and
  why"). The test checks they are missing and documented.
- Everything else must resolve (`test_upstream_public_name_is_compatible`).

`count_upstream_names()` returns (present, total) per module for the closing note.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

P = None  # existence only
# parameter lists shared by several upstream functions (in upstream's order)
_LOSS = ["old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode", "config", "rollout_is_weights"]
_GRPO = ["token_level_rewards", "response_mask", "index", "epsilon", "norm_adv_by_std_in_grpo", "config"]
_GROUP = ["token_level_rewards", "response_mask", "index", "epsilon", "config"]
_OTB = [
    "token_level_rewards",
    "response_mask",
    "index",
    "old_log_probs",
    "sum_pi_squared",
    "rollout_is_weights",
    "handle_zero_tail",
    "epsilon",
]

UPSTREAM_NAMES: dict[str, dict[str, list[str] | None]] = {
    "verl.protocol": {
        "DataProto": P,
        "DataProtoItem": P,
        "DataProtoFuture": P,
        "DataProtoConfig": P,
        "BatchData": P,
        "pad_dataproto_to_divisor": ["data", "size_divisor"],
        "unpad_dataproto": ["data", "pad_size"],
        "union_tensor_dict": ["tensor_dict1", "tensor_dict2"],
        "union_numpy_dict": ["tensor_dict1", "tensor_dict2"],
        "list_of_dict_to_dict_of_list": ["list_of_dict"],
        "fold_batch_dim": ["data", "new_batch_size"],
        "unfold_batch_dim": ["data", "batch_dims"],
        "serialize_single_tensor": ["obj"],
        "serialize_tensordict": ["batch"],
        "deserialize_single_tensor": ["arr"],
        "deserialize_tensordict": ["arr"],
        "collate_fn": ["x"],
        "all_gather_data_proto": ["data", "process_group"],
        "DataProto.from_dict": ["tensors", "non_tensors", "meta_info", "num_batch_dims", "auto_padding"],
        "DataProto.from_single_dict": ["data", "meta_info", "auto_padding"],
        "DataProto.from_tensordict": ["tensor_dict", "meta_info", "num_batch_dims"],
        "DataProto.to_tensordict": [],
        "DataProto.select": ["batch_keys", "non_tensor_batch_keys", "meta_info_keys", "deepcopy"],
        "DataProto.select_idxs": ["idxs"],
        "DataProto.slice": ["start", "end", "step"],
        "DataProto.pop": ["batch_keys", "non_tensor_batch_keys", "meta_info_keys"],
        "DataProto.rename": ["old_keys", "new_keys"],
        "DataProto.union": ["other"],
        "DataProto.make_iterator": ["mini_batch_size", "epochs", "seed", "dataloader_kwargs"],
        "DataProto.is_padding_enabled": [],
        "DataProto.padding": ["padding_size", "padding_candidate"],
        "DataProto.chunk": ["chunks"],
        "DataProto.split": ["split_size"],
        "DataProto.concat": ["data"],
        "DataProto.reorder": ["indices"],
        "DataProto.repeat": ["repeat_times", "interleave"],
        "DataProto.unfold_column_chunks": ["n_split", "split_keys"],
        "DataProto.sample_level_repeat": ["repeat_times"],
        "DataProto.get_data_info": [],
        "DataProto.print_size": ["prefix"],
        "DataProto.print_summary": ["desc"],
        "DataProto.check_consistency": [],
        "DataProto.save_to_disk": ["filepath"],
        "DataProto.load_from_disk": ["filepath"],
        "DataProto.to": ["device"],
        "DataProtoFuture.concat": ["data"],
        "DataProtoFuture.chunk": ["chunks"],
        "DataProtoFuture.get": [],
        "BatchData.is_chunkable": [],
        "BatchData.chunk": ["chunks"],
        "BatchData.is_concatable": [],
        "BatchData.concat": [],
    },
    "verl.utils.tensordict_utils": {
        "assign_non_tensor_data": ["tensor_dict", "key", "val"],
        "assign_non_tensor_stack": ["tensor_dict", "key", "val"],
        "assign_non_tensor": ["tensor_dict"],
        "unwrap_non_tensor_data": ["data"],
        "get_non_tensor_data": ["data", "key", "default"],
        "nested_tensor_from_tensor_list": ["tensors", "ragged_idx"],
        "concat_nested_tensors": ["tensors"],
        "concat_tensordict_with_none_bsz": ["data"],
        "concat_tensordict": ["data"],
        "chunk_tensordict": ["td", "chunks"],
        "get_tensordict": ["tensor_dict", "non_tensor_dict"],
        "index_select_tensor_dict": ["batch", "indices"],
        "union_tensor_dict": ["tensor_dict1", "tensor_dict2"],
        "make_iterator": ["tensordict", "mini_batch_size", "epochs", "seed", "dataloader_kwargs"],
        "assert_tensordict_eq": ["tensordict1", "tensordict2"],
        "get": ["tensordict", "key", "default"],
        "get_keys": ["tensordict", "keys"],
        "pop": ["tensordict", "key", "default"],
        "pop_keys": ["tensordict", "keys"],
        "pad_to_divisor": ["data", "size_divisor"],
        "unpad": ["data", "pad_size"],
        "contiguous": ["data"],
        "maybe_fix_3d_position_ids": ["data"],
        "list_of_dict_to_tensordict": ["list_of_dicts"],
    },
    "verl.utils.torch_functional": {
        "gather_from_labels": ["data", "label"],
        "logprobs_from_logits": ["logits", "labels", "inplace_backward"],
        "logprobs_from_logits_flash_attn": ["logits", "labels", "inplace_backward"],
        "logprobs_from_logits_torch_npu": ["logits", "labels"],
        "logprobs_from_logits_naive": ["logits", "labels"],
        "logprobs_from_logits_v2": ["logits", "labels"],
        "clip_by_value": ["x", "tensor_min", "tensor_max"],
        "entropy_from_logits": ["logits"],
        "entropy_from_logits_with_chunking": ["logits", "chunk_size"],
        "masked_sum": ["values", "mask", "axis"],
        "masked_mean": ["values", "mask", "axis"],
        "masked_var": ["values", "mask", "unbiased"],
        "masked_whiten": ["values", "mask", "shift_mean"],
        "get_response_mask": ["response_id", "eos_token", "dtype"],
        "compute_grad_norm": ["model"],
        "broadcast_dict_tensor": ["tensors", "src", "group"],
        "allgather_dict_tensors": ["tensors", "size", "group", "dim"],
        "allgather_dict_into_dict": ["data", "group"],
        "split_dict_tensor_into_batches": ["tensors", "batch_size"],
        "pad_2d_list_to_length": ["response", "pad_token_id", "max_length"],
        "pad_and_stack": ["tensors", "pad_value"],
        "pad_along_dim": ["tensor", "target_length", "pad_value", "dim"],
        "pad_sequence_to_length": ["tensors", "max_seq_len", "pad_token_id", "left_pad"],
        "postprocess_data": ["input_ids", "attention_mask", "max_length", "pad_token_id", "left_pad", "truncation"],
        "tokenize_and_postprocess_data": [
            "prompt",
            "tokenizer",
            "max_length",
            "pad_token_id",
            "left_pad",
            "truncation",
        ],
        "remove_pad_token": ["input_ids", "attention_mask"],
        "log_probs_from_logits_response": ["input_ids", "logits", "response_length"],
        "log_probs_from_logits_response_rmpad": ["input_ids", "attention_mask", "logits_rmpad", "response_length"],
        "log_probs_from_logits_all_rmpad": [
            "input_ids_rmpad",
            "logits_rmpad",
            "indices",
            "batch_size",
            "seqlen",
            "response_length",
        ],
        "post_process_logits": ["input_ids", "logits", "temperature", "top_k", "top_p"],
        "calculate_sum_pi_squared_from_logits": ["logits"],
        "get_cosine_schedule_with_warmup": [
            "optimizer",
            "num_warmup_steps",
            "num_training_steps",
            "min_lr_ratio",
            "num_cycles",
            "last_epoch",
            "init_lr_ratio",
            "zero_indexed_step",
        ],
        "get_constant_schedule_with_warmup": ["optimizer", "num_warmup_steps", "last_epoch"],
        "prepare_decoder_attention_mask": ["attention_mask", "input_shape", "inputs_embeds"],
        "get_unpad_data": ["attention_mask"],
        "get_wsd_schedule_with_warmup": [
            "optimizer",
            "num_warmup_steps",
            "num_training_steps",
            "min_lr_ratio",
            "num_cycles",
            "last_epoch",
            "stable_ratio",
        ],
        "check_device_is_available": [],
        "distributed_mean_max_min_std": ["local_tensor", "compute_max", "compute_min", "compute_std"],
        "distributed_masked_mean": ["local_tensor", "local_mask"],
        "expand_as_nested": ["tensor", "nested_tensor"],
        "use_original_torch_compile": [],
        "FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE": P,
        "NPU_CROSS_ENTROPY_LOSS_AVAILABLE": P,
    },
    "verl.utils.reward_score": {
        "default_compute_score": [
            "data_source",
            "solution_str",
            "ground_truth",
            "extra_info",
            "sandbox_fusion_url",
            "concurrent_semaphore",
            "memory_limit_mb",
            "method",
        ],
        "_default_compute_score": [
            "data_source",
            "solution_str",
            "ground_truth",
            "extra_info",
            "sandbox_fusion_url",
            "concurrent_semaphore",
            "memory_limit_mb",
        ],
        "get_default_compute_score": ["reward_name"],
    },
    "verl.utils.reward_score.gsm8k": {
        "compute_score": ["solution_str", "ground_truth", "method", "format_score", "score"],
        "extract_solution": ["solution_str", "method"],
    },
    "verl.utils.reward_score.math_reward": {
        "compute_score": ["solution_str", "ground_truth"],
        "last_boxed_only_string": P,
        "remove_boxed": P,
        "is_equiv": P,
        "strip_string": P,
    },
    "verl.utils.reward_score.math_dapo": {
        "compute_score": ["solution_str", "ground_truth", "strict_box_verify", "pause_tokens_index"],
        "normalize_final_answer": ["final_answer"],
        "last_boxed_only_string": P,
        "remove_boxed": ["s"],
        "is_correct_minerva": ["solution_str", "gt", "gt_need_extract", "answer_pattern"],
        "is_correct_strict_box": ["pred", "gt", "pause_tokens_index"],
        "verify": ["solution_str", "answer", "strict_box_verify", "pause_tokens_index"],
    },
    "verl.utils.reward_score.math_verify": {"compute_score": ["model_output", "ground_truth", "timeout_score"]},
    "verl.utils.reward_score.prime_math": {
        "compute_score": ["model_output", "ground_truth"],
        "grade_answer": ["given_answer", "ground_truth"],
        "match_answer": ["response"],
        "remove_boxed": ["s"],
        "should_allow_eval": ["expr"],
        "count_unknown_letters_in_expr": ["expr"],
        "are_equal_under_sympy": ["ground_truth_normalized", "given_normalized"],
        "split_tuple": ["expr"],
    },
    "verl.utils.reward_score.prime_math.grader": {
        "math_equal": ["prediction", "reference", "include_percentage", "is_close", "timeout"]
    },
    "verl.utils.reward_score.prime_math.math_normalize": {"normalize_answer": ["answer"]},
    "verl.utils.reward_score.sandbox_fusion": {
        "compute_score": [
            "sandbox_fusion_url",
            "concurrent_semaphore",
            "memory_limit_mb",
            "completion",
            "test_cases",
            "continuous",
            "timeout",
        ],
    },
    "verl.utils.reward_score.sandbox_fusion.utils": {
        "check_correctness": [
            "sandbox_fusion_url",
            "in_outs",
            "generation",
            "timeout",
            "concurrent_semaphore",
            "memory_limit_mb",
        ],
        "call_sandbox_api": P,
    },
    "verl.utils.reward_score.geo3k": {
        "compute_score": ["predict_str", "ground_truth", "use_boxed", "format_score"],
        "format_reward": ["predict_str"],
        "acc_reward": ["predict_str", "ground_truth", "use_boxed"],
    },
    "verl.utils.reward_score.search_r1_like_qa_em": {
        "compute_score": ["solution_str", "ground_truth", "method", "format_score", "score"],
        "compute_score_subem": ["solution_str", "ground_truth", "method", "format_score", "score"],
        "em_check": ["prediction", "golden_answers"],
        "subem_check": ["prediction", "golden_answers"],
        "extract_solution": ["solution_str"],
        "normalize_answer": ["s"],
        "count_answer_tags": ["text"],
    },
    "verl.workers.reward_manager": {
        "register": ["name"],
        "get_reward_manager_cls": ["name"],
        "AbstractRewardManager": P,
        "BatchRewardManager": P,
        "DAPORewardManager": P,
        "NaiveRewardManager": P,
        "PrimeRewardManager": P,
    },
    "verl.workers.reward_manager.prime": {
        "single_compute_score": [
            "evaluation_func",
            "completion",
            "reference",
            "task",
            "task_extra_info",
            "executor",
            "timeout",
        ],
        "parallel_compute_score_async": [
            "evaluation_func",
            "completions",
            "references",
            "tasks",
            "extra_info",
            "num_processes",
        ],
        "run_reward_scoring": ["evaluation_func", "completions", "references", "tasks", "extra_info", "num_processes"],
        "PrimeRewardManager": ["tokenizer", "num_examine", "compute_score", "reward_fn_key"],
    },
    "verl.base_config": {"BaseConfig": P, "BaseConfig.get": ["key", "default"], "BaseConfig._mutable_fields": P},
    "verl.utils": {
        "omega_conf_to_dataclass": ["config", "dataclass_type"],
        "validate_config": ["config", "use_reference_policy", "use_critic"],
        "hf_tokenizer": P,
        "hf_processor": P,
        "get_processor_token_id": P,
        "normalize_token_ids": P,
        "as_torch_index": P,
        "group_mean_std": P,
        "config": P,
        "tokenizer": P,
    },
    "verl.utils.metric": {"reduce_metrics": ["metrics"], "AggregationType": P, "Metric": P, "utils": P},
    "verl.utils.metric.utils": {
        "reduce_metrics": ["metrics"],
        "AggregationType": P,
        "NumericType": P,
        "Numeric": P,
        "Metric": ["aggregation", "value"],
        "Metric.append": ["value"],
        "Metric.extend": ["values"],
        "Metric.aggregate": [],
        "Metric.aggregate_dp": ["metric_lists"],
        "Metric.from_dict": ["data", "aggregation"],
        "Metric.init_list": [],
    },
    "verl.utils.py_functional": {"append_to_dict": ["data", "new_data", "prefix"]},
    "verl.tools.function_tool": {
        "logger": P,
        "FUNCTION_TOOL_REGISTRY": P,
        "_LOADED_FUNCTION_TOOL_PATHS": P,
        "FunctionTool": ["name", "fn", "tool_schema", "is_async"],
        "FunctionTool.call": ["parameters"],
        "function_tool": ["name", "schema"],
        "get_function_tool": ["name"],
        "load_function_tools_from_path": ["path"],
        "normalize_function_tool_return": ["ret"],
    },
    "verl.tools.tool_registry": {
        "ToolType": P,
        "get_tool_class": ["cls_name"],
        "initialize_tools_from_config": ["tools_config_file"],
        "load_all_tools": ["tool_config_path", "function_tool_path"],
    },
    "verl.tools.base_tool": {
        "BaseTool": ["config", "tool_schema"],
        "BaseTool.get_openai_tool_schema": [],
        "BaseTool.create": ["instance_id"],
        "BaseTool.execute": ["instance_id", "parameters"],
        "BaseTool.calc_reward": ["instance_id"],
        "BaseTool.release": ["instance_id"],
    },
    "verl.tools.schemas": {
        "OpenAIFunctionPropertySchema": P,
        "OpenAIFunctionParametersSchema": P,
        "OpenAIFunctionSchema": P,
        "OpenAIFunctionToolSchema": P,
        "OpenAIFunctionParsedSchema": P,
        "OpenAIFunctionCallSchema": P,
        "OpenAIFunctionCallSchema.from_openai_function_parsed_schema": P,
        "OpenAIFunctionToolCall": P,
        "ToolResponse": P,
        "ToolResponse.initialize_request": P,
        "ToolResponse.is_empty": [],
        "ToolResponse.is_text_only": [],
    },
    "verl.experimental.agent_loop.agent_loop": {
        "AgentLoopMetrics": P,
        "AgentLoopOutput": ["prompt_ids", "response_ids", "response_mask", "response_logprobs", "num_turns"],
        "AgentLoopOutput.as_dict": [],
        "DictConfigWrap": ["config"],
        "ToolListWrap": ["tools"],
        "AgentLoopBase": ["trainer_config", "server_manager", "tokenizer", "processor"],
        "AgentLoopBase.run": ["sampling_params"],
        "AgentLoopBase.ct_build_initial_tokens": P,
        "AgentLoopBase.ct_merge_non_assistant_msg": P,
        "AgentLoopBase.ct_merge_assistant_token": P,
        "register": ["agent_name"],
        "AgentLoopWorker": P,
        "AgentLoopWorker.generate_sequences": ["batch"],
        "get_trajectory_info": ["step", "index", "validate"],
        "AgentLoopManager": P,
    },
    "verl.experimental.agent_loop.tool_agent_loop": {
        "logger": P,
        "AgentState": P,
        "AgentData": P,
        "ToolAgentLoop": P,
        "ToolAgentLoop.run": ["sampling_params"],
        "ToolAgentLoop._call_tool": ["tool_call", "tools_kwargs", "agent_data"],
        "ToolAgentLoop._build_assistant_message": ["content", "agent_data"],
    },
    "verl.experimental.agent_loop.tool_parser": {
        "FunctionCall": ["name", "arguments", "tool_call_id"],
        "ToolParser": ["tokenizer"],
        "ToolParser.stop_token_ids": P,
        "ToolParser.extract_tool_calls": ["responses_ids", "tools"],
        "ToolParser.get_tool_parser": ["name", "tokenizer"],
        "ToolParser.register": ["name"],
        "HermesToolParser": ["tokenizer"],
        "GptOssToolParser": ["tokenizer"],
        "Qwen3XMLToolParser": ["tokenizer"],
        "Qwen3XMLToolParser._parse_xml_function_call": ["function_call_str", "tools"],
        "KimiToolParser": ["tokenizer"],
        "GLMToolParser": P,
        "SeedToolParser": P,
        "MiniMaxToolParser": P,
        "DeepSeekV4ToolParser": P,
        "Gemma4ToolParser": P,
    },
    "verl.workers.rollout.replica": {
        "TokenOutput": ["token_ids", "log_probs", "routed_experts", "stop_reason", "num_preempted", "extra_fields"],
        "RolloutMode": P,
        "RolloutReplica": P,
        "RolloutReplicaRegistry": P,
        "get_rollout_replica_class": P,
    },
    "verl.workers.config": {
        "ActorConfig": [
            "strategy",
            "ppo_mini_batch_size",
            "ppo_micro_batch_size_per_gpu",
            "ppo_infer_micro_batch_size_per_gpu",
            "ppo_infer_max_token_len_per_gpu",
            "freeze_vision_tower",
            "qat",
            "optim",
            "rollout_n",
        ],
        "ActorConfig.validate": ["n_gpus", "train_batch_size", "model_config"],
        "FSDPActorConfig": P,
        "McoreActorConfig": ["strategy", "megatron", "optim"],
        "OptimizerConfig": ["lr", "lr_warmup_steps", "weight_decay", "betas", "lr_scheduler_type"],
        "FSDPOptimizerConfig": ["optimizer", "optimizer_impl", "clip_grad", "warmup_style", "zero_indexed_step"],
        "McoreOptimizerConfig": ["optimizer", "clip_grad", "lr_decay_style", "muon_momentum"],
        "FSDPEngineConfig": ["param_offload", "optimizer_offload", "fsdp_size", "wrap_policy"],
        "McoreEngineConfig": ["tensor_model_parallel_size", "sequence_parallel", "seed", "param_offload"],
    },
    "verl.workers.config.engine": {"FSDPEngineConfig": P, "McoreEngineConfig": P},
    "verl.workers.config.optimizer": {"OptimizerConfig": P, "FSDPOptimizerConfig": P, "McoreOptimizerConfig": P},
    "verl.utils.fsdp_utils": {"normalize_peft_param_name": ["params"]},
    "verl.utils.checkpoint.checkpoint_manager": {
        "BaseCheckpointManager": ["model", "optimizer", "lr_scheduler", "processing_class", "checkpoint_config"],
        "BaseCheckpointManager.should_save_lora_only": P,
        "BaseCheckpointManager.is_lora_only_state_dict": ["state_dict"],
    },
    "verl.trainer.config": {
        "CheckpointConfig": ["save_contents", "load_contents", "async_save", "strict", "save_lora_only"],
        "RolloutCorrectionConfig": P,
        "RolloutCorrectionConfig.disabled": P,
        "RolloutCorrectionConfig.decoupled_token_is": P,
        "RolloutCorrectionConfig.decoupled_seq_is": P,
        "RolloutCorrectionConfig.decoupled_token_icepop": P,
        "RolloutCorrectionConfig.decoupled_seq_is_rs": P,
        "RolloutCorrectionConfig.decoupled_geo_rs": P,
        "RolloutCorrectionConfig.decoupled_geo_rs_seq_tis": P,
        "RolloutCorrectionConfig.decoupled_geo_rs_token_tis": P,
        "RolloutCorrectionConfig.decoupled_k3_rs": P,
        "RolloutCorrectionConfig.decoupled_k3_rs_seq_tis": P,
        "RolloutCorrectionConfig.decoupled_k3_rs_token_tis": P,
        "RolloutCorrectionConfig.bypass_ppo_clip": P,
        "RolloutCorrectionConfig.bypass_ppo_clip_geo_rs": P,
        "RolloutCorrectionConfig.bypass_ppo_clip_k3_rs": P,
        "RolloutCorrectionConfig.bypass_pg_is": P,
        "RolloutCorrectionConfig.bypass_pg_token_icepop": P,
        "RolloutCorrectionConfig.bypass_pg_geo_rs": P,
        "RolloutCorrectionConfig.bypass_pg_geo_rs_seq_tis": P,
        "RolloutCorrectionConfig.bypass_pg_geo_rs_token_tis": P,
    },
    "verl.trainer.ppo.utils": {"need_reward_model": ["config"], "need_critic": ["config"]},
    "verl.workers.reward_manager.naive": {
        "NaiveRewardManager": ["tokenizer", "num_examine", "compute_score", "reward_fn_key", "compute_score_timeout"],
        "_score_timeout": ["seconds"],
    },
    "verl.utils.groupwise": {
        "as_torch_index": ["index", "device"],
        "group_mean_std": ["scores", "gidx", "eps", "device"],
    },
    "verl.utils.debug": {
        "marked_timer": ["name", "timing_raw", "color"],
        "log_gpu_memory_usage": ["head", "logger", "level", "rank"],
    },
    "verl.utils.hdfs_io": {"exists": ["path"], "makedirs": ["name", "mode", "exist_ok"], "copy": ["src", "dst"]},
    "verl.utils.config": {
        "omega_conf_to_dataclass": ["config", "dataclass_type"],
        "update_dict_with_config": ["dictionary", "config"],
        "validate_config": ["config", "use_reference_policy", "use_critic"],
    },
    "verl.trainer.ppo.core_algos": {
        "POLICY_LOSS_REGISTRY": P,
        "ADV_ESTIMATOR_REGISTRY": P,
        "AdvantageEstimator": P,
        "PolicyLossFn": P,
        "register_policy_loss": ["name"],
        "get_policy_loss_fn": ["name"],
        "register_adv_est": ["name_or_enum"],
        "get_adv_estimator_fn": ["name_or_enum"],
        "AdaptiveKLController": ["init_kl_coef", "target_kl", "horizon"],
        "FixedKLController": ["kl_coef"],
        "get_kl_controller": ["kl_ctrl"],
        "compute_gae_advantage_return": ["token_level_rewards", "values", "response_mask", "gamma", "lam"],
        "compute_grpo_outcome_advantage": _GRPO,
        "compute_grpo_vectorized_outcome_advantage": _GRPO,
        "compute_gdpo_outcome_advantage": _GRPO + ["non_tensor_batch", "batch"],
        "compute_grpo_passk_outcome_advantage": _GRPO,
        "compute_reinforce_plus_plus_baseline_outcome_advantage": _GROUP,
        "compute_rloo_outcome_advantage": _GROUP,
        "compute_opo_outcome_advantage": _GROUP,
        "compute_reinforce_plus_plus_outcome_advantage": ["token_level_rewards", "response_mask", "config"],
        "compute_remax_outcome_advantage": ["token_level_rewards", "reward_baselines", "response_mask", "config"],
        "compute_gpg_outcome_advantage": [
            "token_level_rewards",
            "response_mask",
            "index",
            "epsilon",
            "f_norm",
            "alpha",
            "config",
        ],
        "compute_rloo_vectorized_outcome_advantage": _GROUP,
        "compute_optimal_token_baseline_advantage": _OTB,
        "compute_multi_turn_optimal_token_baseline_advantage": _OTB,
        "compute_rewards": ["token_level_scores", "old_log_prob", "ref_log_prob", "kl_ratio"],
        "agg_loss": [
            "loss_mat",
            "loss_mask",
            "loss_agg_mode",
            "dp_size",
            "batch_num_tokens",
            "global_batch_size",
            "loss_scale_factor",
        ],
        "compute_policy_loss": [
            "old_log_prob",
            "log_prob",
            "advantages",
            "response_mask",
            "cliprange",
            "cliprange_low",
            "cliprange_high",
            "clip_ratio_c",
            "loss_agg_mode",
        ],
        **{
            f"compute_policy_loss_{n}": _LOSS
            for n in (
                "vanilla",
                "up",
                "dppo_tv",
                "dppo_kl",
                "gspo",
                "sapo",
                "gpg",
                "clip_cov",
                "kl_cov",
                "geo_mean",
                "cispo",
                "bypass_mode",
            )
        },
        "compute_policy_loss_reinforce": ["rollout_log_prob"] + _LOSS[1:],
        "compute_entropy_loss": ["logits", "response_mask", "loss_agg_mode"],
        "compute_value_loss": [
            "vpreds",
            "returns",
            "values",
            "response_mask",
            "cliprange_value",
            "loss_agg_mode",
            "dp_size",
            "batch_num_tokens",
            "global_batch_size",
            "loss_scale_factor",
        ],
        "kl_penalty": ["logprob", "ref_logprob", "kl_penalty"],
        "kl_penalty_forward": ["logprob", "ref_logprob", "kl_penalty"],
        "compute_pf_ppo_reweight_data": ["data", "reweight_method", "weight_pow"],
    },
    "verl.trainer.ppo.rollout_corr_helper": {
        "SAFETY_BOUND": P,
        "SUPPORTED_ROLLOUT_RS_OPTIONS": P,
        "TOKEN_LEVEL_ROLLOUT_RS_OPTIONS": P,
        "compute_binary_kl_divergence": ["log_p", "log_q", "eps"],
        "compute_rollout_rejection_mask": [
            "log_ratio",
            "response_mask",
            "rollout_rs",
            "rollout_rs_threshold",
            "old_log_prob",
            "rollout_log_prob",
        ],
        "compute_rs_metrics": [
            "option_name",
            "rs_statistic",
            "response_mask",
            "seq_valid_mask",
            "level",
            "per_sequence_values",
            "rollout_rs_threshold",
            "rollout_rs_threshold_lower",
            "apply_lower_threshold",
        ],
        "compute_rollout_correction_weights": [
            "log_ratio",
            "response_mask",
            "rollout_is",
            "rollout_is_threshold",
            "rollout_is_batch_normalize",
        ],
        "compute_is_metrics": [
            "rollout_is_weights",
            "raw_rollout_is_weights",
            "log_ratio_for_metrics",
            "response_mask",
            "rollout_is",
            "rollout_is_threshold",
            "rollout_is_threshold_lower",
        ],
        "compute_rollout_correction_and_rejection_mask": [
            "old_log_prob",
            "rollout_log_prob",
            "response_mask",
            "rollout_is",
            "rollout_is_threshold",
            "rollout_is_batch_normalize",
            "rollout_rs",
            "rollout_rs_threshold",
        ],
        "compute_offpolicy_metrics": ["old_log_prob", "rollout_log_prob", "response_mask"],
        "compute_rollout_correction_and_add_to_batch": ["batch", "rollout_corr_config"],
        "compute_rollout_corr_metrics_from_logprobs": ["log_prob", "rollout_log_prob", "response_mask"],
        "apply_bypass_mode": ["batch", "rollout_corr_config", "policy_loss_config"],
    },
    "verl.trainer.ppo.ray_trainer": {
        "apply_kl_penalty": ["data", "kl_ctrl", "kl_penalty"],
        "compute_response_mask": ["data"],
        "compute_advantage": [
            "data",
            "adv_estimator",
            "gamma",
            "lam",
            "num_repeat",
            "norm_adv_by_std_in_grpo",
            "config",
        ],
        "compute_spec_decode_metrics": ["spec_drafts", "spec_accepts", "spec_verifies", "non_padding_mask"],
        "RayPPOTrainer": [
            "config",
            "tokenizer",
            "role_worker_mapping",
            "resource_pool_manager",
            "ray_worker_group_cls",
            "processor",
            "train_dataset",
            "val_dataset",
            "collate_fn",
            "train_sampler",
            "device_name",
        ],
        "RayPPOTrainer.fit": [],
        "RayPPOTrainer.init_workers": [],
        "Role": P,
        "ResourcePoolManager": P,
        "AdvantageEstimator": P,
    },
    "verl.trainer.ppo.metric_utils": {
        "reduce_metrics": ["metrics"],
        "compute_data_metrics": ["batch", "use_critic"],
        "compute_timing_metrics": ["batch", "timing_raw"],
        "compute_throughout_metrics": ["batch", "timing_raw", "n_gpus"],
        "compute_variance_proxy_metrics": ["batch", "gradient_norm"],
        "bootstrap_metric": ["data", "subset_size", "reduce_fns", "n_bootstrap", "seed"],
        "calc_maj_val": ["data", "vote_key", "val_key"],
        "process_validation_metrics": ["data_sources", "sample_uids", "infos_dict", "seed"],
        "logger": P,
        "get_hf_config_override_kwargs": ["override_config"],
        "infer_moe_num_experts": ["model_config"],
        "infer_rollout_moe_num_experts": ["model_config"],
        "compute_rollout_moe_load_balance_metrics": ["routed_experts", "response_mask", "num_experts", "prefix"],
        "get_metric_data_with_optional_routed_experts": [
            "keys",
            "partition_id",
            "fields",
            "moe_lb_metrics_interval",
            "global_steps",
            "accumulator",
            "kv_batch_get",
        ],
        "compute_moe_lb_metrics": ["metrics_batch", "moe_lb_metrics_interval", "global_steps", "accumulator"],
        "RolloutMoELoadBalanceMetricsAccumulator": ["model_config"],
        "RolloutMoELoadBalanceMetricsAccumulator.should_request_routed_experts": ["global_steps"],
        "RolloutMoELoadBalanceMetricsAccumulator.defer_routed_experts_retry": ["global_steps", "interval"],
        "RolloutMoELoadBalanceMetricsAccumulator.warn_skip_once": ["key", "message"],
        "RolloutMoELoadBalanceMetricsAccumulator.update": ["routed_experts", "response_mask", "num_experts"],
        "RolloutMoELoadBalanceMetricsAccumulator.compute": ["prefix"],
        "RolloutMoELoadBalanceMetricsAccumulator.total_assignments": [],
        "RolloutMoELoadBalanceMetricsAccumulator.reset": [],
        "RolloutMoELoadBalanceMetricsAccumulator.pop_metrics": ["prefix"],
    },
    "verl.single_controller.base": {
        "Worker": P,
        "WorkerGroup": P,
        "ClassWithInitArgs": P,
        "ResourcePool": P,
        "Dispatch": P,
        "Execute": P,
        "register": P,
        "make_nd_compute_dataproto_dispatch_fn": ["mesh_name"],
        "DistGlobalInfo": P,
        "DistRankInfo": P,
        "WorkerHelper": P,
        "WorkerContainer": P,
        "RemoteCall": P,
        "RemoteWorkerGroup": P,
        "RPCError": P,
        "RPCRemoteError": P,
        "RPCTimeoutError": P,
        "RPCTransportError": P,
        "RPCUnavailableError": P,
        "PlacementUnavailableError": P,
    },
    "verl.single_controller.base.decorator": {
        "Dispatch": P,
        "Execute": P,
        "register": ["dispatch_mode", "execute_mode", "blocking", "materialize_futures"],
    },
    "verl.single_controller.ray": {
        "RayClassWithInitArgs": P,
        "RayResourcePool": P,
        "RayWorkerGroup": P,
        "ResourcePoolManager": P,
        "SubRayResourcePool": P,
        "create_colocated_worker_cls": P,
        "create_colocated_worker_cls_fused": P,
    },
}


_RUNTIME = (
    "upstream main's multi-backend runtime layer (Ray/Monarch RPC abstractions); this project has one Ray backend"
)
_ONE_CHECK = (
    "the config checks have one entry point, verl.trainer.ppo.utils.validate_config(config), which derives "
    "the reference/critic needs itself (utilities must not import the trainer)"
)
_SERVER_MODE = "no vLLM/SGLang server replicas: generation servers are in-process (verl.workers.rollout.async_server)"
_PARSER = "tool-call formats of model families without a text-model use here (GLM, Seed, MiniMax, DeepSeek V4, Gemma 4)"
_CT = (
    "no continuous-token builders: trajectories are the prompt render, the generated ids and render diffs of "
    "observations (verl.experimental.agent_loop.chat.ChatRenderer)"
)
_IN_ROLLOUT = (
    "agent loops run inside the rollout worker (verl.workers.rollout.agent_rollout.AgentRollout calls "
    "AgentLoopWorker.run(prompts, sampling_params)); no separate manager or agent-loop worker actors"
)
NOT_PROVIDED: dict[str, dict[str, str]] = {
    "verl.experimental.agent_loop.agent_loop": {
        "AgentLoopBase.ct_build_initial_tokens": _CT,
        "AgentLoopBase.ct_merge_non_assistant_msg": _CT,
        "AgentLoopBase.ct_merge_assistant_token": _CT,
        "AgentLoopWorker.generate_sequences": _IN_ROLLOUT,
        "AgentLoopManager": _IN_ROLLOUT,
        "get_trajectory_info": "no rollout tracing backends (weave/mlflow traces); each sample keeps its agent_trace",
    },
    "verl.experimental.agent_loop.tool_parser": {
        "GLMToolParser": _PARSER,
        "SeedToolParser": _PARSER,
        "MiniMaxToolParser": _PARSER,
        "DeepSeekV4ToolParser": _PARSER,
        "Gemma4ToolParser": _PARSER,
    },
    "verl.workers.rollout.replica": {
        "RolloutMode": _SERVER_MODE,
        "RolloutReplica": _SERVER_MODE,
        "RolloutReplicaRegistry": _SERVER_MODE,
        "get_rollout_replica_class": _SERVER_MODE,
    },
    "verl.utils": {
        "validate_config": _ONE_CHECK,
        "get_processor_token_id": "no multimodal processors here (text prompts only)",
    },
    "verl.utils.config": {"validate_config": _ONE_CHECK},
    "verl.trainer.ppo.ray_trainer": {
        "compute_spec_decode_metrics": "no speculative-decoding rollout engine (vLLM/SGLang) here",
    },
    "verl.single_controller.base": {
        "make_nd_compute_dataproto_dispatch_fn": "no N-D (tensor/pipeline parallel) meshes: FSDP data parallel only",
        "DistGlobalInfo": _RUNTIME,
        "DistRankInfo": _RUNTIME,
        "WorkerHelper": _RUNTIME,
        "WorkerContainer": _RUNTIME,
        "RemoteCall": _RUNTIME,
        "RemoteWorkerGroup": _RUNTIME,
        "RPCError": _RUNTIME,
        "RPCRemoteError": _RUNTIME,
        "RPCTimeoutError": _RUNTIME,
        "RPCTransportError": _RUNTIME,
        "RPCUnavailableError": _RUNTIME,
        "PlacementUnavailableError": _RUNTIME,
    },
    "verl.single_controller.ray": {
        "ResourcePoolManager": (
            "lives in verl.trainer.ppo.ray_trainer (as in upstream's release); the single "
            "controller must not import the trainer"
        ),
        "SubRayResourcePool": "no sub-pool splitting of a Ray placement group",
        "create_colocated_worker_cls_fused": "colocation uses create_colocated_worker_cls only",
    },
}

REPO = Path(__file__).resolve().parents[1]


def _resolve(module: str, name: str):
    """The object `module.name` (``Class.attr`` walks attributes; a dotted submodule is imported)."""
    obj = importlib.import_module(module)
    for part in name.split("."):
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif inspect.ismodule(obj):
            obj = importlib.import_module(f"{obj.__name__}.{part}")
        else:
            raise AttributeError(f"{module}.{name}: no attribute {part!r}")
    return obj


def incompatibility(module: str, name: str, params: list[str] | None) -> str | None:
    """None when `module.name` exists with every listed keyword parameter, else the reason."""
    try:
        obj = _resolve(module, name)
    except (ImportError, AttributeError) as exc:
        return f"missing: {exc}"
    if not params:
        return None
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None  # builtins without signatures: existence is all we can check
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    missing = [p for p in params if p not in sig.parameters]
    return f"parameters {missing} missing from {name}{sig}" if missing else None


# modules (and single names) whose parameter lists are upstream's positional order
POSITIONAL_MODULES = (
    "verl.trainer.ppo.core_algos",
    "verl.trainer.ppo.rollout_corr_helper",
    "verl.trainer.ppo.metric_utils",
)
POSITIONAL_NAMES = {
    ("verl.trainer.ppo.ray_trainer", n) for n in ("compute_advantage", "apply_kl_penalty", "compute_response_mask")
}
# upstream's keyword-only parameters (after `*`): how many of the listed ones are positional
KEYWORD_ONLY = {("verl.trainer.ppo.rollout_corr_helper", "compute_rs_metrics"): 4}


def positional_problem(module: str, name: str, expected: list[str]) -> str | None:
    """None when `module.name` takes `expected` at upstream's positions (after them, only
    parameters with defaults), else what is wrong."""
    obj = _resolve(module, name)
    params = list(inspect.signature(obj.__init__ if inspect.isclass(obj) else obj).parameters.values())
    if inspect.isclass(obj) or (params and params[0].name == "self"):
        params = params[1:]  # self (of a class, or of a method looked up on its class)
    n_positional = KEYWORD_ONLY.get((module, name), len(expected))
    names = [p.name for p in params]
    positional = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY)
    for i, want in enumerate(expected[:n_positional]):
        if i >= len(params) or params[i].name != want or params[i].kind not in positional:
            return f"position {i}: expected {want!r}, have {names}"
    for p in params[len(expected) :]:
        if p.default is inspect.Parameter.empty and p.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        ):
            return f"extra required parameter {p.name!r}"
    return None


def _positional_cases():
    for module, names in UPSTREAM_NAMES.items():
        for name, params in names.items():
            if params and (module in POSITIONAL_MODULES or (module, name) in POSITIONAL_NAMES):
                yield pytest.param(module, name, params, id=f"{module}:{name}")


@pytest.mark.parametrize(("module", "name", "params"), list(_positional_cases()))
def test_upstream_positional_order(module, name, params):
    problem = positional_problem(module, name, params)
    assert problem is None, f"{module}.{name}: {problem}"


UPSTREAM_ESTIMATORS = [
    "GAE",
    "GRPO",
    "REINFORCE_PLUS_PLUS",
    "REINFORCE_PLUS_PLUS_BASELINE",
    "REMAX",
    "RLOO",
    "OPO",
    "GRPO_PASSK",
    "GPG",
    "RLOO_VECTORIZED",
    "GRPO_VECTORIZED",
    "OPTIMAL_TOKEN_BASELINE",
    "TIR_OPTIMAL_TOKEN_BASELINE",
    "GDPO",
]


def test_advantage_estimator_enum_has_upstream_members():
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, AdvantageEstimator

    for member in UPSTREAM_ESTIMATORS:
        assert getattr(AdvantageEstimator, member).value in ADV_ESTIMATOR_REGISTRY


def test_upstream_defaults_of_the_aggregation_sensitive_losses():
    from verl.trainer.ppo import core_algos

    def default(fn):
        return inspect.signature(fn).parameters["loss_agg_mode"].default

    assert default(core_algos.compute_policy_loss_sapo) == "seq-mean-token-mean"
    assert default(core_algos.compute_policy_loss_gspo) == "seq-mean-token-mean"
    assert default(core_algos.compute_policy_loss_reinforce) == "seq-mean-token-sum"
    assert default(core_algos.compute_policy_loss_vanilla) == "token-mean"


def count_upstream_names() -> dict[str, tuple[int, int]]:
    """(compatible names, upstream names) per module."""
    return {
        m: (sum(incompatibility(m, n, p) is None for n, p in names.items()), len(names))
        for m, names in UPSTREAM_NAMES.items()
    }


def _expected_present():
    for module, names in UPSTREAM_NAMES.items():
        skip = set(NOT_PROVIDED.get(module, {}))
        for name, params in names.items():
            if name not in skip:
                yield pytest.param(module, name, params, id=f"{module}:{name}")


@pytest.mark.parametrize(("module", "name", "params"), list(_expected_present()))
def test_upstream_public_name_is_compatible(module, name, params):
    problem = incompatibility(module, name, params)
    assert problem is None, problem


def test_bookkeeping_sets_name_upstream_names_only():
    for module, names in NOT_PROVIDED.items():
        unknown = set(names) - set(UPSTREAM_NAMES[module])
        assert not unknown, f"{module}: {sorted(unknown)} are not in UPSTREAM_NAMES"


@pytest.mark.parametrize("module", sorted(NOT_PROVIDED))
def test_not_provided_names_are_missing_and_documented(module):
    docs = (REPO / "docs" / "extending.md").read_text()
    section = docs[docs.index("## What upstream modules are not provided and why") :]
    for name in NOT_PROVIDED[module]:
        assert incompatibility(module, name, UPSTREAM_NAMES[module][name]) is not None, (
            f"{module}.{name} exists now: drop it from NOT_PROVIDED"
        )
        assert f"{module}.{name}" in section or f"`{name}`" in section, (
            f"{module}.{name} is not listed in docs/extending.md"
        )


if __name__ == "__main__":  # python tests/test_upstream_public_names.py: the per-module counts
    for mod, (have, total) in count_upstream_names().items():
        print(f"{mod}: {have}/{total}")
