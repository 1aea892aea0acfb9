"""Hugging Face model config (`actor_rollout_ref.model`, `critic.model`, `reward_model.model`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig, check_range


@dataclass
class LoraConfig(BaseConfig):
    """`model.lora`: how a LoRA policy reaches the rollout engine. (Upstream's Megatron engine keeps
    its whole LoRA config here: `lora.rank`, `lora.alpha`, ...; the FSDP keys are `model.lora_rank`,
    `model.lora_alpha`, ..., and only `merge` is read from this section.)

    - `merge`: False (default): the hf rollout generates with the adapter model itself (the actor's
      own module, no copy); True: the rollout engine gets merged weights W + (alpha/r) B A (for hf
      this means a separate, unsharded copy). vLLM always gets merged weights here (vLLM's own
      LoRA path is not implemented).
    """

    merge: bool = False


@dataclass
class HFModelConfig(BaseConfig):
    """Where a model comes from and how it is built.

    `path: null` selects the embedded default (the tiny model shipped with verl, see
    `verl.utils.embedded_default`). `external_lib` is a module path or .py file imported in every
    process before the model is built (e.g. a file that registers a policy loss).
    """

    path: str | None = None
    tokenizer_path: str | None = None  # default: same as path
    # reward model only: tokenizer of the policy, used to decode responses before re-encoding them
    # with the reward model's own tokenizer/chat template when the two differ
    input_tokenizer: str | None = None
    custom_chat_template: str | None = None
    external_lib: str | None = None
    override_config: dict[str, Any] = field(default_factory=dict)
    enable_gradient_checkpointing: bool = False
    use_remove_padding: bool = True  # pack sequences (no compute on padding) in log-prob and update passes
    trust_remote_code: bool | None = False  # null (upstream's reward_model.model default) = False
    # upstream scripts append it with `+`; master weights here are fsdp_config.model_dtype
    torch_dtype: str | None = None
    # LoRA (peft) on the FSDP engine: lora_rank > 0 or a lora_adapter_path turns it on; the base
    # weights are frozen and only the adapter (plus a critic's value head) is trained
    lora_rank: int = 0  # rank r of the adapter; 0 = full fine-tuning
    lora_alpha: int = 16  # scale of the update: alpha / r
    # "all-linear" (every linear layer but the output head) or a list of module names
    target_modules: Any = "all-linear"
    exclude_modules: Any = None  # module names (list) or a regex (str) left without an adapter
    # a peft adapter directory to continue training (its rank/alpha/targets are used)
    lora_adapter_path: str | None = None
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self):
        check_range("model", "lora_rank", self.lora_rank, low=0)
        check_range("model", "lora_alpha", self.lora_alpha, low=0, low_open=True)
        _check_module_names("target_modules", self.target_modules, allow_none=False)
        _check_module_names("exclude_modules", self.exclude_modules, allow_none=True)

    @property
    def use_lora(self) -> bool:
        """True when the model is trained through a peft LoRA adapter."""
        return self.lora_rank > 0 or self.lora_adapter_path is not None


def _check_module_names(key: str, value: Any, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, str):
        return
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return
    raise ValueError(f"model.{key}={value!r} must be a string (e.g. 'all-linear' or a regex) or a list of module names")
