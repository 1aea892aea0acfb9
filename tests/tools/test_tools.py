"""Tools: `@function_tool` schemas from signature + docstring, unique names across the yaml and the
function file, the tool config yaml loader, the calculator, the tool-call parsers."""

from __future__ import annotations

import asyncio
import json
import textwrap

import pytest

from verl.experimental.agent_loop.tool_parser import ToolParser
from verl.tools.calculator_tool import CALCULATOR_SCHEMA, CalculatorTool, evaluate_expression
from verl.tools.function_tool import (
    FUNCTION_TOOL_REGISTRY,
    function_tool,
    load_function_tools_from_path,
    normalize_function_tool_return,
)
from verl.tools.schemas import ToolResponse
from verl.tools.tool_registry import initialize_tools_from_config, load_all_tools


@pytest.fixture(autouse=True)
def _clean_registry():
    saved = dict(FUNCTION_TOOL_REGISTRY)
    yield
    FUNCTION_TOOL_REGISTRY.clear()
    FUNCTION_TOOL_REGISTRY.update(saved)


def test_function_tool_schema_from_signature_and_docstring():
    @function_tool
    def lookup_price(item: str, quantity: int = 1) -> str:
        """Look up the price of an item.

        Args:
            item: the item's name.
            quantity: how many.
        """
        return f"{item} x{quantity}"

    tool = FUNCTION_TOOL_REGISTRY["lookup_price"]
    fn = tool.tool_schema.function
    assert fn.name == "lookup_price"
    assert fn.description == "Look up the price of an item."
    assert fn.parameters.properties["item"].type == "string"
    assert fn.parameters.properties["quantity"].type == "integer"
    assert fn.parameters.properties["item"].description == "the item's name."
    assert fn.parameters.required == ["item"]
    resp, reward, metrics = normalize_function_tool_return(asyncio.run(tool.call({"item": "pen", "quantity": 3})))
    assert (resp.text, reward, metrics) == ("pen x3", 0.0, {})


def test_function_tool_rename_and_missing_docs_fail_at_decoration():
    @function_tool("renamed")
    def f(x: int) -> int:
        """Double.

        Args:
            x: a number.
        """
        return 2 * x

    assert "renamed" in FUNCTION_TOOL_REGISTRY and "f" not in FUNCTION_TOOL_REGISTRY
    with pytest.raises(Exception, match="(?i)docstring|description"):

        @function_tool
        def no_doc(x: int) -> int:
            return x


def test_function_tool_names_are_unique():
    @function_tool("dup")
    def a(x: int) -> int:
        """A.

        Args:
            x: x.
        """
        return x

    with pytest.raises(ValueError, match="already registered"):

        @function_tool("dup")
        def b(x: int) -> int:
            """B.

            Args:
                x: x.
            """
            return x


def test_normalize_function_tool_return():
    assert normalize_function_tool_return("a")[0].text == "a"
    assert json.loads(normalize_function_tool_return({"k": 1})[0].text) == {"k": 1}
    assert normalize_function_tool_return(("r", 0.5, {"m": 1}))[1:] == (0.5, {"m": 1})
    assert normalize_function_tool_return((ToolResponse(text="t"), None))[0].text == "t"
    with pytest.raises(TypeError, match="length 4"):
        normalize_function_tool_return((1, 2, 3, 4))


def _write_tools(tmp_path, fn_name="calculator"):
    yaml_path = tmp_path / "tools.yaml"
    yaml_path.write_text(
        textwrap.dedent(f"""
        tools:
          - class_name: verl.tools.calculator_tool.CalculatorTool
            config: {{type: native}}
            tool_schema: {json.dumps(CALCULATOR_SCHEMA)}
    """)
    )
    py_path = tmp_path / "fns.py"
    py_path.write_text(
        textwrap.dedent(f'''
        from verl.tools.function_tool import function_tool

        @function_tool("{fn_name}")
        def echo(text: str) -> str:
            """Echo the text.

            Args:
                text: what to echo.
            """
            return text
    ''')
    )
    return str(yaml_path), str(py_path)


def test_tool_yaml_and_function_file(tmp_path):
    yaml_path, py_path = _write_tools(tmp_path, fn_name="echo_tool")
    tools = load_all_tools(yaml_path, py_path)
    assert [t.name for t in tools] == ["calculator", "echo_tool"]
    assert isinstance(tools[0], CalculatorTool)
    assert asyncio.run(tools[0].execute("i", {"expression": "347*85"}))[0].text == "29495"


