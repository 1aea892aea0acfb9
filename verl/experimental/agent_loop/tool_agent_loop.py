"""`tool_agent`: assistant turns interleaved with tool calls until an answer without a call.

Per trajectory (keys under `actor_rollout_ref.rollout.multi_turn`):

1. prompt ids = the chat-template render of `raw_prompt` (with the tool schemas when
   `use_inference_chat_template`);
2. generate a turn with the remaining budget `response_length - len(response)`; its ids get mask 1
   and the sampler's log-probs; the turn stops at EOS or at the budget (a turn cut by the budget
   ends the trajectory: no call is read from a cut turn);
3. parse the turn's calls (`format`); no call: done. Otherwise run up to `max_parallel_calls`
   calls concurrently (more are answered with an error observation); an unknown tool name
   (``Unknown function 'x'. Available tools: [...]``), arguments that are not JSON
   (``Invalid JSON in arguments for 'x': ...``), a malformed call, a tool that raises
   (``Error executing tool 'x': ...``) or returns an error are observations the model sees, and
   the loop goes on; each result longer than `max_tool_response_length` characters is cut on
   `tool_response_truncate_side` (`left`: the beginning is cut, `right`: the end, `middle`); a
   call the model gave an id (`FunctionCall.tool_call_id`) is answered by a tool message with
   that `tool_call_id`;
4. the observation ids (tool messages + next generation prompt, as a render diff) get mask 0;
   if they do not fit in the budget the trajectory ends there (cut by the length budget);
5. stop after `max_assistant_turns` assistant turns or `max_user_turns` observation turns.

Tools are created on their first call in the trajectory with `tools_kwargs[name]["create_kwargs"]`
and released at the end (always, also on error); `execute_kwargs` / `calc_reward_kwargs` /
`release_kwargs` are passed likewise, and `execute` also gets `agent_data=` (the `Trajectory`), as
upstream's. (Upstream creates and releases an instance around every call; one instance per
trajectory lets a stateful tool remember earlier calls.) `FunctionTool`s have no instance.

The loop is upstream's state machine (`AgentState`): PENDING (render the prompt) -> GENERATING
(one assistant turn) -> PROCESSING_TOOLS (run its calls) -> GENERATING ... -> TERMINATED.
The output's `extra_fields` carry upstream's `turn_scores` and `tool_rewards` (the step rewards
tools returned, in call order) besides the trace and counters of this project.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    new_request_id,
    register,
)
from verl.tools.function_tool import FunctionTool, normalize_function_tool_return
from verl.tools.schemas import OpenAIFunctionCallSchema, OpenAIFunctionParsedSchema, ToolResponse

logger = logging.getLogger(__name__)

__all__ = ["AgentData", "AgentState", "ToolAgentLoop", "Trajectory", "truncate_text"]

TRUNCATE_SIDES = ("left", "right", "middle")
TRUNCATION_MARK = "...(truncated)..."  # between the kept head and tail (`middle`)
# upstream's markers: where the text was cut
_SIDE_MARKS = {"left": "(truncated)...", "right": "...(truncated)", "middle": TRUNCATION_MARK}


class AgentState(Enum):
    """The states of the tool agent loop (upstream's names)."""

    PENDING = "pending"
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    TERMINATED = "terminated"


def truncate_text(text: str, limit: int, side: str) -> str:
    """Keep at most `limit` characters of `text` plus a marker where it was cut: ``(truncated)...``
    before the kept tail (`left`), ``...(truncated)`` after the kept head (`right`),
    ``...(truncated)...`` between head and tail (`middle`)."""
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"multi_turn.tool_response_truncate_side={side!r}; expected one of {list(TRUNCATE_SIDES)}")
    if limit is None or limit < 0 or len(text) <= limit:
        return text
    mark = _SIDE_MARKS[side]
    if side == "left":
        return mark + text[len(text) - limit :]
    if side == "right":
        return text[:limit] + mark
    head = (limit + 1) // 2
    return text[:head] + mark + text[len(text) - (limit - head) :]


