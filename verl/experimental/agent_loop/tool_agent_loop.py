"""`tool_agent`: assistant turns interleaved with tool calls until an answer without a call.

Per trajectory (keys under `actor_rollout_ref.rollout.multi_turn`):

1. prompt ids = the chat-template render of `raw_prompt` (with the tool schemas when
   `use_inference_chat_template`);
2. generate a turn with the remaining budget `response_length - len(response)`; its ids get mask 1
   and the sampler's log-probs; the turn stops at EOS or at the budget (a turn cut by the budget
   ends the trajectory: no call is read from a cut turn);
3. parse the turn's calls (`format`); no call: done. Otherwise run up to `max_parallel_calls`
   calls concurrently (more are answered with an error observation); an unknown tool name, a
   malformed call, a tool that raises or returns an error are observations the model sees;
   each result longer than `max_tool_response_length` characters is cut on
   `tool_response_truncate_side` (`left`: the beginning is cut, `right`: the end, `middle`);
4. the observation ids (tool messages + next generation prompt, as a render diff) get mask 0;
   if they do not fit in the budget the trajectory ends there (cut by the length budget);
5. stop after `max_assistant_turns` assistant turns or `max_user_turns` observation turns.

Tools are created on their first call in the trajectory with `tools_kwargs[name]["create_kwargs"]`
and released at the end (always, also on error); `execute_kwargs` / `calc_reward_kwargs` /
`release_kwargs` are passed likewise.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    new_request_id,
    register,
)
from verl.tools.function_tool import FunctionTool, normalize_function_tool_return

__all__ = ["ToolAgentLoop", "Trajectory", "truncate_text"]

TRUNCATE_SIDES = ("left", "right", "middle")
TRUNCATION_MARK = "...(truncated)..."


def truncate_text(text: str, limit: int, side: str) -> str:
    """Keep at most `limit` characters of `text` plus a marker, cutting on `side`."""
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"multi_turn.tool_response_truncate_side={side!r}; expected one of {list(TRUNCATE_SIDES)}")
    if limit is None or limit < 0 or len(text) <= limit:
        return text
    if side == "left":
        return TRUNCATION_MARK + text[len(text) - limit :]
    if side == "right":
        return text[:limit] + TRUNCATION_MARK
    head = (limit + 1) // 2
    return text[:head] + TRUNCATION_MARK + text[len(text) - (limit - head) :]


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


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        raw = kwargs.get("raw_prompt")
        if raw is None:
            raise KeyError("tool_agent needs the chat messages of each sample: set data.return_raw_chat=True")
        messages = [dict(m) for m in raw]
        traj = Trajectory(messages, self.renderer.prompt_ids(messages), kwargs.get("tools_kwargs") or {})
        try:
            while traj.stop is None:
                calls = await self._assistant_turn(traj, sampling_params)
                if traj.stop is None:
                    await self._tool_turn(traj, calls)
        finally:
            for name, iid in traj.instances.items():
                kw = traj.tools_kwargs.get(name, {}) or {}
                await self.tools[name].release(iid, **kw.get("release_kwargs", {}))
        return self._output(traj)

    async def _assistant_turn(self, traj: Trajectory, sampling_params: dict[str, Any]) -> list:
        """Generate one turn with what is left of the budget; returns its calls, or ends the
        trajectory (budget, turn limits, an answer without a call)."""
        mt = self.rollout_config.multi_turn
        left = int(self.rollout_config.response_length) - len(traj.response_ids)
        if left <= 0:
            traj.end("length_budget", cut=True)
            return []
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
        traj.messages.append({"role": "assistant", "content": text})
        traj.turns.append({"assistant": text, "calls": []})
        if out.stop_reason != "eos":
            traj.ended_with_eos = False
            traj.end("length_budget", cut=True)
            return []
        if mt.max_assistant_turns and traj.assistant_turns >= mt.max_assistant_turns:
            traj.end("max_assistant_turns")
            return []
        _, calls = await self.tool_parser.extract_tool_calls(ids)
        if not calls:
            traj.end("answer")
        elif mt.max_user_turns and traj.user_turns >= mt.max_user_turns:
            traj.end("max_user_turns")
        return calls

    async def _tool_turn(self, traj: Trajectory, calls: list) -> None:
        """Run the calls of the last turn (at most `max_parallel_calls`, concurrently) and append
        their results as one observation, or end the trajectory when it does not fit."""
        mt = self.rollout_config.multi_turn
        t1 = time.perf_counter()
        limit = max(1, int(mt.max_parallel_calls or 1))
        results = await asyncio.gather(
            *(self._call(c, i < limit, limit, traj.instances, traj.tools_kwargs) for i, c in enumerate(calls))
        )
        traj.tool_s += time.perf_counter() - t1
        tool_msgs = []
        for call, (result, is_error, latency) in zip(calls, results, strict=True):
            traj.n_calls += 1
            traj.n_errors += int(is_error)
            traj.latencies.append(latency)
            result = truncate_text(result, int(mt.max_tool_response_length), mt.tool_response_truncate_side)
            tool_msgs.append({"role": "tool", "content": result})
            traj.turns[-1]["calls"].append(
                {
                    "name": call.name,
                    "arguments": call.arguments,
                    "result": result,
                    "error": is_error,
                    "latency_s": latency,
                }
            )
        obs = self.renderer.observation_ids(tool_msgs)
        if len(traj.response_ids) + len(obs) >= int(self.rollout_config.response_length):
            # the observation and at least one generated token must fit
            traj.end("length_budget", cut=True)
            return
        traj.append(obs, generated=False)
        traj.messages += tool_msgs
        traj.user_turns += 1

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

    async def _call(
        self, call, allowed: bool, limit: int, instances: dict, tools_kwargs: dict
    ) -> tuple[str, bool, float]:
        """Run one call; returns (observation text, is_error, seconds)."""
        start = time.perf_counter()
        if not allowed:
            return (
                f"Error: at most {limit} tool call(s) per turn (multi_turn.max_parallel_calls); this call was not run",
                True,
                0.0,
            )
        if call.error:
            return f"Error: {call.error}", True, 0.0
        tool = self.tools.get(call.name)
        if tool is None:
            return f"Error: unknown tool {call.name!r}; available tools: {sorted(self.tools)}", True, 0.0
        try:
            args = json.loads(call.arguments) if call.arguments else {}
        except json.JSONDecodeError as exc:
            return f"Error: arguments are not valid JSON ({exc.msg})", True, 0.0
        kw = tools_kwargs.get(call.name, {}) or {}
        try:
            if isinstance(tool, FunctionTool):  # stateless: no instance to create or release
                response, _reward, metrics = normalize_function_tool_return(await tool.call(args))
            else:
                if call.name not in instances:
                    iid, _ = await tool.create(None, **kw.get("create_kwargs", {}))
                    instances[call.name] = iid
                execute_kwargs = kw.get("execute_kwargs", {})
                response, _reward, metrics = await tool.execute(instances[call.name], args, **execute_kwargs)
        except Exception as exc:  # noqa: BLE001 - a failing tool is an observation, not a crashed rollout
            return f"Error: tool {call.name!r} raised {type(exc).__name__}: {exc}", True, time.perf_counter() - start
        if response.image is not None or response.video is not None:
            raise NotImplementedError(
                f"tool {call.name!r} returned an image/video; multimodal observations are not supported"
            )
        text = response.text or ""
        is_error = bool((metrics or {}).get("error", False)) or text.startswith("Error:")
        return text, is_error, time.perf_counter() - start
