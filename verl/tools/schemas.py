"""Tool schemas in the OpenAI function-calling format, and what a tool returns.

`OpenAIFunctionToolSchema` is the `tool_schema` entry of a tool config yaml and what chat templates
receive as `tools=[...]`; `OpenAIFunctionCallSchema` is one parsed call (name + decoded arguments);
`ToolResponse` is a tool's observation (text only here: multimodal results are not supported).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

__all__ = [
    "OpenAIFunctionPropertySchema",
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolSchema",
    "OpenAIFunctionParsedSchema",
    "OpenAIFunctionCallSchema",
    "OpenAIFunctionToolCall",
    "ToolResponse",
]


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter: JSON-schema `type`, `description`, optional `enum` (other keys kept)."""

    model_config = {"extra": "allow"}
    type: str | list[str] | None = None
    description: str | None = None
    enum: list[Any] | None = None


class OpenAIFunctionParametersSchema(BaseModel):
    type: str = "object"
    properties: dict[str, OpenAIFunctionPropertySchema] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(BaseModel):
    name: str
    description: str = ""
    parameters: OpenAIFunctionParametersSchema = Field(default_factory=OpenAIFunctionParametersSchema)
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """`{"type": "function", "function": {"name", "description", "parameters"}}`."""

    type: Literal["function"] = "function"
    function: OpenAIFunctionSchema


class OpenAIFunctionParsedSchema(BaseModel):
    """A call as the parser found it: `arguments` is the raw JSON text."""

    name: str
    arguments: str


class OpenAIFunctionCallSchema(BaseModel):
    """A call with decoded arguments."""

    name: str
    arguments: dict[str, Any]

    @staticmethod
    def from_openai_function_parsed_schema(parsed: OpenAIFunctionParsedSchema) -> tuple[OpenAIFunctionCallSchema, bool]:
        """Decode `parsed.arguments`; returns (call, has_decode_error). A decode error or a
        non-object JSON gives empty arguments and True."""
        try:
            args = json.loads(parsed.arguments) if parsed.arguments.strip() else {}
        except json.JSONDecodeError:
            return OpenAIFunctionCallSchema(name=parsed.name, arguments={}), True
        if not isinstance(args, dict):
            return OpenAIFunctionCallSchema(name=parsed.name, arguments={}), True
        return OpenAIFunctionCallSchema(name=parsed.name, arguments=args), False


class OpenAIFunctionToolCall(BaseModel):
    """A call in the OpenAI chat format: `{"id", "type": "function", "function": {name, arguments}}`."""

    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionCallSchema


class ToolResponse(BaseModel):
    """A tool's observation. Only `text` is supported by the tool agent loop here (an image or
    video raises there); `image` / `video` are lists, as upstream's."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def initialize_request(cls, values):
        """A single image or video (not in a list) is refused with the fix in the message."""
        if isinstance(values, dict):
            for key in ("image", "video"):
                if values.get(key) is not None and not isinstance(values[key], list):
                    raise ValueError(
                        f"ToolResponse.{key} must be a list, got {type(values[key]).__name__}; "
                        f"wrap a single {key} in a list: {{'{key}': [item]}}"
                    )
        return values

    def is_empty(self) -> bool:
        return not self.text and not self.image and not self.video

    def is_text_only(self) -> bool:
        return bool(self.text) and not self.image and not self.video
