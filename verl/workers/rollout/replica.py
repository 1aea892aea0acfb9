"""What a generation server returns for one request (upstream's `verl.workers.rollout.replica`).

Upstream's module also holds the server replicas of its vLLM/SGLang server mode
(`RolloutReplica`, `RolloutMode`, the replica registry), which this project does not have: its
generation servers are in-process (`verl.workers.rollout.async_server`). The agent loops import
`TokenOutput` from here, as upstream's do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["TokenOutput"]


@dataclass
class TokenOutput:
    """One generated turn.

    `token_ids`: the generated ids (EOS included when the turn ended there); `log_probs`: the
    sampler's log-prob of each (None when not computed); `stop_reason`: `"eos"` (the model ended
    the turn) or `"length"` (cut at `max_tokens`); the servers here always set it. Upstream's
    fields `routed_experts` (expert ids per token of a MoE rollout), `num_preempted` (times the
    request was preempted) and `extra_fields` are kept for servers that fill them.
    """

    token_ids: list[int]
    log_probs: list[float] | None = None
    stop_reason: str | None = "eos"
    routed_experts: Any = None
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)