@dataclass
class Trajectory:
    """The state of one `tool_agent` trajectory while it runs.

    `response_ids` / `response_mask` / `logprobs` grow together (one entry per token: generated
    ids have mask 1 and the sampler's log-prob, observation ids mask 0 and log-prob 0);
    `messages` is the conversation so far; `stop` is None while the trajectory goes on, then the
    reason it ended (`answer`, `length_budget`, `max_assistant_turns`, `max_user_turns`).
    """

    messages: list[dict]
    prompt_ids: list[int]
    tools_kwargs: dict
    request_id: str = field(default_factory=new_request_id)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    n_calls: int = 0
    n_errors: int = 0
    latencies: list[float] = field(default_factory=list)
    gen_s: float = 0.0
    tool_s: float = 0.0
    instances: dict[str, str] = field(default_factory=dict)  # tool name -> instance id
    tool_calls: list = field(default_factory=list)  # the calls of the last assistant turn
    tool_rewards: list[float] = field(default_factory=list)
    turn_scores: list[float] = field(default_factory=list)
    extra_fields: dict[str, Any] = field(default_factory=dict)  # tools may keep session data here
    cut: bool = False
    ended_with_eos: bool = True
    last_generated: list[int] | None = None
    turns: list[dict] = field(default_factory=list)
    stop: str | None = None

    def append(self, ids: list[int], generated: bool, logprobs: list[float] | None = None) -> None:
        self.response_ids += ids
        self.response_mask += [int(generated)] * len(ids)
        self.logprobs += [float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids)

    def end(self, reason: str, cut: bool = False) -> None:
        self.stop = reason
        self.cut = self.cut or cut


# upstream's name for the per-trajectory state a tool's `execute(..., agent_data=...)` receives
AgentData = Trajectory


