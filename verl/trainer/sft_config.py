"""Checks of the `sft_trainer_engine` config and its sections as the shared config dataclasses.

Every key of upstream's SFT config is accepted. A value this trainer cannot honour (another engine,
sequence parallelism, liger or fused kernels, profiling, ...) fails before anything is built, with
a message naming the key, the value and what is accepted; keys that only tune upstream's CUDA
kernels (`engine.use_torch_compile`, `engine.forward_prefetch`, ...) have no effect here
(docs/sft_generation_eval.md lists them).
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.workers.config import FSDPEngineConfig, HFModelConfig, OptimizerConfig
from verl.workers.config.engine import MixedPrecisionConfig

logger = logging.getLogger(__name__)

__all__ = [
    "check_sft_config",
    "fsdp_engine_config",
    "model_config",
    "optimizer_config",
    "resolve_freq",
    "resolve_sft_device",
]

# (key, predicate on the value that means "asks for something not available", what it is)
_NOT_AVAILABLE = (
    ("engine.ulysses_sequence_parallel_size", lambda v: int(v) > 1, "Ulysses sequence parallelism"),
    ("engine.param_offload", bool, "parameter offload in sft_trainer"),
    ("engine.optimizer_offload", bool, "optimizer offload in sft_trainer"),
    ("engine.offload_policy", bool, "FSDP2 CPU offload policy"),
    ("engine.qat.enable", bool, "quantisation-aware training"),
    ("engine.pad_to_length", bool, "padding micro-batches to a fixed length"),
    ("model.use_liger", bool, "liger kernels"),
    ("model.use_fused_kernels", bool, "fused kernels"),
    ("model.tiled_mlp.enabled", bool, "tiled MLP"),
    ("model.enable_activation_offload", bool, "activation offload"),
    ("model.use_shm", bool, "loading the model through shared memory"),
    ("model.hf_config_path", lambda v: v is not None, "a model config from another directory"),
    ("model.mtp.enable", bool, "multi-token prediction"),
    ("data.use_shm", bool, "loading data through shared memory"),
    ("data.balance_dp_token", bool, "token balancing across data-parallel ranks (not implemented upstream)"),
    ("profiler.enable", bool, "the profiler in sft_trainer"),
    ("optim.override_optimizer_config", lambda v: bool(v), "optimizer overrides"),
)


def resolve_sft_device(name: str) -> str:
    """`auto` -> cuda when present; `cuda` (upstream's default) without a GPU -> cpu, with a warning."""
    import torch

    if name not in ("auto", "cpu", "cuda"):
        raise ValueError(f"trainer.device={name!r} is not allowed; choose cuda, cpu or auto")
    if name == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        if name == "cuda":
            logger.warning("trainer.device=cuda but torch sees no CUDA device: training on cpu")
        return "cpu"
    return "cuda"


def resolve_freq(value, key: str, steps_per_epoch: int) -> int:
    """`save_freq` / `test_freq`: an int (<= 0: only at the end) or `after_each_epoch`."""
    if value == "after_each_epoch":
        return steps_per_epoch
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}={value!r} must be an integer (-1: only at the end) or 'after_each_epoch'")
    return value


def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def check_sft_config(config, world_size: int | None = None, num_train: int | None = None) -> int | None:
    """Fail early on what cannot run; with `world_size` (and `num_train`, the training rows) also
    check the batch sizes and return the per-process batch."""
    strategy = OmegaConf.select(config, "engine.strategy", default="fsdp")
    if strategy not in ("fsdp", "fsdp2"):
        raise ValueError(f"engine.strategy={strategy!r}: the {strategy} engine is not available here; use engine=fsdp")
    for key, asks, what in _NOT_AVAILABLE:
        value = OmegaConf.select(config, key, default=None)
        if value is not None and asks(value):
            raise ValueError(f"{key}={_plain(value)!r}: {what} is not available in this verl; leave it at its default")
    optim = config.optim
    if optim.get("optimizer", "AdamW") != "AdamW" or optim.get("optimizer_impl", "torch.optim") != "torch.optim":
        raise ValueError(
            f"optim.optimizer={optim.get('optimizer')!r} / optim.optimizer_impl={optim.get('optimizer_impl')!r}: only "
            "AdamW from torch.optim is available"
        )
    if not optim.get("zero_indexed_step", True):
        raise ValueError("optim.zero_indexed_step=False is not available; the schedule counts steps from 0")
    tr = config.trainer
    if tr.get("resume_mode", "auto") not in ("auto", "disable", "resume_path"):
        raise ValueError(f"trainer.resume_mode={tr.resume_mode!r} must be auto, disable or resume_path")
    if tr.get("resume_mode") == "resume_path" and not tr.get("resume_from_path"):
        raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_N directory)")
    for key in ("save_freq", "test_freq"):
        resolve_freq(tr.get(key, -1), f"trainer.{key}", 1)
    profile = list(tr.get("profile_interval") or [-1, -1])
    if len(profile) != 2 or profile[0] >= 0:
        raise ValueError(f"trainer.profile_interval={profile}: profiling is not available in sft_trainer here")
    from verl.utils.tracking import check_backends_available

    loggers = tr.get("logger") or []
    check_backends_available([loggers] if isinstance(loggers, str) else list(loggers))  # wandb missing: now
    if int(config.data.num_workers) < 0:
        raise ValueError(f"data.num_workers={config.data.num_workers} must be >= 0")
    if world_size is None:
        return None
    return _local_batch(config.data, world_size, num_train)


