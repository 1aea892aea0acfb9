"""Tool-call parsers (`actor_rollout_ref.rollout.multi_turn.format`), a registry by name.

A parser turns the token ids of one assistant turn into `(content, calls)`: `content` is the text
with the call markup removed, `calls` the calls in order. A call that cannot be read (bad JSON, no
name, an unclosed tag) is returned with `error` set, never dropped: the loop answers it with an error
observation the model sees.

- `hermes`: ``<tool_call>{"name": "calculator", "arguments": {"expression": "347*85"}}</tool_call>``
  (Qwen2.5 / Hermes templates).
- `verl_toy`: ``<tool_call>calculator: 347*85</tool_call>``, the compact form the embedded tiny
  model is taught; the text after the colon is the tool's first required parameter.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from pydantic import BaseModel

__all__ = ["FunctionCall", "ToolParser", "HermesToolParser", "VerlToyToolParser"]


class FunctionCall(BaseModel):
    """One parsed call: `arguments` is JSON text; `error` says why the call is malformed (None if fine)."""

    name: str
    arguments: str
    error: str | None = None


class ToolParser:
    """Base parser. Register a subclass with `@ToolParser.register("name")`."""

    _registry: dict[str, type[ToolParser]] = {}

    def __init__(self, tokenizer, tool_schemas: list[dict] | None = None):
        self.tokenizer = tokenizer
        # name -> schema dict, for formats that need the parameter names
        self.tool_schemas = {s["function"]["name"]: s for s in (tool_schemas or [])}

    @classmethod
    def register(cls, name: str) -> Callable[[type], type]:
        def decorator(sub: type) -> type:
            cls._registry[name] = sub
            return sub

        return decorator

    @classmethod
    def get_tool_parser(cls, name: str, tokenizer, tool_schemas: list[dict] | None = None) -> ToolParser:
        if name not in cls._registry:
            raise ValueError(
                f"actor_rollout_ref.rollout.multi_turn.format={name!r} is not a registered tool parser; "
                f"registered: {sorted(cls._registry)}"
            )
        return cls._registry[name](tokenizer, tool_schemas)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    async def extract_tool_calls(self, responses_ids: list[int]) -> tuple[str, list[FunctionCall]]:
        return self.parse_text(self.decode(responses_ids))

    def parse_text(self, text: str) -> tuple[str, list[FunctionCall]]:
        raise NotImplementedError


class _TaggedParser(ToolParser):
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def parse_body(self, body: str) -> FunctionCall:
        raise NotImplementedError

    def parse_text(self, text: str) -> tuple[str, list[FunctionCall]]:
        calls: list[FunctionCall] = []
        pieces: list[str] = []
        pos = 0
        while True:
            start = text.find(self.open_tag, pos)
            if start < 0:
                pieces.append(text[pos:])
                break
            pieces.append(text[pos:start])
            end = text.find(self.close_tag, start + len(self.open_tag))
            if end < 0:
                body = text[start + len(self.open_tag) :]
                calls.append(
                    FunctionCall(
                        name="",
                        arguments=body.strip(),
                        error=f"malformed tool call: {self.open_tag} is never closed by {self.close_tag}",
                    )
                )
                break
            calls.append(self.parse_body(text[start + len(self.open_tag) : end]))
            pos = end + len(self.close_tag)
        return "".join(pieces).strip(), calls


@ToolParser.register("hermes")
class HermesToolParser(_TaggedParser):
    def parse_body(self, body: str) -> FunctionCall:
        try:
            obj = json.loads(body.strip())
        except json.JSONDecodeError as exc:
            return FunctionCall(
                name="",
                arguments=body.strip(),
                error=f"malformed tool call: invalid JSON ({exc.msg} at char {exc.pos})",
            )
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return FunctionCall(
                name="", arguments=body.strip(), error='malformed tool call: expected {"name": ..., "arguments": {...}}'
            )
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models emit the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return FunctionCall(
                    name=obj["name"], arguments=args, error="malformed tool call: arguments are not a JSON object"
                )
        if not isinstance(args, dict):
            return FunctionCall(
                name=obj["name"],
                arguments=json.dumps(args),
                error="malformed tool call: arguments are not a JSON object",
            )
        return FunctionCall(name=obj["name"], arguments=json.dumps(args, ensure_ascii=False))


_TOY_NAME = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:(.*)$", re.S)


@ToolParser.register("verl_toy")
class VerlToyToolParser(_TaggedParser):
    def parse_body(self, body: str) -> FunctionCall:
        m = _TOY_NAME.match(body)
        if not m:
            return FunctionCall(
                name="",
                arguments=body.strip(),
                error="malformed tool call: expected <tool_call>name: argument</tool_call>",
            )
        name, value = m.group(1), m.group(2).strip()
        schema = self.tool_schemas.get(name)
        if schema is None:
            # the loop reports the unknown name; the argument key does not matter then
            return FunctionCall(name=name, arguments=json.dumps({"input": value}))
        params = schema["function"].get("parameters", {}) or {}
        required = list(params.get("required") or []) or list((params.get("properties") or {}).keys())
        if not required:
            return FunctionCall(name=name, arguments="{}")
        return FunctionCall(name=name, arguments=json.dumps({required[0]: value}, ensure_ascii=False))
