"""Upstream verl's config surface, and what each of its keys does here.

Every key of upstream's full PPO config is a key of `ppo_trainer.yaml`, with upstream's default.
Each one has exactly one behaviour, decided here key by key (shown in the "here" column of
docs/config_reference.md):

- (a) implemented with upstream's meaning (every key that no rule below names);
- (b) accepted without effect, because it tunes machinery this project does not have or does
  differently: when a run sets it to another value than its default, the start-up log says so
  once, with the reason;
- (c) a feature this project does not have: another value than the default fails before Ray
  starts with `<key>=<value>: <feature> is not available in this verl (available: ...)`.

Spellings that upstream renamed and that its scripts still use are aliases (`ALIASES`): the value
moves to the current key with one deprecation warning naming the new spelling.

`check_upstream_surface(cfg)` applies all of that and returns the config the trainer reads:
aliases moved, upstream-only sections (`reward`, `global_profiler`, ...) mapped onto the keys our
code reads and then removed, keys of (b)/(c) that no config dataclass holds removed, and the
dataclass defaults of keys that the yaml does not list filled in.

The embedded toy job's settings (`EMBEDDED_PRESET`) apply only when no model is given
(`actor_rollout_ref.model.path` null) or the model is one shipped in verl/assets, each yielding to
a value the user set (`apply_embedded_preset`).
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import logging
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

logger = logging.getLogger(__name__)

YAML_PATH = Path(__file__).with_name("ppo_trainer.yaml")

# Not implemented here; the LoRA keys (`lora_rank`, `lora_alpha`, `target_modules`,
# `exclude_modules`, `lora_adapter_path`, `lora.*`, `save_lora_only`) are left out of this table
# on purpose: the LoRA work adds them together with their implementation.

KIND_NAMES = {"a": "implemented", "b": "no effect here", "c": "not available"}


@dataclass(frozen=True)
class Rule:
    """Behaviour of the keys matching `pattern` (fnmatch on the dotted key; first match wins).

    kind "b": `why` says why the key has no effect. kind "c": `why` names the feature and
    `available` what there is instead; values in `accept` are implemented (a) and not refused;
    with `refuse` set, only those values are refused (other values are checked elsewhere, e.g. a
    rollout engine name against the engines registered at run time).
    """

    pattern: str
    kind: str
    why: str
    available: str = ""
    accept: tuple = ()
    refuse: tuple = ()


_NO_ENGINE = "upstream's engine-worker copy of an actor/ref key; here the actor/ref key of the same name applies"
_COLOCATED = "the rollout runs inside the actor's worker processes (hybrid engine), on their devices"
_PROFILER = (
    "the per-role profilers (nsys, npu, torch, torch_memory, precision_debugger)",
    "trainer.log_dir metrics and timing/* metrics",
)
_MULTIMODAL = ("multimodal (image/video/audio) inputs", "text prompts")
_RM_ROLLOUT = "the reward model here is an FSDP sequence-classification worker, not a served rollout engine"

RULES: tuple[Rule, ...] = (
    # ------------------------------------------------------------------ actor / ref / critic engine
    Rule("*.megatron.*", "c", "Megatron-LM training", "FSDP2 (strategy=fsdp)"),
    Rule("*.strategy", "c", "Megatron-LM training", "fsdp, fsdp2 (FSDP2 for both)", accept=("fsdp", "fsdp2")),
    Rule("*.optim.optimizer", "c", "optimizers other than AdamW", "AdamW", accept=("AdamW", "adamw")),
    Rule(
        "*.optim.optimizer_impl",
        "c",
        "optimizer implementations other than torch.optim",
        "torch.optim",
        accept=("torch.optim",),
    ),
    Rule("*.optim.clip_grad", "b", "gradient clipping here is actor_rollout_ref.actor.grad_clip / critic.grad_clip"),
    Rule("*.optim.zero_indexed_step", "b", "the learning-rate schedule here always counts optimizer steps from 0"),
    Rule(
        "*.optim.override_optimizer_config",
        "c",
        "optimizer overrides (Megatron distributed optimizer)",
        "the AdamW keys of *.optim",
    ),
    Rule(
        "*.fsdp_config.offload_policy",
        "b",
        "FSDP2 CPUOffloadPolicy: here param_offload/optimizer_offload move whole modules between phases",
    ),
    Rule(
        "*.fsdp.offload_policy",
        "b",
        "FSDP2 CPUOffloadPolicy: here param_offload/optimizer_offload move whole modules between phases",
    ),
    Rule("*.forward_prefetch", "b", "FSDP2 here prefetches with its defaults"),
    Rule("*.fsdp_config.use_orig_params", "b", "an FSDP1 option: FSDP2 always keeps the original parameters"),
    Rule("*.fsdp.use_orig_params", "b", "an FSDP1 option: FSDP2 always keeps the original parameters"),
    Rule("*.fsdp_config.seed", "b", "worker seeds here are trainer.seed + rank"),
    Rule("*.fsdp.seed", "b", "worker seeds here are trainer.seed + rank"),
    Rule(
        "*.full_determinism",
        "c",
        "full-determinism mode (deterministic kernels)",
        "trainer.seed for reproducible sampling",
    ),
    Rule("*.ulysses_sequence_parallel_size", "c", "Ulysses sequence parallelism", "1", accept=(1,)),
    Rule("*.fsdp_config.entropy_from_logits_with_chunking", "b", _NO_ENGINE),
    Rule("*.fsdp_config.entropy_from_logits_chunk_size", "b", _NO_ENGINE),
    Rule("*.fsdp_config.entropy_checkpointing", "b", _NO_ENGINE),
    Rule("*.fsdp_config.pad_to_length", "b", _NO_ENGINE),
    Rule("*.fsdp_config.pad_to_length_bucket", "b", _NO_ENGINE),
    Rule("*.fsdp_config.forward_only", "b", _NO_ENGINE),
    Rule("*.fsdp_config.strategy", "b", _NO_ENGINE),
    Rule(
        "*.fsdp_config.dtype",
        "b",
        "the compute dtype here is fsdp_config.mixed_precision.param_dtype (bf16 on CUDA, fp32 on CPU)",
    ),
    Rule(
        "*.fsdp_config.use_no_sync_for_gradient_accumulation", "b", "FSDP2 here reduces gradients once per mini-batch"
    ),
    Rule("*.fsdp_config.use_torch_compile", "b", "torch.compile is not applied: models run eager here"),
    Rule("*.fsdp.entropy_*", "b", _NO_ENGINE),
    Rule("*.fsdp.pad_to_length*", "b", _NO_ENGINE),
    Rule("*.fsdp.forward_only", "b", _NO_ENGINE),
    Rule("*.fsdp.strategy", "b", _NO_ENGINE),
    Rule("*.fsdp.dtype", "b", "the compute dtype here is fsdp.mixed_precision.param_dtype (bf16 on CUDA, fp32 on CPU)"),
    Rule("*.fsdp.use_no_sync_for_gradient_accumulation", "b", "FSDP2 here reduces gradients once per mini-batch"),
    Rule("*.fsdp.use_torch_compile", "b", "torch.compile is not applied: models run eager here"),
    Rule("*.qat.*", "c", "quantization-aware training (QAT)", "bf16/fp32 training"),
    Rule("*.qat", "c", "quantization-aware training (QAT)", "bf16/fp32 training"),
    Rule("*.turbo_config.*", "c", "the TorchTitan/turbo training engine", "FSDP2"),
    Rule("*.router_replay.*", "c", "MoE router replay", "dense and MoE models without replay"),
    Rule("*.profiler.*", "c", *_PROFILER),
    Rule("actor_rollout_ref.actor.freeze_vision_tower", "c", *_MULTIMODAL),
    Rule("actor_rollout_ref.actor.use_torch_compile", "b", "torch.compile is not applied: models run eager here"),
    Rule("actor_rollout_ref.ref.use_torch_compile", "b", "torch.compile is not applied: models run eager here"),
    Rule(
        "actor_rollout_ref.actor.use_fused_kernels",
        "b",
        "log-probs and entropy here come from the logits (no fused kernels)",
    ),
    Rule(
        "actor_rollout_ref.actor.calculate_entropy",
        "b",
        "the actor here computes the entropy it logs (actor/entropy) in every update",
    ),
    Rule(
        "actor_rollout_ref.actor.calculate_sum_pi_squared",
        "c",
        "sum of squared policy probabilities (optimal-token-baseline estimators)",
        "the registered advantage estimators",
    ),
    Rule("*.entropy_from_logits_chunk_size", "b", "the chunked entropy here uses a fixed chunk size"),
    Rule("*.entropy_checkpointing", "b", "entropy activations are not checkpointed separately here"),
    Rule("*.pad_to_length", "b", "sequences are packed without padding buckets here"),
    Rule("actor_rollout_ref.actor.use_remove_padding", "b", "here actor_rollout_ref.model.use_remove_padding decides"),
    Rule("*.checkpoint.load_contents", "b", "a checkpoint here restores what it holds (see save_contents)"),
    Rule("*.checkpoint.async_save", "c", "asynchronous checkpoint saving", "synchronous atomic saving"),
    Rule("*.checkpoint.strict", "b", "checkpoints here always load strictly"),
    Rule("actor_rollout_ref.ref.rollout_n", "b", "the reference policy here does not use rollout.n"),
    Rule(
        "actor_rollout_ref.hybrid_engine",
        "c",
        "separate (not colocated) actor and rollout workers (a standalone rollout role would never receive "
        "the actor's updated weights and would sample from the initial policy for the whole run)",
        "true",
        accept=(True,),
    ),
    Rule("critic.loss_scale_factor", "b", "the value loss here is aggregated by critic.loss_agg_mode alone"),
    Rule("actor_rollout_ref.nccl_timeout", "b", "process groups here use torch.distributed's default timeout"),
    # ------------------------------------------------------------------ rollout
    Rule(
        "actor_rollout_ref.rollout.name",
        "c",
        "this rollout engine (SGLang, TensorRT-LLM)",
        "hf, vllm",
        accept=("hf", "vllm"),
        refuse=("sglang", "trtllm"),
    ),
    Rule("actor_rollout_ref.rollout.nnodes", "b", _COLOCATED),
    Rule("actor_rollout_ref.rollout.n_gpus_per_node", "b", _COLOCATED),
    Rule("actor_rollout_ref.rollout.seed", "b", "sampling seeds here are trainer.seed + rank"),
    Rule(
        "actor_rollout_ref.rollout.cudagraph_capture_sizes",
        "b",
        "vllm here uses its default CUDA-graph sizes (or none with enforce_eager)",
    ),
    Rule(
        "actor_rollout_ref.rollout.data_parallel_size",
        "c",
        "rollout data parallelism inside one engine",
        "1 (one engine per worker)",
        accept=(1,),
    ),
    Rule("actor_rollout_ref.rollout.expert_parallel_size", "c", "rollout expert parallelism", "1", accept=(1,)),
    Rule(
        "actor_rollout_ref.rollout.pipeline_model_parallel_size", "c", "rollout pipeline parallelism", "1", accept=(1,)
    ),
    Rule(
        "actor_rollout_ref.rollout.max_model_len",
        "b",
        "the engine's context length here is prompt_length + response_length",
    ),
    Rule("actor_rollout_ref.rollout.enable_prefix_caching", "b", "vllm here runs with its default prefix caching"),
    Rule(
        "actor_rollout_ref.rollout.logprobs_mode",
        "c",
        "raw (unprocessed) rollout log-probs",
        "processed_logprobs (log-probs of the sampling distribution)",
        accept=("processed_logprobs",),
    ),
    Rule("actor_rollout_ref.rollout.scheduling_policy", "b", "vllm here schedules first come, first served"),
    Rule(
        "actor_rollout_ref.rollout.load_format",
        "b",
        "the engine's weights are synced from the actor before each generation",
    ),
    Rule("actor_rollout_ref.rollout.layered_summon", "b", "weights are synced in one in-process copy here"),
    Rule("actor_rollout_ref.rollout.disable_log_stats", "b", "engine statistics are not logged here"),
    Rule(
        "actor_rollout_ref.rollout.over_sample_rate",
        "c",
        "over-sampling with early stop of the slowest responses",
        "0",
        accept=(0, 0.0),
    ),
    Rule("actor_rollout_ref.rollout.multi_stage_wake_up", "b", "weights and KV cache are restored in one step here"),
    Rule(
        "actor_rollout_ref.rollout.engine_kwargs.sglang*", "c", "SGLang rollout", "engine_kwargs.vllm, engine_kwargs.hf"
    ),
    Rule(
        "actor_rollout_ref.rollout.engine_kwargs.trtllm*",
        "c",
        "TensorRT-LLM rollout",
        "engine_kwargs.vllm, engine_kwargs.hf",
    ),
    # the agent loop (verl.experimental.agent_loop) implements multi_turn.* and agent.* but these
    Rule(
        "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts",
        "c",
        "repeated multi-turn rollouts per sample",
        "rollout.n samples per prompt",
    ),
    Rule(
        "actor_rollout_ref.rollout.agent.custom_async_server.*",
        "c",
        "a custom async generation server",
        "the batching server over the hf engine",
    ),
    Rule(
        "actor_rollout_ref.rollout.checkpoint_engine.backend",
        "c",
        "checkpoint engines for weight sync",
        "naive (in-process copy)",
        accept=("naive",),
    ),
    Rule(
        "actor_rollout_ref.rollout.checkpoint_engine.*",
        "b",
        "weights are synced in-process between colocated roles, without buckets",
    ),
    Rule(
        "actor_rollout_ref.rollout.trace.backend",
        "c",
        "rollout tracing (weave, mlflow)",
        "trainer.rollout_data_dir (jsonl of every step)",
        accept=(None,),
    ),
    Rule("actor_rollout_ref.rollout.trace.*", "b", "used only by rollout tracing, which is not available"),
    Rule("actor_rollout_ref.rollout.skip_tokenizer_init", "b", "the engine here decodes with the actor's tokenizer"),
    Rule(
        "actor_rollout_ref.rollout.enable_rollout_routing_replay", "c", "MoE routing replay", "rollouts without replay"
    ),
    Rule(
        "actor_rollout_ref.rollout.moe_load_balance_metrics_interval", "c", "MoE load-balance metrics", "0", accept=(0,)
    ),
    Rule(
        "actor_rollout_ref.rollout.prometheus.*",
        "c",
        "Prometheus metrics of the rollout server",
        "trainer.logger backends",
    ),
    Rule(
        "actor_rollout_ref.rollout.quantization", "c", "quantized rollouts", "bf16/fp16/fp32 rollouts (rollout.dtype)"
    ),
    Rule(
        "actor_rollout_ref.rollout.quantization_config_file",
        "c",
        "quantized rollouts",
        "bf16/fp16/fp32 rollouts (rollout.dtype)",
    ),
    Rule("actor_rollout_ref.rollout.mtp", "c", "multi-token prediction (speculative decoding)", "plain decoding"),
    Rule("actor_rollout_ref.rollout.mtp.*", "c", "multi-token prediction (speculative decoding)", "plain decoding"),
    Rule("actor_rollout_ref.rollout.disaggregation.*", "c", "prefill/decode disaggregation", "one engine per worker"),
    # ------------------------------------------------------------------ models
    Rule("*.model.hf_config_path", "c", "a model config.json apart from the weights", "model.override_config"),
    Rule("*.model.use_shm", "b", "models are read from local disk here (no shared-memory copy)"),
    Rule("*.model.enable_activation_offload", "c", "activation offloading", "model.enable_gradient_checkpointing"),
    Rule("*.model.use_liger", "c", "Liger kernels", "the Hugging Face model code"),
    Rule("*.model.use_fused_kernels", "b", "log-probs and entropy here come from the logits (no fused kernels)"),
    Rule("*.model.fused_kernel_options.*", "b", "log-probs and entropy here come from the logits (no fused kernels)"),
    Rule("*.model.tiled_mlp.*", "c", "tiled MLP", "model.enable_gradient_checkpointing"),
    Rule("*.model.mtp.*", "c", "multi-token prediction", "plain next-token training"),
    Rule(
        "*.model.torch_dtype",
        "b",
        "master weights here are fsdp_config.model_dtype and the compute dtype fsdp_config.mixed_precision.param_dtype",
    ),
    # ------------------------------------------------------------------ data
    Rule("data.use_shm", "b", "data files are read from local disk here"),
    Rule("data.train_max_samples", "c", "limiting the number of training samples", "-1 (all rows)", accept=(-1,)),
    Rule("data.val_max_samples", "c", "limiting the number of validation samples", "-1 (all rows)", accept=(-1,)),
    Rule(
        "data.gen_batch_size",
        "b",
        "each generation round here draws data.train_batch_size prompts (algorithm.filter_groups keeps generating)",
    ),
    Rule("data.tool_config_path", "c", "tool calling", "single-turn generation"),
    Rule("data.function_tool_path", "c", "tool calling", "single-turn generation"),
    Rule(
        "data.return_raw_input_ids",
        "b",
        "a reward model with another tokenizer re-encodes the decoded text here by itself",
    ),
    Rule("data.image_patch_size", "c", *_MULTIMODAL),
    Rule("data.image_key", "c", *_MULTIMODAL),
    Rule("data.video_key", "c", *_MULTIMODAL),
    Rule("data.audio_key", "c", *_MULTIMODAL),
    Rule("data.return_multi_modal_inputs", "c", *_MULTIMODAL),
    Rule("data.mm_processor_kwargs*", "c", *_MULTIMODAL),
    Rule("data.filter_overlong_prompts_workers", "b", "prompts are filtered in the driver process here"),
    Rule("data.trust_remote_code", "b", "the tokenizer here follows actor_rollout_ref.model.trust_remote_code"),
    Rule("data.apply_chat_template_kwargs*", "c", "extra chat-template arguments", "model.custom_chat_template"),
    # ------------------------------------------------------------------ reward (legacy reward_model and new reward)
    Rule("reward_model.num_workers", "b", "scoring here runs in the driver's reward manager"),
    Rule(
        "reward_model.enable_resource_pool",
        "c",
        "a separate reward-model pool by this key",
        "trainer.role_pools={rm: [N]}",
        accept=(None, False),
    ),
    Rule(
        "reward_model.n_gpus_per_node",
        "c",
        "a separate reward-model pool by this key",
        "trainer.role_pools={rm: [N]}",
        accept=(None,),
    ),
    Rule(
        "reward_model.nnodes",
        "c",
        "a separate reward-model pool by this key",
        "trainer.role_pools={rm: [N]}",
        accept=(None,),
    ),
    Rule(
        "reward_model.reward_loop_*",
        "c",
        "custom reward loops",
        "reward_model.reward_manager (a registered name or file.py:Class)",
    ),
    Rule("reward_model.rollout.*", "b", _RM_ROLLOUT),
    Rule("reward_model.use_reward_loop", "b", "scoring here always goes through the reward manager (the reward loop)"),
    Rule("reward.num_workers", "b", "scoring here runs in the driver's reward manager"),
    Rule(
        "reward.reward_model.enable_resource_pool",
        "c",
        "a separate reward-model pool by this key",
        "trainer.role_pools={rm: [N]}",
        accept=(False,),
    ),
    Rule(
        "reward.reward_model.n_gpus_per_node",
        "b",
        "the reward-model worker here uses the run's pool or trainer.role_pools.rm",
    ),
    Rule(
        "reward.reward_model.nnodes", "b", "the reward-model worker here uses the run's pool or trainer.role_pools.rm"
    ),
    Rule("reward.reward_model.rollout.*", "b", _RM_ROLLOUT),
    Rule("reward.reward_manager.module.*", "b", "used only with reward.reward_manager.source=importlib"),
    Rule(
        "*sandbox_fusion.url",
        "c",
        "sandbox fusion (remote code execution)",
        "rule and custom reward functions",
        accept=(None,),
    ),
    Rule("*sandbox_fusion.*", "b", "used only by sandbox fusion, which is not available"),
    # ------------------------------------------------------------------ algorithm
    Rule("algorithm.filter_groups.max_inflight_gen_batches", "b", "generation rounds here run one after the other"),
    # ------------------------------------------------------------------ sections without a counterpart
    Rule(
        "distillation.*",
        "c",
        "on-policy distillation from teacher models",
        "KL to the reference policy (actor.use_kl_loss)",
    ),
    Rule("transfer_queue.*", "c", "the transfer queue", "DataProto passed between worker groups"),
    Rule("skip.*", "c", "rollout caching and replay (skip)", "trainer.rollout_data_dir for dumping rollouts"),
    Rule("global_profiler.*", "c", *_PROFILER),
    # ------------------------------------------------------------------ trainer
    Rule(
        "trainer.esi_redundant_time",
        "b",
        "there is no elastic-scheduling (ESI) save deadline here; use trainer.time_budget_s",
    ),
    Rule("trainer.default_hdfs_dir", "c", "copying checkpoints to HDFS", "trainer.default_local_dir", accept=(None,)),
    Rule(
        "trainer.del_local_ckpt_after_load",
        "c",
        "deleting a checkpoint after loading it",
        "trainer.max_actor_ckpt_to_keep",
    ),
    Rule("trainer.ray_wait_register_center_timeout", "b", "workers here register with the driver directly"),
    Rule("trainer.use_v1", "b", "there is one trainer loop here"),
    Rule("trainer.use_legacy_worker_impl", "b", "there is one worker implementation here"),
)

_RULE_CACHE: dict[str, Rule | None] = {}


def rule_for(key: str) -> Rule | None:
    """The first rule matching dotted `key`, or None (behaviour (a))."""
    if key not in _RULE_CACHE:
        _RULE_CACHE[key] = next((r for r in RULES if fnmatch.fnmatchcase(key, r.pattern)), None)
    return _RULE_CACHE[key]


def behaviour(key: str) -> tuple[str, str]:
    """(kind, text) of a key for the reference: kind a, b or c."""
    rule = rule_for(key)
    if rule is None:
        return "a", ""
    if rule.kind == "b":
        return "b", rule.why
    text = f"not available: {rule.why} (available: {rule.available})"
    if rule.accept:
        text = f"implemented for {', '.join(_fmt(v) for v in rule.accept)}; other values " + text
    return "c", text


# ----------------------------------------------------------------------------- aliases
@dataclass(frozen=True)
class Alias:
    """`old` (a key or a subtree prefix) is an older spelling of `new`."""

    old: str
    new: str
    note: str = "upstream renamed it"


ALIASES: tuple[Alias, ...] = (
    Alias("critic.model.fsdp_config", "critic.fsdp"),
    Alias("critic.fsdp_config", "critic.fsdp", "this project's earlier spelling"),
    Alias("reward_model.model.fsdp_config", "reward_model.fsdp_config"),
    Alias("reward_model.model_path", "reward_model.model.path"),
    Alias("reward_model.inference", "reward_model.rollout"),
    Alias("actor_rollout_ref.actor.optim.warmup_style", "actor_rollout_ref.actor.optim.lr_scheduler_type"),
    Alias("critic.optim.warmup_style", "critic.optim.lr_scheduler_type"),
)

# Upstream's "global" micro-batch keys (divided by the data-parallel size to get the per-GPU key).
GLOBAL_MICRO_BATCH_KEYS = (
    ("actor_rollout_ref.actor.ppo_micro_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"),
    (
        "actor_rollout_ref.rollout.log_prob_micro_batch_size",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    ),
    ("critic.ppo_micro_batch_size", "critic.ppo_micro_batch_size_per_gpu"),
    ("critic.forward_micro_batch_size", "critic.forward_micro_batch_size_per_gpu"),
)

# Keys with a (b)/(c) rule that stay in the config although no dataclass holds them.
KEPT_KEYS = frozenset({"actor_rollout_ref.hybrid_engine"})

# Sections of upstream's config that no dataclass of ours holds: read here, then removed.
UPSTREAM_ONLY_SECTIONS = ("reward", "sandbox_fusion", "distillation", "transfer_queue", "global_profiler", "skip")


# ----------------------------------------------------------------------------- embedded preset
# The embedded toy job (tiny model, toy task; docs/quickstart.md): these settings apply when
# actor_rollout_ref.model.path is null, each one only if the user did not set that key.
EMBEDDED_PRESET: dict[str, Any] = {
    "data.max_prompt_length": 16,
    "data.max_response_length": 8,
    "data.train_batch_size": 32,
    "data.return_raw_chat": False,
    "data.seed": 1,
    "data.filter_overlong_prompts": True,
    "data.dataloader_num_workers": 0,
    "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
    "actor_rollout_ref.actor.use_dynamic_bsz": True,
    "actor_rollout_ref.actor.data_loader_seed": 1,
    "actor_rollout_ref.actor.clip_ratio_low": None,
    "actor_rollout_ref.actor.clip_ratio_high": None,
    "actor_rollout_ref.actor.optim.lr": 3e-5,
    "actor_rollout_ref.actor.fsdp_config.wrap_policy": {},
    "actor_rollout_ref.ref.fsdp_config.wrap_policy": {},
    "actor_rollout_ref.rollout.mode": "sync",
    "actor_rollout_ref.rollout.n": 8,
    "actor_rollout_ref.rollout.enforce_eager": True,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "actor_rollout_ref.rollout.max_num_seqs": 1024,
    "actor_rollout_ref.rollout.engine_kwargs": {},
    "critic.model.enable_gradient_checkpointing": False,
    "critic.data_loader_seed": 1,
    "critic.fsdp.wrap_policy": {},
    "algorithm.filter_groups.metric": "acc",
    "trainer.total_epochs": 2,
    "trainer.project_name": "verl",
    "trainer.experiment_name": "default",
    "trainer.logger": ["console", "file"],
    "trainer.n_gpus_per_node": 1,
    "trainer.balance_batch": False,
    "trainer.test_freq": 10,
}


def override_keys(overrides: list[str] | None) -> set[str]:
    """Dotted keys that command-line style overrides set (`k=v`, `+k=v`, `++k=v`, `~k`)."""
    keys = set()
    for item in overrides or []:
        text = str(item).lstrip("~+")
        key = text.split("=", 1)[0].strip()
        if key and not key.startswith("hydra."):
            keys.add(key)
    return keys


EMBEDDED_ASSETS = Path(__file__).resolve().parents[2] / "assets"


def _is_embedded_model(path: Any) -> bool:
    """No model given, or one of the tiny models shipped in verl/assets (the toy jobs' models,
    e.g. the calculator agent's): the toy preset applies."""
    if path is None:
        return True
    try:
        return Path(str(path)).expanduser().resolve().is_relative_to(EMBEDDED_ASSETS)
    except (OSError, ValueError):
        return False


def apply_embedded_preset(cfg: DictConfig, overrides: list[str] | None, always: bool = False) -> DictConfig:
    """Put the embedded toy job's settings into `cfg` (in place) when no model is given or the
    model is one shipped in verl/assets (or `always`, e.g. for a tiny test model).

    A preset key is left alone when the user set it, or a section above it, or a key below it
    (`trainer.logger=[console]`, `actor_rollout_ref.actor.optim={lr: 1e-5}`). Returns `cfg`.
    """
    if not always and not _is_embedded_model(OmegaConf.select(cfg, "actor_rollout_ref.model.path")):
        return cfg
    user = override_keys(overrides)
    with open_dict(cfg):
        for key, value in EMBEDDED_PRESET.items():
            if any(u == key or key.startswith(u + ".") or u.startswith(key + ".") for u in user):
                continue
            OmegaConf.update(cfg, key, copy.deepcopy(value), merge=False, force_add=True)
    return cfg


# ----------------------------------------------------------------------------- overrides
def _yaml_raw() -> dict:
    return OmegaConf.to_container(OmegaConf.load(YAML_PATH), resolve=False)


def _all_defaults() -> dict:
    """The yaml's defaults plus the dataclass defaults of the keys the yaml does not list."""
    tree = _yaml_raw()
    _fill_dataclass_defaults(tree)
    return tree


def _has_path(tree: Any, dotted: str) -> bool:
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def dataclass_keys() -> set[str]:
    """Dotted keys of every field of the config dataclasses (nested dataclasses included)."""
    out: set[str] = set()
    for prefix, cls in section_types().items():
        _walk_fields(cls, prefix, out)
    return out


def _walk_fields(cls: type, prefix: str, out: set[str]) -> None:
    from verl.utils.config import _dataclass_in

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}"
        out.add(key)
        sub = _dataclass_in(hints.get(f.name))
        if sub is not None:
            _walk_fields(sub, key, out)


