"""Multi-turn, tool-using rollouts (upstream's `verl.experimental.agent_loop`). See docs/agent_loop.md."""

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    AgentLoopWorker,
    get_agent_loop_class,
    register,
)
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

__all__ = [
    "AgentLoopBase",
    "AgentLoopMetrics",
    "AgentLoopOutput",
    "AgentLoopWorker",
    "SingleTurnAgentLoop",
    "ToolAgentLoop",
    "get_agent_loop_class",
    "register",
]
