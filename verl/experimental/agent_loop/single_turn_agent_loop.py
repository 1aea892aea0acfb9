"""`single_turn_agent`: one assistant turn on the prompt (the default loop)."""

from __future__ import annotations

import time
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    new_request_id,
    register,
)

__all__ = ["SingleTurnAgentLoop"]


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """Renders `raw_prompt` (or takes `raw_prompt_ids` when the batch has no raw chat) and generates
    up to `rollout.response_length` tokens."""

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        if kwargs.get("raw_prompt") is not None:
            prompt_ids = self.renderer.prompt_ids(list(kwargs["raw_prompt"]))
        elif kwargs.get("raw_prompt_ids") is not None:
            prompt_ids = [int(x) for x in kwargs["raw_prompt_ids"]]
        else:
            raise KeyError(
                "single_turn_agent needs 'raw_prompt' (data.return_raw_chat=True) or 'raw_prompt_ids' in the batch"
            )
        start = time.perf_counter()
        out = await self.server_manager.generate(
            new_request_id(),
            prompt_ids=prompt_ids,
            sampling_params={**sampling_params, "max_tokens": int(self.rollout_config.response_length)},
        )
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=list(out.token_ids),
            response_mask=[1] * len(out.token_ids),
            response_logprobs=list(out.log_probs) if out.log_probs is not None else None,
            num_turns=2,
            metrics=AgentLoopMetrics(generate_sequences=time.perf_counter() - start),
            extra_fields={
                "turn_scores": [],
                "tool_rewards": [],
                "assistant_turns": 1,
                "cut_by_length": out.stop_reason == "length",
                "trace": {"turns": 1, "tool_calls": [], "stop_reason": out.stop_reason},
            },
        )
