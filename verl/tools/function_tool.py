"""`@function_tool`: a plain typed Python function as a tool.

The function needs a type hint on every parameter and a Google-style docstring with an `Args:`
block; its OpenAI schema is built by `transformers.utils.get_json_schema` when it is decorated (a
missing hint or description fails there, at import time, not mid-rollout)::

    from verl.tools.function_tool import function_tool

    @function_tool
    def calculator(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: digits, + - * / and parentheses, e.g. "347*85".
        '''
        ...

The file is named by `actor_rollout_ref.rollout.multi_turn.function_tool_path`; loading it
registers its tools. A function may be `async`; a sync one runs in a worker thread so that it does
not block other trajectories. It returns a str, a dict (sent as JSON), a `ToolResponse`, or a tuple
`(response, reward)` / `(response, reward, metrics)`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

logger = logging.getLogger(__name__)

__all__ = [
    "FUNCTION_TOOL_REGISTRY",
    "FunctionTool",
    "function_tool",
    "get_function_tool",
    "load_function_tools_from_path",
    "normalize_function_tool_return",
]

# name -> tool, written by @function_tool. Process-wide on purpose (as upstream's): decorating a
# function is a registration that any later loader of the same file must see.
FUNCTION_TOOL_REGISTRY: dict[str, FunctionTool] = {}
# absolute file path -> the tools that executing it registered. A cache only: it never decides
# what a caller gets (each call returns a new list; an entry whose tools are no longer the
# registered ones, e.g. after FUNCTION_TOOL_REGISTRY.clear(), is executed again).
_LOADED_FUNCTION_TOOL_PATHS: dict[str, list[FunctionTool]] = {}


@dataclass
class FunctionTool:
    """A registered function: what the agent loop needs to show and call it.

    Not a `BaseTool`: a function tool is stateless (no create / release per trajectory), and the
    tool agent loop tells the two apart with `isinstance(tool, FunctionTool)`.
    `name` equals `tool_schema.function.name`; `is_async` says whether `fn` is a coroutine function.
    """

    name: str
    fn: Callable[..., Any]
    tool_schema: OpenAIFunctionToolSchema
    is_async: bool = False

    async def call(self, parameters: dict[str, Any]) -> Any:
        """`fn(**parameters)`; a sync function runs in a worker thread (other trajectories go on)."""
        if self.is_async:
            return await self.fn(**parameters)
        return await asyncio.to_thread(self.fn, **parameters)


def _schema_from_signature(fn: Callable, name: str) -> OpenAIFunctionToolSchema:
    from transformers.utils import get_json_schema

    variadic = [
        p.name for p in inspect.signature(fn).parameters.values() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if variadic:
        raise ValueError(
            f"@function_tool {name!r}: variadic parameter(s) {variadic} have no JSON schema; declare named, "
            "typed parameters"
        )
    raw = get_json_schema(fn)
    raw["function"]["name"] = name
    return OpenAIFunctionToolSchema.model_validate(raw)


def function_tool(name: str | Callable | None = None, *, schema: OpenAIFunctionToolSchema | dict | None = None):
    """Register `fn` as a tool (bare `@function_tool` or `@function_tool("other_name")`).

    `schema` replaces the inferred schema. A second function under an already registered name
    raises ValueError (names are unique). Returns the function unchanged.
    """

    def make(tool_name: str | None):
        def decorator(fn: Callable) -> Callable:
            final = tool_name or fn.__name__
            if isinstance(schema, OpenAIFunctionToolSchema):
                built = schema
            elif isinstance(schema, dict):
                built = OpenAIFunctionToolSchema.model_validate(schema)
            else:
                built = _schema_from_signature(fn, final)
            existing = FUNCTION_TOOL_REGISTRY.get(final)
            if existing is not None and (existing.fn.__module__, existing.fn.__qualname__) != (
                fn.__module__,
                fn.__qualname__,
            ):
                raise ValueError(
                    f"function tool {final!r} is already registered to "
                    f"{existing.fn.__module__}.{existing.fn.__qualname__}; "
                    f"tool names must be unique (rename {fn.__module__}.{fn.__qualname__})"
                )
            FUNCTION_TOOL_REGISTRY[final] = FunctionTool(final, fn, built, inspect.iscoroutinefunction(fn))
            return fn

        return decorator

    if callable(name):
        return make(None)(name)
    return make(name)


def get_function_tool(name: str) -> FunctionTool:
    if name not in FUNCTION_TOOL_REGISTRY:
        raise KeyError(
            f"function tool {name!r} is not registered; registered: {sorted(FUNCTION_TOOL_REGISTRY)} "
            "(is its file named by actor_rollout_ref.rollout.multi_turn.function_tool_path?)"
        )
    return FUNCTION_TOOL_REGISTRY[name]


def _cached_tools(abs_path: str) -> list[FunctionTool] | None:
    """The tools `abs_path` registered when it was executed, if they are all still registered."""
    tools = _LOADED_FUNCTION_TOOL_PATHS.get(abs_path)
    if tools is None or any(FUNCTION_TOOL_REGISTRY.get(t.name) is not t for t in tools):
        return None
    return list(tools)


def load_function_tools_from_path(path: str) -> list[FunctionTool]:
    """Execute the Python file `path` and return the tools it registered (in name order).

    A file is executed once per process: a second call returns the same tool objects (executing
    it again would register new function objects under the same names). A file without any
    `@function_tool` gives [] and a warning.
    """
    abs_path = os.path.abspath(path)
    if not os.path.isfile(abs_path):
        raise FileNotFoundError(
            f"function_tool_path does not exist: {path!r} (actor_rollout_ref.rollout.multi_turn.function_tool_path)"
        )
    cached = _cached_tools(abs_path)
    if cached is not None:
        return cached
    before = set(FUNCTION_TOOL_REGISTRY)
    # a name derived from the path: the file can import its siblings through sys.modules
    module_name = "_verl_function_tools_" + abs_path.replace(os.sep, "_").replace(".", "_")
    spec = importlib.util.spec_from_file_location(module_name, abs_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"function_tool_path={path!r} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    tools = [FUNCTION_TOOL_REGISTRY[n] for n in sorted(set(FUNCTION_TOOL_REGISTRY) - before)]
    if not tools:
        logger.warning(
            "function_tool_path %r loaded but no @function_tool decorators found: the file adds no tool", path
        )
    _LOADED_FUNCTION_TOOL_PATHS[abs_path] = tools
    return list(tools)


def _as_response(value: Any) -> ToolResponse:
    if isinstance(value, ToolResponse):
        return value
    if isinstance(value, dict):
        return ToolResponse(text=json.dumps(value, ensure_ascii=False))
    return ToolResponse(text=value if isinstance(value, str) else str(value))


def normalize_function_tool_return(ret: Any) -> tuple[ToolResponse, float, dict]:
    """A function's return value as (ToolResponse, reward, metrics); see the module docstring.
    A tuple of length 0 or > 3 raises TypeError (an authoring bug, never stringified)."""
    if isinstance(ret, tuple):
        if not 1 <= len(ret) <= 3:
            raise TypeError(
                f"a @function_tool return tuple must have length 1, 2, or 3 (got length {len(ret)}: {ret!r}); "
                "use (response,), (response, reward) or (response, reward, metrics)"
            )
        reward = 0.0 if len(ret) < 2 or ret[1] is None else float(ret[1])
        metrics = {} if len(ret) < 3 or ret[2] is None else dict(ret[2])
        return _as_response(ret[0]), reward, metrics
    return _as_response(ret), 0.0, {}
