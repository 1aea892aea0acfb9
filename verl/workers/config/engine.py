"""FSDP2 engine config (`*.fsdp_config`), and upstream's Megatron-LM engine config
(`McoreEngineConfig`: validates, refused by the workers; see `verl.workers.config.megatron`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig, check_choice, check_range

DTYPES = ("fp32", "bf16", "fp16")
# upstream scripts also write torch's names (`model_dtype=bfloat16`); they mean the same dtypes
DTYPE_SPELLINGS = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "fp32": "fp32",
    "bf16": "bf16",
    "fp16": "fp16",
}


@dataclass
class MixedPrecisionConfig(BaseConfig):
    """Compute dtype of forward/backward (`torch.autocast`); master weights, gradients and their
    reduction stay in `FSDPEngineConfig.model_dtype`.

    `param_dtype: null` means: bf16 on CUDA, fp32 on CPU (see `FSDPEngineConfig.cpu_autocast_bf16`).
    """

    param_dtype: str | None = None

    def __post_init__(self):
        if self.param_dtype is not None:
            self.param_dtype = DTYPE_SPELLINGS.get(self.param_dtype, self.param_dtype)
            check_choice("fsdp_config.mixed_precision", "param_dtype", self.param_dtype, DTYPES)


@dataclass
class FSDPEngineConfig(BaseConfig):
    """How a model is sharded and placed.

    - `fsdp_size`: shard group size; -1 = the whole worker group (pure FSDP). Smaller values give
      HSDP (replicate across shard groups).
    - `param_offload` / `optimizer_offload`: keep parameters / optimizer state on CPU between
      phases (useful on GPU; no-op on CPU).
    - `reshard_after_forward`: free gathered parameters after forward (saves memory, costs an
      extra all-gather in backward).
    - `model_dtype`: dtype of the master weights (fp32 for training, bf16 is fine for a frozen ref).
    - `cpu_autocast_bf16`: on CPU, run forward/backward under bf16 autocast (fast on AMX CPUs;
      the rollout/learner log-prob mismatch is reported in metrics).
    """

    fsdp_size: int = -1
    param_offload: bool = False
    optimizer_offload: bool = False
    reshard_after_forward: bool = True
    model_dtype: str = "fp32"
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    cpu_autocast_bf16: bool = False
    wrap_policy: dict = field(default_factory=dict)  # {"min_num_params": N}; default: wrap each decoder layer

    def __post_init__(self):
        self.model_dtype = DTYPE_SPELLINGS.get(self.model_dtype, self.model_dtype)
        check_choice("fsdp_config", "model_dtype", self.model_dtype, DTYPES + ("float32", "bfloat16", "float16"))
        if self.fsdp_size == 0 or self.fsdp_size < -1:
            raise ValueError(f"fsdp_config.fsdp_size={self.fsdp_size} must be -1 (all workers) or a positive int")


@dataclass
class McoreEngineConfig(BaseConfig):
    """Megatron-LM parallelism and placement (`*.megatron`)."""

    _mutable_fields = BaseConfig._mutable_fields | {"sequence_parallel"}

    tensor_model_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    context_parallel_size: int = 1
    sequence_parallel: bool = True
    use_distributed_optimizer: bool = True
    param_offload: bool = False
    grad_offload: bool = False
    optimizer_offload: bool = False
    seed: int = 42
    dtype: str = "bfloat16"
    use_dist_checkpointing: bool = False
    dist_checkpointing_path: str | None = None
    override_ddp_config: dict[str, Any] = field(default_factory=dict)
    override_transformer_config: dict[str, Any] = field(default_factory=dict)
    use_mbridge: bool = True
    strategy: str = "megatron"

    def __post_init__(self):
        owner = "megatron"
        check_choice(owner, "strategy", self.strategy, ("megatron",))
        check_choice(owner, "dtype", self.dtype, ("bfloat16", "float16"))
        for key in (
            "tensor_model_parallel_size",
            "expert_model_parallel_size",
            "pipeline_model_parallel_size",
            "context_parallel_size",
        ):
            check_range(owner, key, getattr(self, key), low=1)
        check_range(owner, "expert_tensor_parallel_size", self.expert_tensor_parallel_size, low=1, allow_none=True)
        if self.tensor_model_parallel_size == 1:
            self.sequence_parallel = False  # sequence parallelism splits along the tensor-parallel group
