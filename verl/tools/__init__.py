"""Tools for multi-turn rollouts: `BaseTool` classes (declared in a tool config yaml) and
`@function_tool` functions (`verl.tools.function_tool`). See docs/agent_loop.md.

The package binds no name of a submodule to anything else: `verl.tools.function_tool` is the
module (import the decorator from it: `from verl.tools.function_tool import function_tool`).
"""

from verl.tools.base_tool import BaseTool
from verl.tools.function_tool import FunctionTool
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
    "OpenAIFunctionCallSchema",
    "OpenAIFunctionParsedSchema",
    "OpenAIFunctionToolSchema",
    "ToolResponse",
    "initialize_tools_from_config",
    "load_all_tools",
]
