"""Tools for multi-turn rollouts: `BaseTool` classes (declared in a tool config yaml) and
`@function_tool` functions. See docs/agent_loop.md."""

from verl.tools.base_tool import BaseTool
from verl.tools.function_tool import FunctionTool, function_tool
from verl.tools.schemas import (
    OpenAIFunctionCallSchema,
    OpenAIFunctionParsedSchema,
    OpenAIFunctionToolSchema,
    ToolResponse,
)
from verl.tools.tool_registry import initialize_tools_from_config, load_all_tools

__all__ = [
    "BaseTool",
    "FunctionTool",
    "function_tool",
    "OpenAIFunctionCallSchema",
    "OpenAIFunctionParsedSchema",
    "OpenAIFunctionToolSchema",
    "ToolResponse",
    "initialize_tools_from_config",
    "load_all_tools",
]
