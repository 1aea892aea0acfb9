"""The example files of docs/agent_loop.md run as documented: the tool yaml (a built-in and a custom
stateful BaseTool), the @function_tool file, and the environment agent loop registered through
agent_loop_config_path."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import load_build_script
from test_agent_loop import ScriptedServer, call

from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.protocol import DataProto
from verl.tools.function_tool import FUNCTION_TOOL_REGISTRY, normalize_function_tool_return
from verl.tools.tool_registry import load_all_tools
from verl.workers.config import AgentLoopConfig, MultiTurnConfig, RolloutConfig

REPO = Path(__file__).resolve().parents[2]
GREEDY = {"do_sample": False, "temperature": 0.0, "top_k": -1, "top_p": 1.0}


@pytest.fixture()
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # the examples name their files relative to the repository root
    saved = dict(FUNCTION_TOOL_REGISTRY)
    yield
    FUNCTION_TOOL_REGISTRY.clear()
    FUNCTION_TOOL_REGISTRY.update(saved)


@pytest.fixture(scope="module")
def tok():
    return load_build_script().build_calculator_tokenizer()


def _batch(users, agent, extra=None):
    raw = np.empty(len(users), dtype=object)
    ex = np.empty(len(users), dtype=object)
    for i, u in enumerate(users):
        raw[i] = [{"role": "user", "content": u}]
        ex[i] = (extra or [{}] * len(users))[i]
    return DataProto.from_dict(
        tensors={"d": torch.zeros(len(users), 1)},
        non_tensors={"raw_prompt": raw, "agent_name": np.array([agent] * len(users), dtype=object), "extra_info": ex},
    )


def test_example_tools_load_and_run(in_repo):
    tools = load_all_tools("docs/examples/agent_tools.yaml", "docs/examples/agent_function_tools.py")
    by_name = {t.name: t for t in tools}
    assert sorted(by_name) == ["calculator", "capital_of", "notebook", "word_count"]
    wc = by_name["word_count"].tool_schema.function
    assert wc.parameters.properties["text"].type == "string" and wc.parameters.required == ["text"]
    assert asyncio.run(by_name["capital_of"].call({"country": "Japan"})) == "Tokyo"
    assert normalize_function_tool_return(asyncio.run(by_name["word_count"].call({"text": "a b c"})))[0].text == "3"
    nb = by_name["notebook"]

    async def notebook():
        iid, _ = await nb.create(None, first_note="start")
        r1 = await nb.execute(iid, {"note": "x"})
        r2 = await nb.execute(iid, {"note": "y"})
        r3 = await nb.execute(iid, {"note": "z"})
        reward = await nb.calc_reward(iid)
        await nb.release(iid)
        return r1[0].text, r2[0].text, r3, reward, iid in nb.notes

    t1, t2, (r3, _, m3), reward, alive = asyncio.run(notebook())
    assert (t1, t2) == ("start | x", "start | x | y") and m3["error"] and "full" in r3.text
    assert reward == 3.0 and not alive


def test_example_tools_in_the_tool_agent_loop(in_repo, tok):
    mt = MultiTurnConfig(
        enable=True,
        tool_config_path="docs/examples/agent_tools.yaml",
        function_tool_path="docs/examples/agent_function_tools.py",
        max_parallel_calls=2,
    )
    cfg = RolloutConfig(prompt_length=16, response_length=400, multi_turn=mt)
    scripts = {"q": [call("notebook", note="a") + call("capital_of", country="Kenya"), "done"]}
    worker = AgentLoopWorker(None, cfg, ScriptedServer(tok, scripts), tok)
    out = worker.run(
        _batch(["q"], "tool_agent", [{"tools_kwargs": {"notebook": {"create_kwargs": {"first_note": "hello"}}}}]),
        GREEDY,
    )
    calls = out.non_tensor_batch["agent_trace"][0]["turns"][0]["calls"]
    assert [c["result"] for c in calls] == ["hello | a", "Nairobi"]
    assert not any(c["error"] for c in calls)


def test_example_environment_loop(in_repo, tok):
    cfg = RolloutConfig(
        prompt_length=16,
        response_length=64,
        multi_turn=MultiTurnConfig(enable=True),
        agent=AgentLoopConfig(agent_loop_config_path="docs/examples/agent_loops.yaml"),
    )
    scripts = {"guess": ["50", "75", "62", "1"], "hard": ["1", "2", "3", "4"]}
    worker = AgentLoopWorker(None, cfg, ScriptedServer(tok, scripts), tok)
    out = worker.run(_batch(["guess", "hard"], "guess_number_agent", [{"secret": 62}, {"secret": 99}]), GREEDY)
    traces = out.non_tensor_batch["agent_trace"]
    assert traces[0]["guesses"] == [50, 75, 62] and traces[1]["guesses"] == [1, 2, 3, 4]
    rm = out.batch["rm_scores"]
    assert rm.sum(-1).tolist() == [1.0, 0.0]
    last = int(out.batch["response_mask"][0].nonzero().max())
    assert rm[0, last] == 1.0  # the episode reward sits on the last generated token
    text = tok.decode(out.batch["responses"][0].tolist(), skip_special_tokens=False)
    assert "<|user|>higher<|end|><|assistant|>" in text and "<|user|>lower<|end|><|assistant|>" in text
    assert out.batch["turn_ids"][0].max() == 2
