"""Tool-call parsers (`actor_rollout_ref.rollout.multi_turn.format`), a registry by name.

A parser turns the token ids of one assistant turn into `(content, calls)`: `content` is the text
with the call markup removed, `calls` the calls in order. A call that cannot be read (bad JSON, no
name, an unclosed tag) is returned with `error` set, never dropped: the loop answers it with an error
observation the model sees.

- `hermes`: ``<tool_call>{"name": "calculator", "arguments": {"expression": "347*85"}}</tool_call>``
  (Qwen2.5 / Hermes templates).
- `verl_toy`: ``<tool_call>calculator: 347*85</tool_call>``, the compact form the embedded tiny
  model is taught; the text after the colon is the tool's first required parameter.
- `qwen3_coder` (`Qwen3XMLToolParser`): ``<tool_call><function=name><parameter=key>value
  </parameter></function></tool_call>`` (Qwen3-Coder / Qwen3.5); values are converted by the
  tool's parameter types (never evaluated as code).
- `kimi` (`KimiToolParser`): Kimi K2's ``<|tool_calls_section_begin|><|tool_call_begin|>ID
  <|tool_call_argument_begin|>{...}<|tool_call_end|>...`` special tokens; the model-emitted id
  is kept as `tool_call_id` and the tool name is read from it.
- `gpt-oss` (`GptOssToolParser`): the harmony format, ``<|start|>assistant<|channel|>commentary
  to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``; analysis (chain of thought)
  channels are ignored.

`extract_tool_calls(responses_ids, tools=None)` takes the tool schemas upstream's way (a list of
`OpenAIFunctionToolSchema` or dicts); when not given, those passed to the constructor are used.
A parser's `stop_token_ids` are the ids a turn must stop at for it to run (none by default); the
rollout worker adds them to the EOS ids of agent-loop generation.
"""

from __future__ import annotations

import ast
import json
import logging
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

logger = logging.getLogger(__name__)

__all__ = [
    "FunctionCall",
    "ToolParser",
    "HermesToolParser",
    "VerlToyToolParser",
    "Qwen3XMLToolParser",
    "KimiToolParser",
    "GptOssToolParser",
]


class FunctionCall(BaseModel):
    """One parsed call: `arguments` is JSON text; `tool_call_id` the id the model emitted for the
    call (formats that have one), echoed in the tool message that answers it; `error` says why
    the call is malformed (None if fine)."""

    name: str
    arguments: str
    tool_call_id: str | None = None
    error: str | None = None


def schema_dicts(tools) -> list[dict]:
    """Tool schemas as plain dicts (`OpenAIFunctionToolSchema` objects are dumped)."""
    out = []
    for t in tools or []:
        out.append(t if isinstance(t, dict) else t.model_dump(exclude_none=True))
    return out


class ToolParser:
    """Base parser. Register a subclass with `@ToolParser.register("name")`."""

    _registry: dict[str, type[ToolParser]] = {}

    def __init__(self, tokenizer, tool_schemas: list | None = None):
        self.tokenizer = tokenizer
        # name -> schema dict, for formats that need the parameter names
        self.tool_schemas = {s["function"]["name"]: s for s in schema_dicts(tool_schemas)}

    @property
    def stop_token_ids(self) -> list[int]:
        """Ids that must end a generation so the calls can be parsed (none: the model's EOS does)."""
        return []

    def schemas_for(self, tools) -> dict[str, dict]:
        """name -> schema dict of `tools` when given, else of the constructor's schemas."""
        if tools is None:
            return self.tool_schemas
        return {s["function"]["name"]: s for s in schema_dicts(tools)}

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

    async def extract_tool_calls(self, responses_ids: list[int], tools=None) -> tuple[str, list[FunctionCall]]:
        """(content, calls) of one assistant turn; `tools`: see the module docstring."""
        return self.parse_text(self.decode(responses_ids), self.schemas_for(tools))

    def parse_text(self, text: str, schemas: dict[str, dict] | None = None) -> tuple[str, list[FunctionCall]]:
        """(content, calls) of decoded text; `schemas`: name -> schema dict (default: the constructor's)."""
        raise NotImplementedError