def section_types() -> dict[str, type]:
    """Config path -> the dataclass of that section."""
    from verl.trainer.config import AlgoConfig, CustomRewardFunctionConfig, DataConfig, RayKwargsConfig, TrainerConfig
    from verl.workers.config import (
        ActorConfig,
        CriticConfig,
        HFModelConfig,
        RefConfig,
        RewardModelConfig,
        RolloutConfig,
    )

    return {
        "data": DataConfig,
        "actor_rollout_ref.model": HFModelConfig,
        "actor_rollout_ref.actor": ActorConfig,
        "actor_rollout_ref.ref": RefConfig,
        "actor_rollout_ref.rollout": RolloutConfig,
        "critic": CriticConfig,
        "reward_model": RewardModelConfig,
        "custom_reward_function": CustomRewardFunctionConfig,
        "algorithm": AlgoConfig,
        "trainer": TrainerConfig,
        "ray_kwargs": RayKwargsConfig,
    }


def normalize_overrides(overrides: list[str] | None) -> list[str]:
    """Make both spellings of an override work for keys of this project that upstream's yaml
    lacks (and that ours therefore does not list either).

    - `key=value` for a key the yaml does not list, but a config dataclass (or an alias) does:
      becomes `+key=value` (this project's own docs write e.g. `trainer.time_budget_s=60`);
    - `+key=value` for a key the yaml lists: becomes `key=value`.
    Everything else is passed unchanged (Hydra reports it).
    """
    raw = _yaml_raw()
    known = dataclass_keys() | {a.old for a in ALIASES}
    out = []
    for item in overrides or []:
        text = str(item)
        if text.startswith(("++", "~")) or "=" not in text:
            out.append(text)
            continue
        plus = text.startswith("+")
        key = text.lstrip("+").split("=", 1)[0].strip()
        present = _has_path(raw, key)
        if plus and present:
            out.append(text[1:])
        elif not plus and not present and (key in known or any(key.startswith(k + ".") for k in known)):
            out.append("+" + text)
        else:
            out.append(text)
    return out


