"""Agent loops with a scripted generation server: token layout (prompt + generated ids + render
diffs of observations), masks, log-probs, turn ids / step ends, error observations, truncation
sides, the response budget, no duplicated messages, the tokenization sanity check."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch
from conftest import load_build_script

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopOutput,
    AgentLoopWorker,
    derive_turns,
    register,
)
from verl.experimental.agent_loop.chat import ChatRenderer
from verl.experimental.agent_loop.tool_agent_loop import TRUNCATION_MARK, truncate_text
from verl.protocol import DataProto
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse
from verl.workers.config import MultiTurnConfig, RolloutConfig
from verl.workers.rollout.async_server import TokenOutput


@pytest.fixture(scope="module")
def calc_tok():
    return load_build_script().build_calculator_tokenizer()


class ScriptedServer:
    """Answers turn k of a trajectory with `script[k]` (text; `<|end|>` appended unless the text
    ends with '~', which means 'cut by the budget'); log-prob of the j-th generated token = -0.01*(j+1)."""

    def __init__(self, tok, scripts):
        self.tok, self.scripts, self.calls = tok, scripts, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None):
        text = self.tok.decode(prompt_ids, skip_special_tokens=False)
        user = text.split("<|user|>")[1].split("<|end|>")[0]
        turn = text.count("<|assistant|>") - 1
        self.calls.append((user, turn, list(prompt_ids), sampling_params["max_tokens"]))
        out = self.scripts[user][turn]
        ids = self.tok(out, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        n = sampling_params["max_tokens"]
        reason = "length" if len(ids) > n else "eos"
        ids = ids[:n]
        await asyncio.sleep(0)
        return TokenOutput(token_ids=ids, log_probs=[-0.01 * (j + 1) for j in range(len(ids))], stop_reason=reason)


class SlowEcho(BaseTool):
    """Echo tool that records its life cycle (create/execute/release) per instance."""

    events: list = []

    async def create(self, instance_id=None, **kwargs):
        iid, _ = await super().create(instance_id)
        SlowEcho.events.append(("create", kwargs))
        return iid, ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(float(self.config.get("sleep_s", 0.0)))
        if parameters.get("text") == "boom":
            raise RuntimeError("exploded")
        return ToolResponse(text=str(parameters.get("text", "")) * int(parameters.get("times", 1))), 0.0, {}

    async def release(self, instance_id, **kwargs):
        SlowEcho.events.append(("release", instance_id))


def _tool_yaml(tmp_path, sleep_s=0.0):
    schema_calc = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "c",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
    schema_echo = {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "e",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}, "times": {"type": "integer"}},
                "required": ["text"],
            },
        },
    }
    p = tmp_path / "tools.yaml"
    p.write_text(
        "tools:\n"
        f"  - class_name: verl.tools.calculator_tool.CalculatorTool\n    config: {{type: native}}\n    "
        f"tool_schema: {json.dumps(schema_calc)}\n"
        f"  - class_name: test_agent_loop.SlowEcho\n    config: {{type: native, sleep_s: {sleep_s}}}\n    "
        f"tool_schema: {json.dumps(schema_echo)}\n"
    )
    return str(p)


def _worker(tok, scripts, tmp_path, response_length=96, prompt_length=32, **mt):
    mt = {"enable": True, "format": "hermes", "tool_config_path": _tool_yaml(tmp_path), **mt}
    cfg = RolloutConfig(prompt_length=prompt_length, response_length=response_length, multi_turn=MultiTurnConfig(**mt))
    server = ScriptedServer(tok, scripts)
    return AgentLoopWorker(None, cfg, server, tok), server


def _batch(users, agent="tool_agent", tools_kwargs=None):
    b = len(users)
    raw = np.empty(b, dtype=object)
    for i, u in enumerate(users):
        raw[i] = [{"role": "user", "content": u}]
    nt = {"raw_prompt": raw, "agent_name": np.array([agent] * b, dtype=object)}
    if tools_kwargs is not None:
        extra = np.empty(b, dtype=object)
        for i in range(b):
            extra[i] = {"tools_kwargs": tools_kwargs}
        nt["extra_info"] = extra
    return DataProto.from_dict(tensors={"dummy": torch.zeros(b, 1)}, non_tensors=nt)


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


GREEDY = {"do_sample": False, "temperature": 0.0, "top_k": -1, "top_p": 1.0}


def test_two_turn_trajectory_layout(calc_tok, tmp_path):
    tok = calc_tok
    scripts = {"12*34": [call("calculator", expression="12*34"), "408"]}
    worker, server = _worker(tok, scripts, tmp_path)
    out = worker.run(_batch(["12*34"]), GREEDY)
    b = out.batch
    P = 32
    mask = b["response_mask"][0]
    n = int(b["attention_mask"][0, P:].sum())
    resp = b["responses"][0, :n].tolist()
    turn1 = tok(call("calculator", expression="12*34"), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    obs = tok("<|tool|>408<|end|><|assistant|>", add_special_tokens=False)["input_ids"]
    turn2 = tok("408", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    # final ids = concatenation of the per-turn ids; the observation is the render diff
    assert resp == turn1 + obs + turn2
    assert mask[:n].tolist() == [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    assert mask[n:].sum() == 0
    # input_ids = prompt ++ response; the second request's prompt is exactly the trajectory so far
    prompt = tok("<|bos|><|user|>12*34<|end|><|assistant|>", add_special_tokens=False)["input_ids"]
    assert b["prompts"][0, P - len(prompt) :].tolist() == prompt
    assert server.calls[1][2] == prompt + turn1 + obs
    assert b["input_ids"][0, P - len(prompt) : P + n].tolist() == prompt + resp
    # log-probs: the sampler's on generated tokens, 0 on observation tokens
    lp = b["rollout_log_probs"][0]
    assert torch.allclose(lp[: len(turn1)], torch.tensor([-0.01 * (j + 1) for j in range(len(turn1))]))
    assert (lp[len(turn1) : len(turn1) + len(obs)] == 0).all()
    # turn ids / step ends (docs/algorithms.md: -1 on non-action tokens)
    tid = b["turn_ids"][0, :n].tolist()
    assert tid == [0] * len(turn1) + [-1] * len(obs) + [1] * len(turn2)
    ends = b["step_end_mask"][0].nonzero().squeeze(-1).tolist()
    assert ends == [len(turn1) - 1, n - 1]
    # positions continue over observation tokens; attention covers them
    assert b["position_ids"][0, P + n - 1] == len(prompt) + n - 1
    assert b["attention_mask"][0, P : P + n].all()
    # trace and metrics
    trace = out.non_tensor_batch["agent_trace"][0]
    assert trace["stop"] == "answer" and trace["turns"][0]["calls"][0]["result"] == "408"
    m = out.meta_info["metrics"]
    assert m["agent/tool_calls/mean"] == 1 and m["agent/tool_error_rate"] == 0 and m["num_turns/max"] == 4
    assert m["agent/tokenization_mismatch_rate"] == 0.0


def test_error_observations_unknown_tool_malformed_and_raising_tool(calc_tok, tmp_path):
    scripts = {
        "a": [call("no_such_tool", x=1), "done"],
        "b": ["<tool_call>{not json</tool_call>", "done"],
        "c": [call("echo", text="boom"), "done"],
        "d": ["<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": "1+"}}), "done"],
    }
    worker, _ = _worker(calc_tok, scripts, tmp_path, response_length=300)
    out = worker.run(_batch(list(scripts)), GREEDY)
    traces = out.non_tensor_batch["agent_trace"]
    results = [t["turns"][0]["calls"][0]["result"] for t in traces]
    assert results[0] == "Unknown function 'no_such_tool'. Available tools: ['calculator', 'echo']"
    assert results[1].startswith("Error: malformed tool call: invalid JSON")
    assert results[2] == "Error executing tool 'echo': RuntimeError: exploded"
    assert "never closed" in results[3]
    # every trajectory continued after the error: the model saw it and answered
    assert all(t["stop"] == "answer" and len(t["turns"]) == 2 for t in traces)
    assert out.meta_info["metrics"]["agent/tool_error_rate"] == 1.0
    # the observation text is in the token stream
    text = calc_tok.decode(out.batch["responses"][0].tolist(), skip_special_tokens=True)
    assert "Unknown function" in text


@pytest.mark.parametrize(
    "side,expected",
    [
        ("left", "(truncated)...6789"),
        ("right", "0123...(truncated)"),
        ("middle", "01" + TRUNCATION_MARK + "89"),
    ],
)
def test_truncate_text_sides(side, expected):
    assert truncate_text("0123456789", 4, side) == expected
    assert truncate_text("0123", 4, side) == "0123"


@pytest.mark.parametrize("side", ["left", "right"])
def test_tool_result_cut_on_configured_side(calc_tok, tmp_path, side):
    scripts = {"q": [call("echo", text="abcdefghij", times=3), "ok"]}
    worker, _ = _worker(calc_tok, scripts, tmp_path, max_tool_response_length=5, tool_response_truncate_side=side)
    out = worker.run(_batch(["q"]), GREEDY)
    result = out.non_tensor_batch["agent_trace"][0]["turns"][0]["calls"][0]["result"]
    full = "abcdefghij" * 3
    assert result == ("(truncated)..." + full[-5:] if side == "left" else full[:5] + "...(truncated)")


def test_budget_met_mid_turn_ends_cleanly(calc_tok, tmp_path):
    tok = calc_tok
    first = call("calculator", expression="12*34")
    n1 = len(tok(first, add_special_tokens=False)["input_ids"]) + 1
    obs = len(tok("<|tool|>408<|end|><|assistant|>", add_special_tokens=False)["input_ids"])
    # the budget ends 3 tokens into the second turn: no EOS there, the trajectory stops cleanly
    R = n1 + obs + 3
    worker, server = _worker(tok, {"q": [first, "40800000"]}, tmp_path, response_length=R)
    out = worker.run(_batch(["q"]), GREEDY)
    b = out.batch
    assert int(b["attention_mask"][0, 32:].sum()) == R
    assert b["response_mask"][0].tolist() == [1] * n1 + [0] * obs + [1] * 3
    assert server.calls[-1][3] == 3  # the last request asked for exactly the tokens left
    trace = out.non_tensor_batch["agent_trace"][0]
    assert trace["stop"] == "length_budget" and out.meta_info["metrics"]["agent/cut_by_length_budget"] == 1.0
    # the first turn cut exactly at its EOS: a call is read, but its observation does not fit
    worker, server = _worker(tok, {"q": [first, "x"]}, tmp_path, response_length=n1 + obs)
    out = worker.run(_batch(["q"]), GREEDY)
    assert out.batch["response_mask"][0].tolist() == [1] * n1 + [0] * obs
    assert int(out.batch["attention_mask"][0, 32:].sum()) == n1
    assert len(server.calls) == 1 and out.non_tensor_batch["agent_trace"][0]["stop"] == "length_budget"
    # a turn cut by the budget is never parsed for calls
    worker, server = _worker(tok, {"q": [first]}, tmp_path, response_length=n1 - 1)
    out = worker.run(_batch(["q"]), GREEDY)
    assert out.non_tensor_batch["agent_trace"][0]["turns"][0]["calls"] == [] and len(server.calls) == 1


def test_no_duplicated_messages_and_turn_limits(calc_tok, tmp_path):
    scripts = {"q": [call("echo", text=str(k)) for k in range(6)]}
    worker, server = _worker(calc_tok, scripts, tmp_path, response_length=400, max_assistant_turns=3)
    loop_out = asyncio.run(
        worker._run_all([{"raw_prompt": [{"role": "user", "content": "q"}]}], ["tool_agent"], GREEDY, 1)
    )[0]
    msgs = loop_out.extra_fields["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [m["content"] for m in msgs if m["role"] == "tool"] == ["0", "1"]
    assert loop_out.extra_fields["trace"]["stop"] == "max_assistant_turns"
    # each request's prompt extends the previous one: nothing is appended twice
    prompts = [c[2] for c in server.calls]
    for a, b in zip(prompts, prompts[1:], strict=False):
        assert b[: len(a)] == a and len(b) > len(a)
    text = calc_tok.decode(loop_out.prompt_ids + loop_out.response_ids, skip_special_tokens=False)
    assert text.count("<|tool|>0<|end|>") == 1 and text.count("<|tool|>1<|end|>") == 1
    worker, _ = _worker(calc_tok, scripts, tmp_path, response_length=400, max_user_turns=1)
    out = worker.run(_batch(["q"]), GREEDY)
    assert out.non_tensor_batch["agent_trace"][0]["stop"] == "max_user_turns"
    assert out.non_tensor_batch["__num_turns__"][0] == 1 + 2 + 1


def test_parallel_calls_limit_and_tool_lifecycle(calc_tok, tmp_path):
    SlowEcho.events.clear()
    two = call("echo", text="a") + call("echo", text="b") + call("echo", text="c")
    worker, _ = _worker(calc_tok, {"q": [two, "ok"]}, tmp_path, response_length=400, max_parallel_calls=2)
    out = worker.run(_batch(["q"], tools_kwargs={"echo": {"create_kwargs": {"seed": 7}}}), GREEDY)
    calls = out.non_tensor_batch["agent_trace"][0]["turns"][0]["calls"]
    assert [c["result"] for c in calls[:2]] == ["a", "b"]
    assert calls[2]["result"].startswith("Error: at most 2 tool call(s) per turn") and calls[2]["error"]
    creates = [e for e in SlowEcho.events if e[0] == "create"]
    assert creates == [("create", {"seed": 7})]  # one instance per trajectory, with its create_kwargs
    assert [e[0] for e in SlowEcho.events].count("release") == 1


def test_single_turn_agent_and_agent_name_routing(calc_tok, tmp_path):
    worker, _ = _worker(calc_tok, {"q": ["42"], "r": [call("calculator", expression="1+1"), "2"]}, tmp_path)
    batch = _batch(["q", "r"])
    batch.non_tensor_batch["agent_name"] = np.array(["single_turn_agent", "tool_agent"], dtype=object)
    out = worker.run(batch, GREEDY)
    assert out.non_tensor_batch["__num_turns__"].tolist() == [2, 4]
    assert out.batch["response_mask"][0].sum() == len(calc_tok("42", add_special_tokens=False)["input_ids"]) + 1
    batch.non_tensor_batch["agent_name"] = np.array(["nope", "tool_agent"], dtype=object)
    with pytest.raises(ValueError, match="'nope' is not registered"):
        worker.run(batch, GREEDY)
    batch = _batch(["q"])
    del batch.non_tensor_batch["raw_prompt"]
    with pytest.raises(KeyError, match="return_raw_chat"):
        worker.run(batch, GREEDY)


@register("echo_twice_agent")
class EchoTwiceAgent(AgentLoopBase):
    """A custom loop: two generations, the second seeing the first; custom turn ids."""

    async def run(self, sampling_params, **kwargs):
        prompt = self.renderer.prompt_ids(kwargs["raw_prompt"])
        a = await self.server_manager.generate(
            "x", prompt_ids=prompt, sampling_params={**sampling_params, "max_tokens": 8}
        )
        return AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=a.token_ids,
            response_mask=[1] * len(a.token_ids),
            response_logprobs=a.log_probs,
            num_turns=2,
            extra_fields={"turn_ids": [7] * len(a.token_ids)},
        )


def test_custom_agent_loop(calc_tok, tmp_path):
    worker, _ = _worker(calc_tok, {"q": ["hi"]}, tmp_path)
    out = worker.run(_batch(["q"], agent="echo_twice_agent"), GREEDY)
    n = int(out.batch["response_mask"][0].sum())
    assert out.batch["turn_ids"][0, :n].tolist() == [7] * n


def test_prompt_longer_than_prompt_length_is_an_error(calc_tok, tmp_path):
    worker, _ = _worker(calc_tok, {"x" * 40: ["a"]}, tmp_path, prompt_length=16)
    with pytest.raises(ValueError, match="rollout.prompt_length=16"):
        worker.run(_batch(["x" * 40]), GREEDY)


def test_derive_turns():
    assert derive_turns([1, 1, 0, 0, 1, 0]) == ([0, 0, -1, -1, 1, -1], [0, 1, 0, 0, 1, 0])
    assert derive_turns([]) == ([], [])


# ---------------------------------------------------------------------------------------------
# tokenization sanity check against one full render, per template


def test_sanity_check_passes_for_prefix_stable_template(calc_tok):
    r = ChatRenderer(calc_tok)
    msgs = [{"role": "user", "content": "1+1"}]
    ids = r.prompt_ids(msgs)
    gen = calc_tok("<tool_call>x</tool_call>", add_special_tokens=False)["input_ids"] + [calc_tok.eos_token_id]
    obs = r.observation_ids([{"role": "tool", "content": "2"}])
    msgs += [{"role": "assistant", "content": "<tool_call>x</tool_call>"}, {"role": "tool", "content": "2"}]
    gen2 = calc_tok("2", add_special_tokens=False)["input_ids"] + [calc_tok.eos_token_id]
    msgs.append({"role": "assistant", "content": "2"})
    traj = ids + gen + obs + gen2
    assert r.sanity_check("strict", traj, r.reference_ids(msgs, True, gen2))
    # a final turn cut by the budget (no EOS): compared with the render up to its generation prompt
    assert r.sanity_check("strict", traj[:-1], r.reference_ids(msgs, False, gen2[:-1]))


def test_sanity_check_reports_mismatch_for_a_stripping_template(calc_tok, caplog):
    import copy

    tok = copy.deepcopy(calc_tok)
    # this template strips assistant content: a generated leading space is lost in a full render
    tok.chat_template = tok.chat_template.replace(
        "message['content']", "(message['content'] | trim if message['role'] == 'assistant' else message['content'])"
    )
    r = ChatRenderer(tok)
    msgs = [{"role": "user", "content": "q"}]
    gen = tok(" 7", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    traj = r.prompt_ids(msgs) + gen
    msgs.append({"role": "assistant", "content": " 7"})
    ref = r.reference_ids(msgs, True, gen)
    with caplog.at_level("WARNING"):
        assert not r.sanity_check("strict", traj, ref)
    assert "tokenization sanity check (strict) failed" in caplog.text
    assert r.sanity_check("ignore_strippable", traj, ref)
    assert r.sanity_check("disable", traj, ref)


def test_observation_diff_keeps_text_after_end_token():
    """Qwen-style templates put a newline after the end-of-turn token: it belongs to the observation."""
    from transformers import PreTrainedTokenizerFast

    tok = load_build_script().build_calculator_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}{{ '<|' ~ m['role'] ~ '|>' ~ m['content'] ~ '<|end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )
    assert isinstance(tok, PreTrainedTokenizerFast)
    r = ChatRenderer(tok)
    obs = r.observation_ids([{"role": "tool", "content": "5"}])
    assert tok.decode(obs, skip_special_tokens=False) == "\n<|tool|>5<|end|>\n<|assistant|>"