class _TaggedParser(ToolParser):
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def parse_body(self, body: str, schemas: dict[str, dict]) -> FunctionCall:
        raise NotImplementedError

    def parse_text(self, text: str, schemas: dict[str, dict] | None = None) -> tuple[str, list[FunctionCall]]:
        schemas = self.tool_schemas if schemas is None else schemas
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
            calls.append(self.parse_body(text[start + len(self.open_tag) : end], schemas))
            pos = end + len(self.close_tag)
        return "".join(pieces).strip(), calls


@ToolParser.register("hermes")
class HermesToolParser(_TaggedParser):
    def parse_body(self, body: str, schemas: dict[str, dict]) -> FunctionCall:
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
    def parse_body(self, body: str, schemas: dict[str, dict]) -> FunctionCall:
        m = _TOY_NAME.match(body)
        if not m:
            return FunctionCall(
                name="",
                arguments=body.strip(),
                error="malformed tool call: expected <tool_call>name: argument</tool_call>",
            )
        name, value = m.group(1), m.group(2).strip()
        schema = schemas.get(name)
        if schema is None:
            # the loop reports the unknown name; the argument key does not matter then
            return FunctionCall(name=name, arguments=json.dumps({"input": value}))
        params = schema["function"].get("parameters", {}) or {}
        required = list(params.get("required") or []) or list((params.get("properties") or {}).keys())
        if not required:
            return FunctionCall(name=name, arguments="{}")
        return FunctionCall(name=name, arguments=json.dumps({required[0]: value}, ensure_ascii=False))


# ------------------------------------------------------------------------------ Qwen3 XML
def _convert_xml_value(value: str, param_type: str) -> Any:
    """A `<parameter>` text as the JSON-schema `param_type` says; a value that does not convert
    stays the string (the tool sees what the model wrote). Never evaluates code."""
    if value.lower() == "null":
        return None
    kind = param_type.strip().lower()
    if kind in ("string", "str", "text", "varchar", "char", "enum"):
        return value
    try:
        if kind.startswith(("int", "uint", "long", "short", "unsigned")):
            return int(value)
        if kind.startswith(("num", "float")):
            number = float(value)
            return int(number) if number.is_integer() else number
    except ValueError:
        return value
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    if kind == "object" or kind.startswith("dict"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            pass
    try:
        return ast.literal_eval(value)  # literals only (lists, dicts, numbers): model output is untrusted
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


_XML_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*?)$", re.S)
_XML_FUNCTION = re.compile(r"<function=(.*?)</function>|<function=(.*)$", re.S)
_XML_PARAMETER = re.compile(r"<parameter=(.*?)</parameter>|<parameter=(.*?)$", re.S)


@ToolParser.register("qwen3_coder")
class Qwen3XMLToolParser(ToolParser):
    """``<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>``."""

    tool_call_start_token = "<tool_call>"

    def _parse_xml_function_call(self, function_call_str: str, tools) -> FunctionCall | None:
        """One call from the text after ``<function=`` (``NAME>...parameters``); None when the
        header has no ``>`` (a truncated call cannot be recovered). A parameter without ``>`` is
        skipped; the others are kept."""
        end = function_call_str.find(">")
        if end < 0:
            logger.warning("skipping a function call without '>' after its name: %r", function_call_str[:80])
            return None
        name = function_call_str[:end]
        schema = self.schemas_for(tools if tools is not None else []).get(name)
        properties = ((schema or {}).get("function", {}).get("parameters") or {}).get("properties") or {}
        arguments = {}
        for closed, open_ended in _XML_PARAMETER.findall(function_call_str[end + 1 :]):
            text = closed or open_ended
            sep = text.find(">")
            if sep < 0:
                continue
            key, value = text[:sep], text[sep + 1 :]
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            spec = properties.get(key)
            param_type = str(spec.get("type", "string")) if isinstance(spec, dict) else "string"
            arguments[key] = _convert_xml_value(value, param_type) if spec is not None else value
        return FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))

    def parse_text(self, text: str, schemas: dict[str, dict] | None = None) -> tuple[str, list[FunctionCall]]:
        if self.tool_call_start_token not in text:
            return text, []
        bodies = [closed or open_ended for closed, open_ended in _XML_CALL.findall(text)] or [text]
        functions = [a or b for body in bodies for a, b in _XML_FUNCTION.findall(body)]
        tools = list((self.tool_schemas if schemas is None else schemas).values())
        calls = []
        for function_str in functions:
            call = self._parse_xml_function_call(function_str, tools)
            calls.append(
                call
                if call is not None
                else FunctionCall(name="", arguments=function_str, error="malformed tool call: no '>' after the name")
            )
        return text[: text.find(self.tool_call_start_token)], calls


