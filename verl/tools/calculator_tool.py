"""A calculator tool: exact integer / rational arithmetic on `+ - * / ( )` (no names, no calls).

`evaluate_expression("347*85") == "29495"`; division is exact (`"7/2"` -> `"3.5"`, `"6/3"` -> `"2"`).
A malformed expression gives an `Error: ...` observation, never an exception in the loop. Used by the
embedded calculator task (`verl_toy/calculator`).
"""

from __future__ import annotations

import ast
from fractions import Fraction
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["CalculatorTool", "evaluate_expression", "CALCULATOR_SCHEMA"]

MAX_EXPRESSION_CHARS = 200
MAX_ABS_VALUE = 10**30

CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "digits, + - * / and parentheses, e.g. 347*85"}
            },
            "required": ["expression"],
        },
    },
}

_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def _eval(node) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div) and b == 0:
            raise ZeroDivisionError("division by zero")
        out = _BINOPS[type(node.op)](a, b)
        if abs(out) > MAX_ABS_VALUE:
            raise OverflowError("result too large")
        return out
    raise ValueError(f"unsupported element {type(node).__name__}")


def evaluate_expression(expression: str) -> str:
    """The exact value of `expression` as text, or `Error: <reason>`."""
    if not isinstance(expression, str):
        return f"Error: expression must be a string, got {type(expression).__name__}"
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"Error: expression longer than {MAX_EXPRESSION_CHARS} characters"
    try:
        value = _eval(ast.parse(expression.strip(), mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return f"Error: {exc.msg if isinstance(exc, SyntaxError) else exc}"
    if value.denominator == 1:
        return str(value.numerator)
    return repr(float(value))


class CalculatorTool(BaseTool):
    """`calculator(expression)`; the schema defaults to `CALCULATOR_SCHEMA`."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        super().__init__(config, tool_schema or OpenAIFunctionToolSchema.model_validate(CALCULATOR_SCHEMA))

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        expr = parameters.get("expression")
        if expr is None:
            return ToolResponse(text="Error: missing required argument 'expression'"), 0.0, {"error": True}
        text = evaluate_expression(expr)
        return ToolResponse(text=text), 0.0, {"error": text.startswith("Error:")}
