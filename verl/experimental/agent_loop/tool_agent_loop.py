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
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    new_request_id,
    register,
)

__all__ = ["ToolAgentLoop", "truncate_text"]

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


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        mt = self.rollout_config.multi_turn
        budget = int(self.rollout_config.response_length)
        raw = kwargs.get("raw_prompt")
        if raw is None:
            raise KeyError("tool_agent needs the chat messages of each sample: set data.return_raw_chat=True")
        messages = [dict(m) for m in raw]
        tools_kwargs = kwargs.get("tools_kwargs") or {}
        prompt_ids = self.renderer.prompt_ids(messages)
        response_ids: list[int] = []
        response_mask: list[int] = []
        logprobs: list[float] = []
        assistant_turns = user_turns = 0
        trace = {"turns": [], "stop": None}
        n_calls = n_errors = 0
        latencies: list[float] = []
        gen_s = tool_s = 0.0
        instances: dict[str, str] = {}
        cut = False
        ended_with_eos = True
        last_generated: list[int] | None = None
        request_id = new_request_id()
        try:
            while True:
                left = budget - len(response_ids)
                if left <= 0:
                    cut, trace["stop"] = True, "length_budget"
                    break
                t0 = time.perf_counter()
                out = await self.server_manager.generate(
                    request_id,
                    prompt_ids=prompt_ids + response_ids,
                    sampling_params={**sampling_params, "max_tokens": left},
                )
                gen_s += time.perf_counter() - t0
                ids = list(out.token_ids)
                response_ids += ids
                response_mask += [1] * len(ids)
                logprobs += [float(x) for x in out.log_probs]
                assistant_turns += 1
                last_generated = ids
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                messages.append({"role": "assistant", "content": text})
                turn = {"assistant": text, "calls": []}
                trace["turns"].append(turn)
                if out.stop_reason != "eos":
                    cut, ended_with_eos, trace["stop"] = True, False, "length_budget"
                    break
                if mt.max_assistant_turns and assistant_turns >= mt.max_assistant_turns:
                    trace["stop"] = "max_assistant_turns"
                    break
                _, calls = await self.tool_parser.extract_tool_calls(ids)
                if not calls:
                    trace["stop"] = "answer"
                    break
                if mt.max_user_turns and user_turns >= mt.max_user_turns:
                    trace["stop"] = "max_user_turns"
                    break
                t1 = time.perf_counter()
                limit = max(1, int(mt.max_parallel_calls or 1))
                results = await asyncio.gather(
                    *(self._call(c, i < limit, limit, instances, tools_kwargs) for i, c in enumerate(calls))
                )
                tool_s += time.perf_counter() - t1
                tool_msgs = []
                for call, (result, is_error, latency) in zip(calls, results, strict=True):
                    n_calls += 1
                    n_errors += int(is_error)
                    latencies.append(latency)
                    result = truncate_text(result, int(mt.max_tool_response_length), mt.tool_response_truncate_side)
                    tool_msgs.append({"role": "tool", "content": result})
                    turn["calls"].append(
                        {
                            "name": call.name,
                            "arguments": call.arguments,
                            "result": result,
                            "error": is_error,
                            "latency_s": latency,
                        }
                    )
                obs = self.renderer.observation_ids(tool_msgs)
                if len(response_ids) + len(obs) >= budget:
                    # the observation and at least one generated token must fit
                    cut, trace["stop"] = True, "length_budget"
                    break
                response_ids += obs
                response_mask += [0] * len(obs)
                logprobs += [0.0] * len(obs)
                messages += tool_msgs
                user_turns += 1
        finally:
            for name, iid in instances.items():
                await self.tools[name].release(iid, **(tools_kwargs.get(name, {}) or {}).get("release_kwargs", {}))
        sanity_ok = None
        if mt.tokenization_sanity_check_mode != "disable":
            reference = self.renderer.reference_ids(messages, ended_with_eos, last_generated)
            sanity_ok = self.renderer.sanity_check(
                mt.tokenization_sanity_check_mode, prompt_ids + response_ids, reference
            )
        trace["tool_calls"] = n_calls
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=response_mask,
            response_logprobs=logprobs,
            num_turns=1 + assistant_turns + user_turns,
            metrics=AgentLoopMetrics(generate_sequences=gen_s, tool_calls=tool_s),
            extra_fields={
                "assistant_turns": assistant_turns,
                "tool_calls": n_calls,
                "tool_errors": n_errors,
                "tool_latencies": latencies,
                "cut_by_length": cut,
                "sanity_ok": sanity_ok,
                "trace": trace,
                "messages": messages,
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
            if call.name not in instances:
                iid, _ = await tool.create(None, **kw.get("create_kwargs", {}))
                instances[call.name] = iid
            response, _reward, metrics = await tool.execute(instances[call.name], args, **kw.get("execute_kwargs", {}))
        except Exception as exc:  # noqa: BLE001 - a failing tool is an observation, not a crashed rollout
            return f"Error: tool {call.name!r} raised {type(exc).__name__}: {exc}", True, time.perf_counter() - start
        if response.image is not None or response.video is not None:
            raise NotImplementedError(
                f"tool {call.name!r} returned an image/video; multimodal observations are not supported"
            )
        text = response.text or ""
        is_error = bool((metrics or {}).get("error", False)) or text.startswith("Error:")
        return text, is_error, time.perf_counter() - start