def _local_batch(data, world_size: int, num_train: int | None) -> int:
    if data.train_batch_size % world_size:
        raise ValueError(
            f"data.train_batch_size={data.train_batch_size} must be divisible by the number of processes {world_size}"
        )
    local = data.train_batch_size // world_size
    if not data.use_dynamic_bsz and local % data.micro_batch_size_per_gpu:
        raise ValueError(
            f"data.micro_batch_size_per_gpu={data.micro_batch_size_per_gpu} must divide the per-process batch "
            f"{local} (= data.train_batch_size {data.train_batch_size} / {world_size} processes)"
        )
    if num_train is not None and num_train < data.train_batch_size:
        raise ValueError(
            f"the SFT training set has {num_train} rows, fewer than data.train_batch_size={data.train_batch_size}"
        )
    return local


def model_config(model_cfg) -> HFModelConfig:
    """The `model` section as the shared `HFModelConfig` (LoRA keys included)."""
    return HFModelConfig(
        path=model_cfg.path,
        tokenizer_path=model_cfg.get("tokenizer_path"),
        trust_remote_code=bool(model_cfg.get("trust_remote_code", False)),
        override_config=dict(_plain(model_cfg.get("override_config")) or {}),
        enable_gradient_checkpointing=bool(model_cfg.get("enable_gradient_checkpointing", False)),
        use_remove_padding=bool(model_cfg.get("use_remove_padding", True)),
        lora_rank=int(model_cfg.get("lora_rank", 0) or 0),
        lora_alpha=int(model_cfg.get("lora_alpha", 16)),
        target_modules=_plain(model_cfg.get("target_modules", "all-linear")),
        exclude_modules=_plain(model_cfg.get("exclude_modules")),
        lora_adapter_path=model_cfg.get("lora_adapter_path"),
    )


def fsdp_engine_config(engine_cfg, device: str) -> FSDPEngineConfig:
    """The `engine` section as the shared `FSDPEngineConfig`. `engine.dtype` is the compute dtype
    on cuda; on cpu the model computes in `model_dtype` unless `cpu_autocast_bf16`."""
    wrap = dict(_plain(engine_cfg.get("wrap_policy")) or {})
    if not wrap.get("min_num_params"):
        wrap = {}  # 0 / absent: one FSDP unit per decoder layer
    dtype = engine_cfg.get("dtype", "bfloat16")
    if dtype not in ("bfloat16", "float16", "bf16", "fp16"):
        raise ValueError(f"engine.dtype={dtype!r} must be bfloat16 or float16")
    return FSDPEngineConfig(
        fsdp_size=int(engine_cfg.get("fsdp_size", -1)),
        reshard_after_forward=bool(engine_cfg.get("reshard_after_forward", True)),
        model_dtype=engine_cfg.get("model_dtype", "fp32"),
        mixed_precision=MixedPrecisionConfig(param_dtype=dtype if device == "cuda" else None),
        cpu_autocast_bf16=bool(engine_cfg.get("cpu_autocast_bf16", False)),
        wrap_policy=wrap,
    )


def optimizer_config(optim, total_steps: int) -> OptimizerConfig:
    """The `optim` section as the shared `OptimizerConfig`; `warmup_style` is the deprecated
    spelling of `lr_scheduler_type` (it wins when set, as upstream)."""
    scheduler = optim.get("warmup_style") or optim.get("lr_scheduler_type", "constant")
    return OptimizerConfig(
        lr=float(optim.lr),
        lr_warmup_steps=int(optim.get("lr_warmup_steps", -1)),
        lr_warmup_steps_ratio=float(optim.get("lr_warmup_steps_ratio", 0.0)),
        total_training_steps=int(total_steps),
        weight_decay=float(optim.get("weight_decay", 0.01)),
        betas=tuple(_plain(optim.get("betas", [0.9, 0.999]))),
        eps=float(optim.get("eps", 1e-8)),
        lr_scheduler_type=scheduler,
        min_lr_ratio=float(optim.get("min_lr_ratio", 0.0)),
        num_cycles=float(optim.get("num_cycles", 0.5)),
    )
