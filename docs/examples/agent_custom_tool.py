"""A stateful tool: one notebook per trajectory (created on the first call, released at the end).

Declared in docs/examples/agent_tools.yaml with `class_name: docs/examples/agent_custom_tool.py:NotebookTool`.
Per-sample arguments come from the row's `extra_info.tools_kwargs.notebook.create_kwargs` (here: a
first note written before the model's first call).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


class NotebookTool(BaseTool):
    def __init__(self, config: dict, tool_schema):
        super().__init__(config, tool_schema)
        self.max_notes = int(self.config.get("max_notes", 5))
        self.notes: dict[str, list[str]] = {}

    async def create(
        self, instance_id: str | None = None, first_note: str | None = None, **kwargs
    ) -> tuple[str, ToolResponse]:
        instance_id = instance_id or uuid4().hex
        self.notes[instance_id] = [first_note] if first_note else []
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        notes = self.notes[instance_id]
        if len(notes) >= self.max_notes:
            # an "Error:" text (or metrics["error"]) is counted in agent/tool_error_rate
            return ToolResponse(text=f"Error: the notebook is full ({self.max_notes} notes)"), 0.0, {"error": True}
        notes.append(str(parameters.get("note", "")))
        return ToolResponse(text=" | ".join(notes)), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return float(len(self.notes.get(instance_id, [])))

    async def release(self, instance_id: str, **kwargs) -> None:
        self.notes.pop(instance_id, None)
