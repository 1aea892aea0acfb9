"""Load the tools of a run: `BaseTool` classes from a tool config yaml plus `@function_tool`
functions from a Python file; names must be unique across both."""

from __future__ import annotations

import importlib
import logging
from enum import Enum

from verl.tools.base_tool import BaseTool
from verl.tools.function_tool import FunctionTool, load_function_tools_from_path
from verl.tools.schemas import OpenAIFunctionToolSchema

logger = logging.getLogger(__name__)

__all__ = ["ToolType", "get_tool_class", "initialize_tools_from_config", "load_all_tools"]


class ToolType(Enum):
    """`config.type` of a tool in the tool config yaml (MCP tools are not supported)."""

    NATIVE = "native"


TOOL_TYPES = tuple(t.value for t in ToolType)


def get_tool_class(cls_name: str) -> type:
    """`pkg.module.ClassName` (or `path/to/file.py:ClassName`) -> the class."""
    if ".py:" in cls_name:
        from verl.utils.import_utils import load_extern_type

        path, _, attr = cls_name.rpartition(":")
        return load_extern_type(path, attr)
    module_name, _, attr = cls_name.rpartition(".")
    if not module_name:
        raise ValueError(f"tool class_name={cls_name!r} must be a dotted path pkg.module.ClassName")
    module = importlib.import_module(module_name)
    if not hasattr(module, attr):
        raise ValueError(f"tool class_name={cls_name!r}: module {module_name} has no {attr!r}")
    return getattr(module, attr)


def initialize_tools_from_config(tools_config_file: str) -> list[BaseTool]:
    """Instantiate every entry of `tools:` in the yaml file."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(tools_config_file), resolve=True) or {}
    entries = cfg.get("tools")
    if not isinstance(entries, list):
        raise ValueError(f"{tools_config_file}: expected a top-level 'tools:' list, got {type(entries).__name__}")
    tools: list[BaseTool] = []
    for i, entry in enumerate(entries):
        where = f"{tools_config_file}: tools[{i}]"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ValueError(f"{where} needs a class_name (and config: {{type: native}}, tool_schema)")
        config = dict(entry.get("config") or {})
        kind = config.get("type", "native")
        if kind not in TOOL_TYPES:
            raise ValueError(f"{where}.config.type={kind!r} is not supported; expected one of {list(TOOL_TYPES)}")
        schema = entry.get("tool_schema")
        schema = OpenAIFunctionToolSchema.model_validate(schema) if schema is not None else None
        cls = get_tool_class(entry["class_name"])
        if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
            raise TypeError(f"{where}.class_name={entry['class_name']!r} is not a BaseTool subclass")
        tools.append(cls(config=config, tool_schema=schema))
    return tools


def load_all_tools(tool_config_path: str | None, function_tool_path: str | None) -> list[BaseTool | FunctionTool]:
    """The yaml's `BaseTool`s (new instances on every call) followed by the file's
    `FunctionTool`s (the same objects on every call); [] when neither path is set.

    Tool names are unique across both sources: the names used twice raise one ValueError
    listing all of them."""
    tools: list[BaseTool | FunctionTool] = (
        list(initialize_tools_from_config(tool_config_path)) if tool_config_path else []
    )
    if function_tool_path:
        tools += load_function_tools_from_path(function_tool_path)
    seen: dict[str, int] = {}
    for t in tools:
        seen[t.name] = seen.get(t.name, 0) + 1
    dup = sorted(n for n, c in seen.items() if c > 1)
    if dup:
        raise ValueError(
            f"tool name(s) {dup} collide: declared more than once across "
            f"multi_turn.tool_config_path={tool_config_path!r} and multi_turn.function_tool_path="
            f"{function_tool_path!r}; each tool name must be unique, rename one of them"
        )
    logger.info("loaded %d tool(s): %s", len(tools), [t.name for t in tools])
    return tools
