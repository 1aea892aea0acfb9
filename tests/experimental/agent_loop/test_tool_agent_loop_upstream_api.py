"""Upstream main's tool-agent-loop surface: `AgentState`, `_call_tool` observations and lifecycles,
tool-call ids, `tool_rewards` / `turn_scores` in every output, `AgentLoopOutput.as_dict`,
`ToolListWrap`, `verl.workers.rollout.replica.TokenOutput`."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import load_build_script
from test_agent_loop import GREEDY, ScriptedServer, _batch, call

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker, ToolListWrap
from verl.experimental.agent_loop.tool_agent_loop import AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall, HermesToolParser, ToolParser
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse
from verl.workers.config import MultiTurnConfig, RolloutConfig
from verl.workers.rollout.replica import TokenOutput

SCHEMA = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "l",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}


class RewardLookup(BaseTool):
    """Answers `q` upper-cased with step reward 0.5; records its life cycle."""

    events: list = []

    async def create(self, instance_id=None, **kwargs):
        RewardLookup.events.append("create")
        return await super().create(instance_id)

    async def execute(self, instance_id, parameters, **kwargs):
        RewardLookup.events.append(("execute", "agent_data" in kwargs))
        return ToolResponse(text=parameters["q"].upper()), 0.5, {}

    async def release(self, instance_id, **kwargs):
        RewardLookup.events.append("release")


@ToolParser.register("hermes_with_test_ids")
class _HermesWithIds(HermesToolParser):
    """Hermes calls numbered `call_0`, `call_1`, ... as if the model had emitted ids."""

    def parse_text(self, text, schemas=None):
        content, calls = super().parse_text(text, schemas)
        return content, [c.model_copy(update={"tool_call_id": f"call_{i}"}) for i, c in enumerate(calls)]


@pytest.fixture(scope="module")
def calc_tok():
    return load_build_script().build_calculator_tokenizer()


def _worker(tok, scripts, tmp_path, fmt="hermes_with_test_ids"):
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n  - class_name: test_tool_agent_loop_upstream_api.RewardLookup\n    config: {type: native}\n"
        f"    tool_schema: {json.dumps(SCHEMA)}\n"
    )
    mt = MultiTurnConfig(enable=True, format=fmt, tool_config_path=str(path), max_parallel_calls=2)
    cfg = RolloutConfig(prompt_length=32, response_length=200, multi_turn=mt)
    return AgentLoopWorker(None, cfg, ScriptedServer(tok, scripts), tok)


def test_call_ids_rewards_and_assistant_message_reach_the_output(calc_tok, tmp_path):
    RewardLookup.events.clear()
    worker = _worker(calc_tok, {"q": [call("lookup", q="ab") + call("lookup", q="cd"), "AB CD"]}, tmp_path)
    loop_out = asyncio.run(
        worker._run_all([{"raw_prompt": [{"role": "user", "content": "q"}]}], ["tool_agent"], {}, 1)
    )[0]
    tool_msgs = [m for m in loop_out.extra_fields["messages"] if m["role"] == "tool"]
    assert tool_msgs == [
        {"role": "tool", "content": "AB", "tool_call_id": "call_0"},
        {"role": "tool", "content": "CD", "tool_call_id": "call_1"},
    ]
    assert loop_out.extra_fields["tool_rewards"] == [0.5, 0.5] and loop_out.extra_fields["turn_scores"] == []
    message = loop_out.extra_fields["trace"]["turns"][0]["message"]
    assert message["content"] == "" and [c["id"] for c in message["tool_calls"]] == ["call_0", "call_1"]
    assert message["tool_calls"][0]["function"] == {"name": "lookup", "arguments": {"q": "ab"}}
    # one instance for the trajectory, released at its end; execute gets agent_data (upstream)
    assert RewardLookup.events == ["create", ("execute", True), ("execute", True), "release"]


def test_every_sample_has_the_stable_extra_field_columns(calc_tok, tmp_path):
    worker = _worker(calc_tok, {"a": ["42"], "b": [call("lookup", q="x"), "X"]}, tmp_path)
    batch = _batch(["a", "b"])
    batch.non_tensor_batch["agent_name"] = np.array(["single_turn_agent", "tool_agent"], dtype=object)
    out = worker.run(batch, GREEDY)
    assert out.non_tensor_batch["tool_rewards"].tolist() == [[], [0.5]]
    assert out.non_tensor_batch["turn_scores"].tolist() == [[], []]


class _Recorder(BaseTool):
    def __init__(self):
        super().__init__({"type": "native"}, None)
        self.events = []

    def get_openai_tool_schema(self):
        from verl.tools.schemas import OpenAIFunctionToolSchema

        return OpenAIFunctionToolSchema.model_validate(SCHEMA)

    async def create(self, instance_id=None, **kwargs):
        self.events.append(("create", kwargs))
        return "iid", ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        if parameters["q"] == "boom":
            raise ValueError("bad q")
        return ToolResponse(text="x" * 30), 1.0, {}

    async def release(self, instance_id, **kwargs):
        self.events.append(("release", instance_id))


def _bare_loop(tool, limit=10, side="right"):
    loop = object.__new__(ToolAgentLoop)
    loop.tools = {tool.name: tool}
    loop.max_tool_response_length, loop.tool_response_truncate_side = limit, side
    return loop


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"q": "a"}', "xxxxxxxxxx...(truncated)"),
        ("", "Invalid JSON in arguments for 'lookup'"),
        ("[1]", "Invalid JSON in arguments for 'lookup': expected a JSON object, got list"),
        ('{"q": "boom"}', "Error executing tool 'lookup': ValueError: bad q"),
    ],
)
def test_call_tool_observations_and_per_call_lifecycle(arguments, expected):
    tool = _Recorder()
    loop = _bare_loop(tool)
    kwargs = {"lookup": {"create_kwargs": {"k": 1}}}
    response, reward, metrics = asyncio.run(
        loop._call_tool(FunctionCall(name="lookup", arguments=arguments), kwargs, SimpleNamespace())
    )
    assert response.text.startswith(expected)
    assert reward == (1.0 if expected.startswith("x") else 0.0) and metrics.get("error", False) == (reward == 0.0)
    if arguments.startswith("{"):  # no `instances` on agent_data: created and released around the call
        assert tool.events == [("create", {"k": 1}), ("release", "iid")]
    unknown, _, m = asyncio.run(loop._call_tool(FunctionCall(name="nope", arguments="{}"), {}, SimpleNamespace()))
    assert unknown.text == "Unknown function 'nope'. Available tools: ['lookup']" and m["error"]


def test_states_wrappers_outputs_and_token_output():
    assert [s.value for s in AgentState] == ["pending", "generating", "processing_tools", "terminated"]
    assert ToolListWrap([1, 2]).tools == [1, 2]
    out = AgentLoopOutput(
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        response_mask=[1, 0],
        response_logprobs=[-0.5, 0.0],
        reward_score=2.0,
        extra_fields={"teacher_ids": [7], "k": "v"},
    )
    d = out.as_dict()
    assert d["prompts"].tolist() == [1, 2] and d["responses"].dtype == torch.int64
    assert d["rollout_log_probs"].tolist() == [-0.5, 0.0] and d["rm_scores"].tolist() == [0.0, 2.0]
    assert d["teacher_ids"] == [7] and d["extra_fields"] == {"k": "v"}
    assert out.extra_fields == {"teacher_ids": [7], "k": "v"}  # the model is not changed
    t = TokenOutput(token_ids=[1])
    assert (t.log_probs, t.stop_reason, t.routed_experts, t.num_preempted, t.extra_fields) == (
        None,
        "eos",
        None,
        None,
        {},
    )
