"""Rollout (generation) config (`actor_rollout_ref.rollout`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig, check_choice, check_range


@dataclass
class SamplingConfig(BaseConfig):
    """Sampling used for validation (`rollout.val_kwargs`). `do_sample=False` is greedy."""

    do_sample: bool = False
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    n: int = 1

    def __post_init__(self):
        owner = "actor_rollout_ref.rollout.val_kwargs"
        check_range(owner, "n", self.n, low=1)
        check_range(owner, "top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        check_range(owner, "temperature", self.temperature, low=0.0)
        if self.do_sample and self.temperature <= 0:
            raise ValueError(f"{owner}.temperature={self.temperature} must be > 0 when do_sample=True")


@dataclass
class MultiTurnConfig(BaseConfig):
    """Multi-turn, tool-using rollout (`rollout.multi_turn`; see docs/agent_loop.md).

    `enable` routes generation through the agent loops (`verl.experimental.agent_loop`).
    `max_assistant_turns` / `max_user_turns` (null = no limit) bound the turns of a trajectory;
    `max_parallel_calls` the calls run per assistant turn; a tool result longer than
    `max_tool_response_length` characters is cut on `tool_response_truncate_side`
    (`left`: its beginning is cut, `right`: its end, `middle`). `format` names the tool-call
    parser; `tokenization_sanity_check_mode` compares each trajectory with a full chat-template
    render (`strict`, `ignore_strippable`, `disable`).
    """

    enable: bool = False
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    tool_config_path: str | None = None
    function_tool_path: str | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    format: str = "hermes"
    use_inference_chat_template: bool = False
    tokenization_sanity_check_mode: str = "strict"

    def __post_init__(self):
        owner = "actor_rollout_ref.rollout.multi_turn"
        check_range(owner, "max_assistant_turns", self.max_assistant_turns, low=1, allow_none=True)
        check_range(owner, "max_user_turns", self.max_user_turns, low=1, allow_none=True)
        check_range(owner, "max_parallel_calls", self.max_parallel_calls, low=1)
        check_range(owner, "max_tool_response_length", self.max_tool_response_length, low=1)
        check_choice(
            owner, "tool_response_truncate_side", self.tool_response_truncate_side, ("left", "right", "middle")
        )
        check_choice(
            owner,
            "tokenization_sanity_check_mode",
            self.tokenization_sanity_check_mode,
            ("strict", "ignore_strippable", "disable"),
        )


@dataclass
class AgentLoopConfig(BaseConfig):
    """Agent loops (`rollout.agent`): `default_agent_loop` for samples without an `agent_name`
    column; `agent_loop_config_path` a yaml list of `{name, _target_}` registering more loops;
    `num_workers` x 64 bounds the trajectories in flight per rank (upstream: agent-loop workers)."""

    num_workers: int = 8
    default_agent_loop: str = "single_turn_agent"
    agent_loop_config_path: str | None = None

    def __post_init__(self):
        check_range("actor_rollout_ref.rollout.agent", "num_workers", self.num_workers, low=1)


@dataclass
class CheckpointEngineConfig(BaseConfig):
    """How weights reach a rollout with workers of its own (`rollout.checkpoint_engine`).

    - `backend`: `naive` (the colocated rollout: an in-process copy), `gloo` (CPU broadcast),
      `nccl` (CUDA broadcast); upstream's `nixl`, `kimi`, `mooncake` run as the device's broadcast.
    - `update_weights_bucket_megabytes`: size of one broadcast bucket (MiB); a larger tensor is
      sent in chunks.
    - `engine_kwargs`: per backend, e.g. `{gloo: {timeout_s: 600}}`.
    - `custom_backend_module`: a module imported in every worker that registers more backends
      (`CheckpointEngineRegistry.register`).
    """

    backend: str = "naive"
    update_weights_bucket_megabytes: int = 2048
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    custom_backend_module: str | None = None

    def __post_init__(self):
        owner = "actor_rollout_ref.rollout.checkpoint_engine"
        check_range(owner, "update_weights_bucket_megabytes", self.update_weights_bucket_megabytes, low=1)
        if not isinstance(self.backend, str) or not self.backend:
            raise ValueError(f"{owner}.backend={self.backend!r} must name a checkpoint engine (gloo, nccl, naive)")


@dataclass
class RolloutConfig(BaseConfig):
    """How responses are generated. `name` selects a rollout engine from the rollout registry
    (`hf`: Hugging Face generate on the actor's own weights, CPU and GPU; `vllm`: GPU only).

    `n` responses are sampled per prompt. `prompt_length` / `response_length` default to
    `data.max_prompt_length` / `data.max_response_length` (interpolated in the yaml).
    `calculate_log_probs` makes the engine return `rollout_log_probs` (needed by rollout
    correction, IcePop/KPop masking and the mismatch metrics).

    `nnodes` x `n_gpus_per_node`: the processes of a rollout with workers of its own
    (`actor_rollout_ref.hybrid_engine=False`); a colocated rollout runs in the actor's processes
    and ignores them. `checkpoint_engine`: how such a rollout receives the weights.
    """

    name: str = "hf"
    mode: str = "sync"
    n: int = 8
    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    prompt_length: int = 512
    response_length: int = 512
    dtype: str = "bfloat16"  # vllm only; hf uses the actor's compute dtype
    ignore_eos: bool = False
    calculate_log_probs: bool = True
    # hf engine: sequences generated per forward batch (bounds memory); null = all at once
    micro_batch_size: int | None = None
    # upstream's deprecated global size (see ActorConfig.ppo_micro_batch_size)
    log_prob_micro_batch_size: int | None = None
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = 16384
    # vllm only
    gpu_memory_utilization: float = 0.5
    tensor_model_parallel_size: int = 1
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    enforce_eager: bool = True
    free_cache_engine: bool = True
    enable_chunked_prefill: bool = True
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    nnodes: int = 0
    n_gpus_per_node: int = 8
    checkpoint_engine: CheckpointEngineConfig = field(default_factory=CheckpointEngineConfig)

    def __post_init__(self):
        owner = "actor_rollout_ref.rollout"
        check_range(owner, "nnodes", self.nnodes, low=0)
        check_range(owner, "n_gpus_per_node", self.n_gpus_per_node, low=0)
        # async: upstream serves requests from an agent loop; the engines here (hf, vllm in-process)
        # generate a step's whole batch in one call in both modes, so both give the same result
        check_choice(owner, "mode", self.mode, ("sync", "async"))
        check_range(owner, "n", self.n, low=1)
        check_range(owner, "temperature", self.temperature, low=0.0)
        check_range(owner, "top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        check_range(owner, "prompt_length", self.prompt_length, low=1)
        check_range(owner, "response_length", self.response_length, low=1)
        check_range(owner, "micro_batch_size", self.micro_batch_size, low=1, allow_none=True)
        check_range(owner, "gpu_memory_utilization", self.gpu_memory_utilization, low=0.0, high=1.0, low_open=True)
        if self.do_sample and self.temperature <= 0:
            raise ValueError(f"{owner}.temperature={self.temperature} must be > 0 when do_sample=True")