def test_tool_names_unique_across_yaml_and_function_file(tmp_path):
    yaml_path, py_path = _write_tools(tmp_path, fn_name="calculator")
    with pytest.raises(ValueError, match=r"\['calculator'\] collide.*unique"):
        load_all_tools(yaml_path, py_path)


def test_package_does_not_shadow_the_function_tool_module():
    import importlib
    import inspect

    import verl.tools

    assert inspect.ismodule(verl.tools.function_tool)
    assert verl.tools.function_tool is importlib.import_module("verl.tools.function_tool")
    assert verl.tools.FunctionTool is verl.tools.function_tool.FunctionTool


def test_function_tools_are_stateless_not_base_tools(tmp_path):
    from verl.tools.base_tool import BaseTool

    _, py_path = _write_tools(tmp_path, fn_name="echo_tool")
    (tool,) = load_function_tools_from_path(py_path)
    assert not isinstance(tool, BaseTool) and tool.is_async is False
    assert normalize_function_tool_return(asyncio.run(tool.call({"text": "hi"})))[0].text == "hi"


def test_loaded_path_cache_is_not_shared_state_callers_can_break(tmp_path):
    from verl.tools import function_tool as function_tool_mod

    _, py_path = _write_tools(tmp_path, fn_name="echo_tool")
    first = load_function_tools_from_path(py_path)
    first.append("junk")  # a caller changing its list changes nobody else's
    second = load_function_tools_from_path(py_path)
    assert [t.name for t in second] == ["echo_tool"] and second[0] is first[0]  # executed once
    assert function_tool_mod._LOADED_FUNCTION_TOOL_PATHS[str(tmp_path / "fns.py")] == second
    FUNCTION_TOOL_REGISTRY.clear()  # the cached tools are no longer registered: execute again
    third = load_function_tools_from_path(py_path)
    assert third[0] is not first[0] and FUNCTION_TOOL_REGISTRY["echo_tool"] is third[0]


def test_file_without_function_tools_warns_and_adds_nothing(tmp_path, caplog):
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    with caplog.at_level("WARNING"):
        assert load_function_tools_from_path(str(empty)) == []
    assert any("no @function_tool" in r.getMessage() and "empty.py" in r.getMessage() for r in caplog.records)


def test_tool_yaml_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tools:\n  - class_name: verl.tools.calculator_tool.CalculatorTool\n    config: {type: mcp}\n")
    with pytest.raises(ValueError, match="config.type='mcp'"):
        initialize_tools_from_config(str(bad))
    with pytest.raises(FileNotFoundError, match="function_tool_path"):
        load_function_tools_from_path(str(tmp_path / "missing.py"))


@pytest.mark.parametrize(
    "expr,out",
    [
        ("347*85", "29495"),
        ("7/2", "3.5"),
        ("6/3", "2"),
        ("-(2+3)*4", "-20"),
        ("1/0", "Error: division by zero"),
        ("__import__('os')", "Error: unsupported element Call"),
        ("2**10", "Error: unsupported element BinOp"),
        ("1+", "Error: invalid syntax"),
    ],
)
def test_calculator(expr, out):
    assert evaluate_expression(expr) == out


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return ids  # the tests pass text directly


def test_hermes_parser_valid_malformed_unclosed():
    p = ToolParser.get_tool_parser("hermes", _Tok())
    text = (
        'hi <tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call> '
        "and <tool_call>{bad json}</tool_call>"
    )
    content, calls = p.parse_text(text)
    assert content == "hi  and"
    assert (
        calls[0].name == "calculator"
        and json.loads(calls[0].arguments) == {"expression": "1+2"}
        and calls[0].error is None
    )
    assert calls[1].error.startswith("malformed tool call: invalid JSON")
    _, calls = p.parse_text('<tool_call>{"name": "calculator", "arguments": {}}')
    assert len(calls) == 1 and "never closed" in calls[0].error
    _, calls = p.parse_text('<tool_call>{"arguments": {}}</tool_call>')
    assert "expected" in calls[0].error
    assert p.parse_text("just an answer") == ("just an answer", [])


def test_verl_toy_parser_maps_to_first_required_parameter():
    p = ToolParser.get_tool_parser("verl_toy", _Tok(), [CALCULATOR_SCHEMA])
    _, calls = p.parse_text("<tool_call>calculator: 347*85</tool_call>")
    assert calls[0].name == "calculator" and json.loads(calls[0].arguments) == {"expression": "347*85"}
    _, calls = p.parse_text("<tool_call>347*85</tool_call>")
    assert calls[0].error is not None
    with pytest.raises(ValueError, match="not a registered tool parser"):
        ToolParser.get_tool_parser("nope", _Tok())
