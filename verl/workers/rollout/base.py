"""The rollout interface and the registry of rollout engines (`actor_rollout_ref.rollout.name`).

A rollout engine turns left-padded prompts into responses (`generate_sequences`). Engines that
hold their own copy of the policy weights (vLLM, or the hf engine with a separate copy) receive the
actor's full state dict through `update_weights` after each update; the worker then checks the
copy with a probe sequence (`probe_log_probs`) against the actor's own log-probabilities and raises
when they disagree. `release` / `resume` free and restore engine memory between phases.

Registering an engine::

    @register_rollout("mine")
    class MyRollout(BaseRollout): ...

and `actor_rollout_ref.rollout.name=mine` selects it (the module must be imported in the worker,
e.g. through `actor_rollout_ref.model.external_lib`).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

import torch

__all__ = ["BaseRollout", "register_rollout", "get_rollout_class", "ROLLOUT_REGISTRY", "logprob_temperature"]

ROLLOUT_REGISTRY: dict[str, type | str] = {
    # built-in engines are imported lazily so that `vllm` is only imported when selected
    "hf": "verl.workers.rollout.hf_rollout:HFRollout",
    "vllm": "verl.workers.rollout.vllm_rollout:vLLMRollout",
}


def register_rollout(name: str) -> Callable[[type], type]:
    """Class decorator: make a rollout engine selectable as `rollout.name=<name>`."""

    def decorator(cls: type) -> type:
        existing = ROLLOUT_REGISTRY.get(name)
        if existing is not None and not isinstance(existing, str) and existing.__qualname__ != cls.__qualname__:
            raise ValueError(f"rollout {name!r} is already registered to {existing.__module__}.{existing.__qualname__}")
        ROLLOUT_REGISTRY[name] = cls
        return cls

    return decorator


def get_rollout_class(name: str) -> type:
    """The engine class registered as `name` (imported on first use)."""
    if name not in ROLLOUT_REGISTRY:
        raise ValueError(
            f"actor_rollout_ref.rollout.name={name!r} is not a registered rollout; registered: "
            f"{sorted(ROLLOUT_REGISTRY)}"
        )
    entry = ROLLOUT_REGISTRY[name]
    if isinstance(entry, str):
        module_name, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module_name), attr)
        ROLLOUT_REGISTRY[name] = entry
    return entry


class BaseRollout(ABC):
    """A generation engine.

    Args:
        config: the rollout config (`verl.workers.config.RolloutConfig`).
    """

    def __init__(self, config):
        self.config = config

    @abstractmethod
    def generate_sequences(self, prompts):
        """Generate one response per prompt row.

        Args:
            prompts: DataProto with `input_ids`, `attention_mask`, `position_ids` [b, P]
                (left-padded) and meta_info `eos_token_id`, `pad_token_id`, optionally
                `do_sample`, `validate`, `temperature`, `top_p`, `top_k`, `response_length`.
        Returns:
            DataProto with `prompts` [b, P], `responses` [b, R], `response_mask` [b, R],
            `input_ids` / `attention_mask` / `position_ids` [b, P + R] and `rollout_log_probs`
            [b, R] (when `calculate_log_probs`).
        """

    # weights ---------------------------------------------------------------------------------

    def shares_weights_with(self, module: torch.nn.Module) -> bool:
        """True when the engine generates with `module` itself (no synchronisation needed)."""
        return False

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | dict[str, torch.Tensor]) -> None:
        """Load the policy's full weights (names as in the Hugging Face state dict). Must raise
        when a name or shape does not match the engine's model."""
        raise NotImplementedError(f"{type(self).__name__} does not accept weight updates")

    def probe_log_probs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, responses: torch.Tensor
    ) -> torch.Tensor:
        """Log-probs [b, R] of `responses` (the last R columns of `input_ids`) computed by the
        engine's own weights at temperature 1; used to verify a weight synchronisation."""
        raise NotImplementedError(f"{type(self).__name__} cannot score a probe sequence")

    # memory ----------------------------------------------------------------------------------

    # release/resume are optional hooks, not abstract: an engine that holds no freeable memory
    # (e.g. hf) keeps these no-op defaults
    def release(self) -> None:  # noqa: B027
        """Free engine memory (weights / KV cache) while training runs. Default: nothing to free."""

    def resume(self) -> None:  # noqa: B027
        """Restore what `release` freed before the next generation."""


def logprob_temperature(temperature) -> float:
    """The T of the distribution softmax(logits / T) that log-probs are reported under.

    `temperature` when > 0; 1.0 for None / 0 (greedy decoding configured as `temperature=0`).
    The hf rollout and the learner (`DataParallelPPOActor`) both use it, so that rollout, old and
    current log-probs are of the same distribution.
    """
    return float(temperature) if temperature is not None and float(temperature) > 0 else 1.0


def eos_id_list(eos_token_id) -> list[int]:
    """`eos_token_id` (int, list or None) as a list of ints."""
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, int):
        return [eos_token_id]
    if isinstance(eos_token_id, torch.Tensor):
        return [int(x) for x in eos_token_id.reshape(-1).tolist()]
    return [int(x) for x in eos_token_id]


def assemble_rollout_output(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_pos: torch.Tensor,
    responses: torch.Tensor,
    log_probs: torch.Tensor | None,
    eos_ids: list[int],
    pad_token_id: int,
    ignore_eos: bool = False,
):
    """Build the rollout output DataProto from generated tokens (shared by the engines).

    Args:
        prompt_ids / prompt_mask / prompt_pos: [b, P] left-padded prompts.
        responses: [b, R] generated ids, right-padded with anything after the end.
        log_probs: [b, R] log-probs of the generated tokens under the sampling distribution.
        eos_ids: ids that end a response; the first one generated is kept (mask 1) and every
            later position becomes `pad_token_id` with mask 0. A response without one is
            truncated at R (mask 1 everywhere).
    """
    from verl.protocol import DataProto
    from verl.utils.torch_functional import get_response_mask

    if ignore_eos or not eos_ids:
        response_mask = torch.ones_like(responses, dtype=prompt_mask.dtype)
        # engines pad finished rows with pad ids only when they stop at EOS; nothing to mask here
    else:
        response_mask = get_response_mask(responses, eos_ids, dtype=prompt_mask.dtype)
    pad = torch.full_like(responses, pad_token_id)
    responses = torch.where(response_mask.bool(), responses, pad)
    resp_len = responses.shape[1]
    delta = torch.arange(1, resp_len + 1, device=prompt_pos.device, dtype=prompt_pos.dtype).unsqueeze(0)
    response_pos = prompt_pos[:, -1:] + delta
    tensors = {
        "prompts": prompt_ids,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "position_ids": torch.cat([prompt_pos, response_pos], dim=1),
    }
    if log_probs is not None:
        tensors["rollout_log_probs"] = torch.where(
            response_mask.bool(), log_probs.float(), torch.zeros((), dtype=torch.float32)
        )
    return DataProto.from_dict(tensors=tensors)