# ------------------------------------------------------------------------------ Kimi K2
_KIMI_CALL = re.compile(r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.S)


@ToolParser.register("kimi")
class KimiToolParser(ToolParser):
    """Kimi K2's tool-call section of special tokens; the call id (e.g. ``functions.get_weather:0``)
    names the tool and is kept as `tool_call_id`."""

    section_start = "<|tool_calls_section_begin|>"
    im_end_token = "<|im_end|>"

    @property
    def stop_token_ids(self) -> list[int]:
        token_id = self.tokenizer.convert_tokens_to_ids(self.im_end_token)
        return [token_id] if isinstance(token_id, int) and token_id >= 0 else []

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)  # the markup is special tokens

    @staticmethod
    def _infer_tool_name(raw_name: str, arguments: dict, schemas: dict[str, dict]) -> str:
        """The tool a call id refers to: an exact name, else the one tool whose name the id
        contains, else the one tool whose required parameters the arguments cover; else the id."""
        if not schemas or raw_name in schemas:
            return raw_name
        compact = raw_name.lower().replace("-", "_")
        contained = [n for n in schemas if n.lower() in compact]
        if len(contained) == 1:
            return contained[0]
        covered = [
            n
            for n, s in schemas.items()
            if (req := set((s["function"].get("parameters") or {}).get("required") or [])) and req <= set(arguments)
        ]
        return covered[0] if len(covered) == 1 else raw_name

    def parse_text(self, text: str, schemas: dict[str, dict] | None = None) -> tuple[str, list[FunctionCall]]:
        if self.section_start not in text:
            return text, []
        schemas = self.tool_schemas if schemas is None else schemas
        calls = []
        for raw_id, raw_args in _KIMI_CALL.findall(text):
            raw_id = raw_id.strip()
            try:
                arguments = json.loads(raw_args.strip())
                error = None if isinstance(arguments, dict) else "malformed tool call: arguments are not a JSON object"
            except json.JSONDecodeError as exc:
                arguments, error = None, f"malformed tool call: invalid JSON ({exc.msg} at char {exc.pos})"
            name = self._infer_tool_name(raw_id, arguments if isinstance(arguments, dict) else {}, schemas)
            args_text = json.dumps(arguments, ensure_ascii=False) if error is None else raw_args.strip()
            calls.append(FunctionCall(name=name, arguments=args_text, tool_call_id=raw_id, error=error))
        return text[: text.find(self.section_start)], calls


# ------------------------------------------------------------------------------ gpt-oss (harmony)
_HARMONY_COT = re.compile(r"(?:<\|start\|>assistant)?<\|channel\|>analysis<\|message\|>.*?<\|end\|>", re.S)
_HARMONY_CALL = re.compile(
    r"<\|start\|>assistant<\|channel\|>[^<]* to=functions\.([^<\s]+) ?<\|constrain\|>json<\|message\|>(.*?)<\|call\|>",
    re.S,
)


@ToolParser.register("gpt-oss")
class GptOssToolParser(ToolParser):
    """gpt-oss's harmony format; the arguments are passed on as the model wrote them (the loop
    answers invalid JSON with an observation)."""

    def decode(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        pad = getattr(self.tokenizer, "pad_token", None)
        return text.replace(pad, "") if pad else text

    def parse_text(self, text: str, schemas: dict[str, dict] | None = None) -> tuple[str, list[FunctionCall]]:
        text = _HARMONY_COT.sub("", text)  # a thought may mention calls that are not calls
        calls = [FunctionCall(name=name, arguments=args) for name, args in _HARMONY_CALL.findall(text)]
        return (_HARMONY_CALL.sub("", text), calls) if calls else (text, [])