# ----------------------------------------------------------------------------- the check
def _leaves(node: Any, prefix: str = ""):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif prefix:
        yield prefix, node


def _get(tree: dict, dotted: str, default: Any = None) -> Any:
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _set(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def _pop(tree: dict, dotted: str) -> Any:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None
    return node.pop(parts[-1], None) if isinstance(node, dict) else None


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _resolved(tree: dict) -> dict:
    """Resolve interpolations; a tree that cannot be resolved (a missing key) stays raw."""
    try:
        return OmegaConf.to_container(OmegaConf.create(tree), resolve=True)
    except Exception:  # noqa: BLE001 - a dangling interpolation: compare raw values instead
        return tree


def _defaults_in_context(raw_user: dict, keys: list[str], raw_yaml: dict) -> dict:
    """The user's config with every key of `keys` put back to its yaml default, resolved: an
    interpolated default (`${oc.select:trainer.n_gpus_per_node,8}`) follows the user's config."""
    tree = copy.deepcopy(raw_user)
    for section in UPSTREAM_ONLY_SECTIONS:  # a normalised config no longer has them
        if section not in tree and section in raw_yaml:
            tree[section] = copy.deepcopy(raw_yaml[section])
    for key in keys:
        if _has_path(raw_yaml, key):
            _set(tree, key, copy.deepcopy(_get(raw_yaml, key)))
        else:
            _pop(tree, key)
    return _resolved(tree)


_logged_b: set[tuple[str, str]] = set()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (a == b and type(a) is type(b))
    return a == b


def check_upstream_surface(config: Any) -> DictConfig:
    """Apply the key behaviours of this module to `config`; returns the normalised copy.

    Raises ValueError for a (c) key set to a value that is not available here (before Ray
    starts); logs once each (b) key the run sets (and why it has no effect); warns once per
    deprecated spelling used. Idempotent.
    """
    if isinstance(config, DictConfig):
        raw = OmegaConf.to_container(config, resolve=False)
    else:
        raw = copy.deepcopy(dict(config))
    raw.pop("hydra", None)
    raw_yaml = _all_defaults()
    _move_aliases(raw, raw_yaml)

    user = _resolved(raw)
    leaves = [(k, v) for k, v in _leaves(user) if rule_for(k) is not None]
    base = _defaults_in_context(raw, [k for k, _ in leaves], raw_yaml)
    refused: dict[str, list[tuple[Rule, str, Any]]] = {}
    for key, value in leaves:
        rule = rule_for(key)
        default = _get(base, key, "<unset>")
        if _same(value, default):
            continue
        if rule.kind == "c":
            if rule.accept and any(_same(value, a) for a in rule.accept):
                continue
            if rule.refuse and not any(_same(value, r) for r in rule.refuse):
                continue
            refused.setdefault(rule.why, []).append((rule, key, value))
        elif (key, _fmt(value)) not in _logged_b:
            _logged_b.add((key, _fmt(value)))
            logger.warning("%s=%s has no effect here: %s", key, _fmt(value), rule.why)
    if refused:
        raise ValueError("; ".join(_refusal(items) for items in refused.values()))
    _check_rollout_device(user)
    _log_engine_only_keys(user, raw_yaml)

    _map_reward_section(raw)
    _map_global_micro_batches(raw)
    _map_misc(raw)
    # interpolations into the sections removed below keep the value they have now
    for key, value in list(_leaves(raw)):
        if isinstance(value, str) and any(f"{s}." in value for s in UPSTREAM_ONLY_SECTIONS) and "${" in value:
            _set(raw, key, _plain(_get(user, key)))
    for section in UPSTREAM_ONLY_SECTIONS:
        raw.pop(section, None)
    _strip_unheld(raw)
    _fill_dataclass_defaults(raw)
    return OmegaConf.create(raw)


# rollout keys that only the vllm engine reads
VLLM_ONLY_KEYS = (
    "tensor_model_parallel_size",
    "gpu_memory_utilization",
    "max_num_batched_tokens",
    "max_num_seqs",
    "enforce_eager",
    "free_cache_engine",
    "enable_chunked_prefill",
    "dtype",
)


def _log_engine_only_keys(user: dict, raw_yaml: dict) -> None:
    """With rollout.name=hf, the vllm-only keys the run set are logged as having no effect."""
    if _get(user, "actor_rollout_ref.rollout.name") != "hf":
        return
    embedded = _get(user, "actor_rollout_ref.model.path") is None
    for name in VLLM_ONLY_KEYS:
        key = f"actor_rollout_ref.rollout.{name}"
        value, default = _get(user, key, "<unset>"), _get(raw_yaml, key, "<unset>")
        if embedded and key in EMBEDDED_PRESET and _same(value, EMBEDDED_PRESET[key]):
            continue  # the embedded preset's own value, not the user's
        if not _same(value, default) and (key, _fmt(value)) not in _logged_b:
            _logged_b.add((key, _fmt(value)))
            logger.warning(
                "%s=%s has no effect here: only the vllm rollout reads it (rollout.name=hf)", key, _fmt(value)
            )


def _check_rollout_device(user: dict) -> None:
    """The vllm engine needs a CUDA GPU: say so before Ray starts instead of in a worker."""
    if _get(user, "actor_rollout_ref.rollout.name") != "vllm":
        return
    device = _get(user, "trainer.device", "auto")
    if device == "cuda":
        return
    import torch

    if device == "cpu" or not torch.cuda.is_available():
        raise ValueError(
            "actor_rollout_ref.rollout.name=vllm: the vllm rollout without a CUDA GPU is not available in this verl "
            "(available: actor_rollout_ref.rollout.name=hf, which runs on CPU and GPU)"
        )


def _refusal(items: list[tuple[Rule, str, Any]]) -> str:
    """One message per missing feature: the headline key (a value-restricted key such as
    `strategy` first), then the other keys that need the same feature."""
    items = sorted(items, key=lambda it: (not it[0].accept, it[1]))
    rule, key, value = items[0]
    text = f"{key}={_fmt(value)}: {rule.why} is not available in this verl (available: {rule.available})"
    others = [f"{k}={_fmt(v)}" for _, k, v in items[1:]]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        text += f" (also needed by {shown})"
    return text


def _warn_deprecated(old: str, new: str, note: str) -> None:
    warnings.warn(f"{old} is deprecated ({note}): use {new}", DeprecationWarning, stacklevel=3)
    logger.warning("%s is deprecated (%s): use %s", old, note, new)


def _move_aliases(raw: dict, raw_yaml: dict) -> None:
    """Move values set under an older spelling to the current key. Alias leaves are null in the
    yaml (= not set); a set leaf overrides the current key (a conflict with a current key that the
    user also changed is an error)."""
    for alias in ALIASES:
        if not _has_path(raw, alias.old):
            continue
        value = _pop(raw, alias.old)
        set_leaves = [(k, v) for k, v in _leaves({"x": value}) if v is not None and v != {}]
        if not set_leaves:
            continue
        _warn_deprecated(alias.old, alias.new, alias.note)
        for k, v in set_leaves:
            sub = k[len("x") :]
            target = alias.new + sub
            current = _get(raw, target, "<unset>")
            default = _get(raw_yaml, target, "<unset>")
            if current != "<unset>" and current != default and current != v:
                raise ValueError(
                    f"{alias.old + sub}={_fmt(v)} conflicts with {target}={_fmt(current)}: set only {target}"
                )
            _set(raw, target, v)


def _map_reward_section(raw: dict) -> None:
    """Upstream's `reward.*` section (current) onto the keys our reward code reads
    (`custom_reward_function.*`, `reward_model.*`); the legacy keys win when set (non-null)."""
    reward = raw.get("reward") or {}
    rm = raw.setdefault("reward_model", {})
    crf = raw.setdefault("custom_reward_function", {})
    new_crf = reward.get("custom_reward_function") or {}
    for key in ("path", "name"):
        if crf.get(key) is None and new_crf.get(key) is not None:
            crf[key] = new_crf[key]
    manager = reward.get("reward_manager") or {}
    if rm.get("reward_manager") is None:
        source = manager.get("source", "register")
        if source == "importlib":
            module = manager.get("module") or {}
            if not module.get("path"):
                raise ValueError(
                    "reward.reward_manager.source=importlib needs reward.reward_manager.module.path "
                    "(a .py file or module)"
                )
            rm["reward_manager"] = f"{module['path']}:{module.get('name') or 'custom_reward_manager'}"
        elif source == "register":
            rm["reward_manager"] = manager.get("name") or "naive"
        else:
            raise ValueError(
                f"reward.reward_manager.source={source!r} is not allowed; expected one of ['register', 'importlib']"
            )
    new_rm = reward.get("reward_model") or {}
    if rm.get("enable") is None:
        rm["enable"] = bool(new_rm.get("enable", False))
    model = rm.setdefault("model", {})
    if model.get("path") is None and new_rm.get("model_path") is not None:
        model["path"] = new_rm["model_path"]


def _map_global_micro_batches(raw: dict) -> None:
    """Upstream's deprecated global micro-batch sizes: divided by the data-parallel size into the
    per-GPU key (as upstream does) when the per-GPU key is not set."""
    trainer = raw.get("trainer") or {}
    sizes = [trainer.get("nnodes") or 1, trainer.get("n_gpus_per_node") or 1]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in sizes):
        return  # a mistyped size: validate_config names it; nothing can be divided by it here
    n_workers = sizes[0] * sizes[1]
    for old, new in GLOBAL_MICRO_BATCH_KEYS:
        value = _get(raw, old)
        if value is None:
            continue
        if isinstance(value, str) and value.startswith("${"):
            continue  # an interpolation of another (deprecated) key: handled at its source
        _warn_deprecated(old, new, "a global size, divided by the data-parallel size")
        if _get(raw, new) is None or (isinstance(_get(raw, new), str) and str(_get(raw, new)).startswith("${")):
            _set(raw, new, max(int(value) // n_workers, 1))
        _set(raw, old, None)


def _map_misc(raw: dict) -> None:
    for section in ("actor_rollout_ref.model", "critic.model", "reward_model.model"):
        model = _get(raw, section)
        if isinstance(model, dict) and "trust_remote_code" in model and model["trust_remote_code"] is None:
            model["trust_remote_code"] = False  # upstream's legacy reward_model.model default is null
    data = raw.get("data") or {}
    if "seed" in data and data["seed"] is None:
        data["seed"] = 1  # upstream: null means the default sampler seed
    actor = _get(raw, "actor_rollout_ref.actor") or {}
    pl = actor.get("policy_loss")
    if isinstance(pl, dict):
        # SAPO temperatures: upstream reads them from actor.tau_pos/tau_neg (its yaml) or from
        # policy_loss.* (its scripts append them with +); policy_loss.* wins when given
        for key in ("tau_pos", "tau_neg"):
            if key in actor and key not in pl:
                pl[key] = actor[key]


def _strip_unheld(raw: dict) -> None:
    """Remove (b)/(c) keys (checked above) that no config dataclass holds, and the sections that
    this leaves empty."""
    held = dataclass_keys() | KEPT_KEYS
    dict_fields = [h for h in held if _is_dict_field(h)]
    for key, _ in list(_leaves(raw)):
        if rule_for(key) is None or key in held or any(key.startswith(h + ".") for h in dict_fields):
            continue
        _pop(raw, key)
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        while parent and _get(raw, parent) == {} and parent not in held:
            _pop(raw, parent)
            parent = parent.rsplit(".", 1)[0] if "." in parent else ""


_DICT_FIELDS: set[str] | None = None


def _is_dict_field(key: str) -> bool:
    global _DICT_FIELDS
    if _DICT_FIELDS is None:
        from verl.utils.config import _dataclass_in

        out = set()
        for prefix, cls in section_types().items():
            stack = [(prefix, cls)]
            while stack:
                pre, c = stack.pop()
                hints = typing.get_type_hints(c)
                for f in dataclasses.fields(c):
                    sub = _dataclass_in(hints.get(f.name))
                    if sub is not None:
                        stack.append((f"{pre}.{f.name}", sub))
                    elif "dict" in str(hints.get(f.name)).lower() or "Any" in str(hints.get(f.name)):
                        out.add(f"{pre}.{f.name}")
        _DICT_FIELDS = out
    return key in _DICT_FIELDS


def _plain(value: Any) -> Any:
    """A yaml-able copy (tuples become lists)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return copy.deepcopy(value)


def _fill_dataclass_defaults(raw: dict) -> None:
    """Keys of the config dataclasses that the config lacks (the yaml does not list them) get their
    dataclass default, so code reading the raw config sees every key."""
    from verl.utils.config import _dataclass_in

    def fill(node: dict, cls: type) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            sub = _dataclass_in(hints.get(f.name))
            if f.name not in node:
                if f.default is not dataclasses.MISSING:
                    value = f.default
                elif f.default_factory is not dataclasses.MISSING:
                    value = f.default_factory()
                else:
                    continue
                if dataclasses.is_dataclass(value):
                    value = dataclasses.asdict(value)
                node[f.name] = _plain(value)
            elif sub is not None and isinstance(node[f.name], dict):
                fill(node[f.name], sub)

    for prefix, cls in section_types().items():
        node = _get(raw, prefix)
        if isinstance(node, dict):
            fill(node, cls)
