"""The tool-call formats of upstream main that make sense for text models: `qwen3_coder`
(Qwen3XMLToolParser), `kimi`, `gpt-oss`, plus `extract_tool_calls(ids, tools=...)`."""

from __future__ import annotations

import asyncio
import json

import pytest

from verl.experimental.agent_loop.tool_parser import (
    GptOssToolParser,
    KimiToolParser,
    Qwen3XMLToolParser,
    ToolParser,
)
from verl.tools.schemas import OpenAIFunctionToolSchema


class _TextTok:
    """decode returns the text given as 'ids' (the parsers only see decoded text)."""

    pad_token = "<pad>"

    def decode(self, ids, skip_special_tokens=True):
        return ids

    def convert_tokens_to_ids(self, token):
        return {"<|im_end|>": 163586}.get(token, -1)


def _tool(name, **props):
    return OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": name,
                "description": "d",
                "parameters": {
                    "type": "object",
                    "properties": {k: {"type": v} for k, v in props.items()},
                    "required": list(props)[:1],
                },
            },
        }
    )


def _extract(parser, text, tools=None):
    return asyncio.run(parser.extract_tool_calls(text, tools))


def test_registered_names():
    for name, cls in (("qwen3_coder", Qwen3XMLToolParser), ("kimi", KimiToolParser), ("gpt-oss", GptOssToolParser)):
        assert type(ToolParser.get_tool_parser(name, _TextTok())) is cls


def test_qwen3_xml_converts_by_schema_and_never_evaluates(tmp_path):
    tools = [_tool("f", n="integer", x="number", ok="boolean", items="array", obj="object", s="string")]
    text = (
        "Let me. <tool_call>\n<function=f>\n<parameter=n>\n7\n</parameter>\n<parameter=x>2.5</parameter>"
        "<parameter=ok>True</parameter><parameter=items>[1, 'a']</parameter><parameter=obj>{\"k\": 1}</parameter>"
        "<parameter=s>007</parameter><parameter=extra>raw</parameter></function></tool_call>"
    )
    content, calls = _extract(Qwen3XMLToolParser(_TextTok()), text, tools)
    assert content == "Let me. " and len(calls) == 1 and calls[0].name == "f"
    args = json.loads(calls[0].arguments)
    assert args == {"n": 7, "x": 2.5, "ok": True, "items": [1, "a"], "obj": {"k": 1}, "s": "007", "extra": "raw"}
    marker = tmp_path / "ran"
    payload = f'__import__("pathlib").Path("{marker}").touch()'
    call = Qwen3XMLToolParser(None)._parse_xml_function_call(f"f><parameter=items>{payload}</parameter>", tools)
    assert json.loads(call.arguments)["items"] == payload and not marker.exists()
    assert Qwen3XMLToolParser(None)._parse_xml_function_call("f", tools) is None  # truncated header


def test_qwen3_xml_two_calls_and_a_truncated_one():
    text = "<tool_call><function=a><parameter=p>1</parameter></function></tool_call><tool_call><function=b"
    _, calls = _extract(Qwen3XMLToolParser(_TextTok()), text)
    assert [c.name for c in calls] == ["a", ""] and calls[1].error and json.loads(calls[0].arguments) == {"p": "1"}
    assert _extract(Qwen3XMLToolParser(_TextTok()), "plain answer") == ("plain answer", [])


def test_kimi_keeps_the_model_call_id_and_finds_the_tool():
    parser = KimiToolParser(_TextTok())
    assert parser.stop_token_ids == [163586]
    text = (
        "Checking.<|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|>'
        '<|tool_call_begin|>call_9<|tool_call_argument_begin|>{"query": "x"}<|tool_call_end|>'
        "<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{bad<|tool_call_end|>"
        "<|tool_calls_section_end|>"
    )
    content, calls = _extract(parser, text, [_tool("get_weather", city="string"), _tool("search", query="string")])
    assert content == "Checking."
    assert [(c.name, c.tool_call_id) for c in calls] == [
        ("get_weather", "functions.get_weather:0"),
        ("search", "call_9"),  # no name in the id: the one tool whose required parameters match
        ("get_weather", "functions.get_weather:1"),
    ]
    assert json.loads(calls[0].arguments) == {"city": "Oslo"} and calls[0].error is None
    assert "invalid JSON" in calls[2].error  # answered by an observation, not dropped


def test_gpt_oss_reads_harmony_calls_and_ignores_the_analysis_channel():
    text = (
        "<|start|>assistant<|channel|>analysis<|message|>maybe to=functions.fake <|constrain|>json<|message|>{}"
        "<|call|> hmm<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"location": "Tokyo"}<|call|><pad>'
    )
    content, calls = _extract(GptOssToolParser(_TextTok()), text)
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"location": "Tokyo"}')]
    assert "fake" not in content and "<pad>" not in content
    assert _extract(GptOssToolParser(_TextTok()), "<|start|>assistant<|channel|>final<|message|>42") == (
        "<|start|>assistant<|channel|>final<|message|>42",
        [],
    )


@pytest.mark.parametrize("as_objects", [True, False])
def test_tools_argument_overrides_the_constructor_schemas(as_objects):
    from verl.experimental.agent_loop.tool_parser import VerlToyToolParser

    parser = VerlToyToolParser(_TextTok(), [_tool("calc", expression="string").model_dump()])
    other = [_tool("calc", formula="string")]
    tools = other if as_objects else [t.model_dump() for t in other]
    _, calls = _extract(parser, "<tool_call>calc: 1+2</tool_call>", tools)
    assert json.loads(calls[0].arguments) == {"formula": "1+2"}
    _, calls = _extract(parser, "<tool_call>calc: 1+2</tool_call>")
    assert json.loads(calls[0].arguments) == {"expression": "1+2"}
