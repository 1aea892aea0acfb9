"""`BaseTool`: a stateful tool with one instance per trajectory.

Life cycle in the tool agent loop, for each trajectory that may call the tool::

    instance_id, _ = await tool.create(instance_id=None, **tools_kwargs[name].get("create_kwargs", {}))
    response, step_reward, metrics = await tool.execute(instance_id, arguments, **execute_kwargs)  # per call
    reward = await tool.calc_reward(instance_id, **calc_reward_kwargs)                             # optional
    await tool.release(instance_id, **release_kwargs)                                               # always

`tools_kwargs` comes from the sample's `extra_info.tools_kwargs` (keyed by tool name). Tools are
declared in a yaml file (`actor_rollout_ref.rollout.multi_turn.tool_config_path`)::

    tools:
      - class_name: verl.tools.calculator_tool.CalculatorTool
        config: {type: native}
        tool_schema: {type: function, function: {name: calculator, description: ..., parameters: ...}}
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BaseTool"]


class BaseTool:
    """Subclass and override `execute` (and `create` / `calc_reward` / `release` when the tool
    keeps per-trajectory state).

    Args:
        config: the tool's `config` mapping from the yaml (`type: native` plus the tool's own keys).
        tool_schema: the OpenAI function schema; None lets a subclass supply it by overriding
            `get_openai_tool_schema`.
    """

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        self.config = dict(config or {})
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(
                f"{type(self).__name__} has no tool_schema: give one in the tool config yaml or override "
                "get_openai_tool_schema"
            )
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        return getattr(self, "tool_schema", None)

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        """Start an instance for one trajectory; returns its id and an (optional) first observation."""
        return instance_id or str(uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """Run one call. Returns (observation, step reward, metrics)."""
        raise NotImplementedError(f"{type(self).__name__}.execute is not implemented")

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        """A reward from the instance's state (0.0 by default)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        """Free the instance's state."""
