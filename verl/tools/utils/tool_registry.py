"""Upstream's import path for the tool loader (`verl.tools.utils.tool_registry`)."""

from verl.tools.tool_registry import get_tool_class, initialize_tools_from_config, load_all_tools

__all__ = ["get_tool_class", "initialize_tools_from_config", "load_all_tools"]