async def run_tool(tool, name: str, args: dict, tools_kwargs: dict, agent_data) -> tuple:
    """`tool` called with `args`: a `FunctionTool` directly (its return normalised), a `BaseTool`
    through its instance in `agent_data.instances` (created on first use), or, when `agent_data`
    keeps no instances, through an instance created and released around this call."""
    if isinstance(tool, FunctionTool):  # stateless: no instance to create or release
        return normalize_function_tool_return(await tool.call(args))
    kw = tools_kwargs.get(name, {}) or {}
    instances = getattr(agent_data, "instances", None)
    if instances is None:  # upstream's lifecycle: one instance around this call
        iid, _ = await tool.create(None, **kw.get("create_kwargs", {}))
        try:
            return await tool.execute(iid, args, agent_data=agent_data, **kw.get("execute_kwargs", {}))
        finally:
            await tool.release(iid, **kw.get("release_kwargs", {}))
    if name not in instances:
        instances[name], _ = await tool.create(None, **kw.get("create_kwargs", {}))
    return await tool.execute(instances[name], args, agent_data=agent_data, **kw.get("execute_kwargs", {}))


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """Tool-using trajectories (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        mt = self.rollout_config.multi_turn
        self.max_user_turns = mt.max_user_turns
        self.max_assistant_turns = mt.max_assistant_turns
        self.max_parallel_calls = max(1, int(mt.max_parallel_calls or 1))
        self.max_tool_response_length = mt.max_tool_response_length
        self.tool_response_truncate_side = mt.tool_response_truncate_side
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        raw = kwargs.get("raw_prompt")
        if raw is None:
            raise KeyError("tool_agent needs the chat messages of each sample: set data.return_raw_chat=True")
        traj = Trajectory([dict(m) for m in raw], [], kwargs.get("tools_kwargs") or {})
        state = AgentState.PENDING
        try:
            while state != AgentState.TERMINATED:
                if state == AgentState.PENDING:
                    traj.prompt_ids = self.renderer.prompt_ids(traj.messages)
                    state = AgentState.GENERATING
                elif state == AgentState.GENERATING:
                    state = await self._handle_generating_state(traj, sampling_params)
                else:
                    state = await self._handle_processing_tools_state(traj)
        finally:
            for name, iid in traj.instances.items():
                kw = traj.tools_kwargs.get(name, {}) or {}
                await self.tools[name].release(iid, **kw.get("release_kwargs", {}))
        return self._output(traj)

    async def _handle_generating_state(self, traj: Trajectory, sampling_params: dict[str, Any]) -> AgentState:
        """Generate one turn with what is left of the budget; PROCESSING_TOOLS when it calls
        tools, TERMINATED when the budget, a turn limit or an answer without a call ends it."""
        left = self.response_length - len(traj.response_ids)
        if left <= 0:
            traj.end("length_budget", cut=True)
            return AgentState.TERMINATED
        t0 = time.perf_counter()
        out = await self.server_manager.generate(
            traj.request_id,
            prompt_ids=traj.prompt_ids + traj.response_ids,
            sampling_params={**sampling_params, "max_tokens": left},
        )
        traj.gen_s += time.perf_counter() - t0
        ids = list(out.token_ids)
        traj.append(ids, generated=True, logprobs=out.log_probs)
        traj.assistant_turns += 1
        traj.last_generated = ids
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        # the generated text verbatim (calls included): re-rendering the conversation gives the
        # trained tokens back on any template (the sanity check relies on it)
        traj.messages.append({"role": "assistant", "content": text})
        traj.turns.append({"assistant": text, "calls": []})
        traj.tool_calls = []
        if out.stop_reason != "eos":
            traj.ended_with_eos = False
            traj.end("length_budget", cut=True)
        elif self.max_assistant_turns and traj.assistant_turns >= self.max_assistant_turns:
            traj.end("max_assistant_turns")
        else:
            content, traj.tool_calls = await self.tool_parser.extract_tool_calls(ids)
            traj.turns[-1]["message"] = self._build_assistant_message(content, traj)
            if not traj.tool_calls:
                traj.end("answer")
            elif self.max_user_turns and traj.user_turns >= self.max_user_turns:
                traj.end("max_user_turns")
        return AgentState.TERMINATED if traj.stop is not None else AgentState.PROCESSING_TOOLS

    async def _handle_processing_tools_state(self, traj: Trajectory) -> AgentState:
        """Run the calls of the last turn (at most `max_parallel_calls`, concurrently) and append
        their results as one observation; TERMINATED when it does not fit the budget."""
        calls, limit = traj.tool_calls, self.max_parallel_calls
        t1 = time.perf_counter()
        results = await asyncio.gather(
            *(
                self._call_tool(c, traj.tools_kwargs, traj) if i < limit else self._over_limit(limit)
                for i, c in enumerate(calls)
            )
        )
        traj.tool_s += time.perf_counter() - t1
        tool_msgs = []
        for i, (call, (response, reward, metrics)) in enumerate(zip(calls, results, strict=True)):
            is_error = bool(metrics.get("error", False)) or (response.text or "").startswith("Error:")
            latency = float(metrics.get("latency_s", 0.0))
            traj.n_calls += 1
            traj.n_errors += int(is_error)
            traj.latencies.append(latency)
            if i < limit:  # one step reward per call that ran (upstream's tool_rewards)
                traj.tool_rewards.append(float(reward))
            message = {"role": "tool", "content": response.text or ""}
            if call.tool_call_id is not None:
                message["tool_call_id"] = call.tool_call_id
            tool_msgs.append(message)
            traj.turns[-1]["calls"].append(
                {
                    "name": call.name,
                    "arguments": call.arguments,
                    "tool_call_id": call.tool_call_id,
                    "result": message["content"],
                    "error": is_error,
                    "latency_s": latency,
                }
            )
        obs = self.renderer.observation_ids(tool_msgs)
        if len(traj.response_ids) + len(obs) >= self.response_length:
            # the observation and at least one generated token must fit
            traj.end("length_budget", cut=True)
            return AgentState.TERMINATED
        traj.append(obs, generated=False)
        traj.messages += tool_msgs
        traj.user_turns += 1
        return AgentState.GENERATING

    def _output(self, traj: Trajectory) -> AgentLoopOutput:
        mode = self.rollout_config.multi_turn.tokenization_sanity_check_mode
        sanity_ok = None
        if mode != "disable":
            reference = self.renderer.reference_ids(traj.messages, traj.ended_with_eos, traj.last_generated)
            sanity_ok = self.renderer.sanity_check(mode, traj.prompt_ids + traj.response_ids, reference)
        trace = {"turns": traj.turns, "stop": traj.stop, "tool_calls": traj.n_calls}
        return AgentLoopOutput(
            prompt_ids=traj.prompt_ids,
            response_ids=traj.response_ids,
            response_mask=traj.response_mask,
            response_logprobs=traj.logprobs,
            num_turns=1 + traj.assistant_turns + traj.user_turns,
            metrics=AgentLoopMetrics(generate_sequences=traj.gen_s, tool_calls=traj.tool_s),
            extra_fields={
                **traj.extra_fields,
                "turn_scores": traj.turn_scores,
                "tool_rewards": traj.tool_rewards,
                "assistant_turns": traj.assistant_turns,
                "tool_calls": traj.n_calls,
                "tool_errors": traj.n_errors,
                "tool_latencies": traj.latencies,
                "cut_by_length": traj.cut,
                "sanity_ok": sanity_ok,
                "trace": trace,
                "messages": traj.messages,
            },
        )

    def _build_assistant_message(self, content: str, agent_data) -> dict[str, Any]:
        """The turn as an OpenAI-format assistant message: `content` without the call markup and
        `tool_calls` (`{"type": "function", "function": {name, arguments}, "id"}`, the id when
        the model gave one; arguments decoded when they are a JSON object, else the raw text),
        for the first `max_parallel_calls` calls. Kept in the trace (`turns[i]["message"]`);
        the conversation that is rendered keeps the generated text verbatim."""
        message: dict[str, Any] = {"role": "assistant", "content": content or ""}
        if not agent_data.tool_calls:
            return message
        tool_calls = []
        for call in agent_data.tool_calls[: self.max_parallel_calls]:
            decoded, bad = OpenAIFunctionCallSchema.from_openai_function_parsed_schema(
                OpenAIFunctionParsedSchema(name=call.name, arguments=call.arguments)
            )
            function = {"name": call.name, "arguments": call.arguments} if bad else decoded.model_dump()
            entry: dict[str, Any] = {"type": "function", "function": function}
            if call.tool_call_id is not None:
                entry["id"] = call.tool_call_id
            tool_calls.append(entry)
        message["tool_calls"] = tool_calls
        return message

    @staticmethod
    async def _over_limit(limit: int) -> tuple[ToolResponse, float, dict]:
        text = f"Error: at most {limit} tool call(s) per turn (multi_turn.max_parallel_calls); this call was not run"
        return ToolResponse(text=text), 0.0, {"error": True}

    async def _call_tool(self, tool_call, tools_kwargs: dict[str, Any], agent_data) -> tuple[ToolResponse, float, dict]:
        """Run one call: (observation, step reward, metrics). Every failure is an observation with
        reward 0 and `metrics["error"]`; `metrics["latency_s"]` is the call's wall time.

        `agent_data` is the trajectory: a `BaseTool`'s instance is created on its first call and
        kept in `agent_data.instances` (released at the end of the trajectory); an `agent_data`
        without `instances` gets upstream's lifecycle, an instance created and released around
        the call. The result is cut to `max_tool_response_length` characters."""
        start = time.perf_counter()
        name = tool_call.name
        if getattr(tool_call, "error", None):
            return ToolResponse(text=f"Error: {tool_call.error}"), 0.0, {"error": True}
        tool = self.tools.get(name)
        if tool is None:
            msg = f"Unknown function '{name}'. Available tools: {sorted(self.tools)}"
            return ToolResponse(text=msg), 0.0, {"error": True}
        try:
            args = json.loads(tool_call.arguments)
            if not isinstance(args, dict):
                raise TypeError(f"expected a JSON object, got {type(args).__name__}")
        except (json.JSONDecodeError, TypeError) as exc:
            return ToolResponse(text=f"Invalid JSON in arguments for '{name}': {exc}"), 0.0, {"error": True}
        try:
            response, reward, metrics = await run_tool(tool, name, args, tools_kwargs, agent_data)
        except Exception as exc:  # noqa: BLE001 - a failing tool is an observation, not a crashed rollout
            logger.warning("Error executing tool '%s': %s: %s", name, type(exc).__name__, exc)
            text = f"Error executing tool '{name}': {type(exc).__name__}: {exc}"
            return ToolResponse(text=text), 0.0, {"error": True, "latency_s": time.perf_counter() - start}
        if response.image or response.video:
            raise NotImplementedError(
                f"tool {name!r} returned an image/video; multimodal observations are not supported"
            )
        text = truncate_text(response.text or "", self.max_tool_response_length, self.tool_response_truncate_side)
        metrics = {**(metrics or {}), "latency_s": time.perf_counter() - start}
        return ToolResponse(text=text), 0.0 if reward is None else float(reward), metrics
