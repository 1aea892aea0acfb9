"""Hugging Face model config (`actor_rollout_ref.model`, `critic.model`, `reward_model.model`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig


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
