"""Agent loops: one coroutine per trajectory, token in / token out.

An agent loop subclasses `AgentLoopBase`, is registered by name, and implements
``async run(sampling_params, **kwargs) -> AgentLoopOutput``; `kwargs` are the sample's non-tensor
fields (`raw_prompt`, `raw_prompt_ids`, `extra_info`, `tools_kwargs`, `index`, `agent_name`, ...).
It asks the generation server for each assistant turn::

    out = await self.server_manager.generate(
        request_id, prompt_ids=ids, sampling_params={**sampling_params, "max_tokens": k}
    )
    # out.token_ids, out.log_probs, out.stop_reason ("eos" | "length")

The dataset column `agent_name` selects the loop of each sample (default
`actor_rollout_ref.rollout.agent.default_agent_loop`); `agent.agent_loop_config_path` is a yaml list
of `{name, _target_}` entries that registers more loops by import path.

`AgentLoopWorker.generate_sequences` runs the loops of a batch concurrently and pads their outputs
into the rollout DataProto (widths `rollout.prompt_length` / `rollout.response_length`):

- `prompts` [b, P] left-padded, `responses` [b, R] right-padded: generated ids and observation ids
  in trajectory order; `input_ids` / `attention_mask` / `position_ids` [b, P + R] (attention 1 on
  every real token, observations included);
- `response_mask` [b, R]: 1 on generated tokens only; `rollout_log_probs` [b, R]: the sampler's
  log-probs there, 0 elsewhere;
- `turn_ids` [b, R]: the assistant-turn index (0, 1, ...) on generated tokens, -1 elsewhere;
  `step_end_mask` [b, R]: 1 on the last generated token of each turn (for `grpo_process`);
- non-tensor `__num_turns__`, `agent_trace` (turns, tool calls, results), and upstream's
  `turn_scores` / `tool_rewards` (lists, [] for loops without tools) per sample: the same keys
  whichever loop produced a sample, so batches of different loops concatenate; the per-batch
  metrics go to meta_info["metrics"].
"""

from __future__ import annotations

import asyncio
import importlib
import time
from abc import ABC, abstractmethod
from typing import Any
from uuid import uuid4

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

__all__ = [
    "AgentLoopBase",
    "AgentLoopMetrics",
    "AgentLoopOutput",
    "AgentLoopWorker",
    "DictConfigWrap",
    "ToolListWrap",
    "register",
    "get_agent_loop_class",
    "load_agent_loop_config",
]


class AgentLoopMetrics(BaseModel):
    """Seconds spent generating and in tool calls for one trajectory."""

    generate_sequences: float = 0.0
    tool_calls: float = 0.0


class AgentLoopOutput(BaseModel):
    """One trajectory.

    `response_ids` holds generated and observation ids in order; `response_mask` is 1 on the
    generated ones; `response_logprobs` (same length) the sampler's log-probs (0 on observations);
    `num_turns` counts messages (the prompt's user message, assistant turns, observation turns).
    `extra_fields` may hold `turn_ids` / `step_end_mask` (lists aligned with `response_ids`) to
    override the defaults derived from the mask, and anything else (kept per sample).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    reward_score: float | None = None
    num_turns: int = 0
    metrics: AgentLoopMetrics = AgentLoopMetrics()
    extra_fields: dict[str, Any] = {}

    def as_dict(self) -> dict[str, Any]:
        """The output as upstream's per-sample dict: `prompts` / `responses` / `response_mask`
        (int64 tensors), `rollout_log_probs` (float32, when there are log-probs), `rm_scores`
        (the `reward_score` on the last response position, when set), `num_turns`, `metrics`,
        and a copy of `extra_fields` from which `teacher_ids` / `teacher_logprobs` are promoted
        to top-level keys (the model itself is not changed)."""
        out: dict[str, Any] = {
            "prompts": torch.tensor(self.prompt_ids, dtype=torch.int64),
            "responses": torch.tensor(self.response_ids, dtype=torch.int64),
            "response_mask": torch.tensor(self.response_mask, dtype=torch.int64),
            "num_turns": self.num_turns,
            "metrics": self.metrics.model_dump(),
        }
        if self.response_logprobs is not None:
            out["rollout_log_probs"] = torch.tensor(self.response_logprobs, dtype=torch.float32)
        if self.reward_score is not None:
            rm_scores = torch.zeros(len(self.response_ids), dtype=torch.float32)
            if len(self.response_ids):
                rm_scores[-1] = self.reward_score
            out["rm_scores"] = rm_scores
        extra = dict(self.extra_fields)
        for key in ("teacher_ids", "teacher_logprobs"):
            if extra.get(key) is not None:
                out[key] = extra.pop(key)
        out["extra_fields"] = extra
        return out


class DictConfigWrap:
    """A config handed to agent loops inside a wrapper (`.config`), so that
    `hydra.utils.instantiate` does not resolve it recursively (upstream's name)."""

    def __init__(self, config):
        self.config = config


class ToolListWrap:
    """A tool list handed to agent loops inside a wrapper (`.tools`): `hydra.utils.instantiate`
    would turn each tool of a plain list into a DictConfig (upstream's name)."""

    def __init__(self, tools: list):
        self.tools = list(tools)


_agent_loop_registry: dict[str, dict] = {}


def register(agent_name: str):
    """Class decorator: make an `AgentLoopBase` subclass selectable as `agent_name`."""

    def decorator(cls: type) -> type:
        _agent_loop_registry[agent_name] = {"_target_": f"{cls.__module__}.{cls.__qualname__}", "_cls": cls}
        return cls

    return decorator


def _locate(target: str) -> type:
    """`pkg.module.Class`, or `/path/to/file.py:Class` (the file is imported once)."""
    try:
        if ".py:" in target:
            from verl.utils.import_utils import load_extern_type

            path, _, attr = target.rpartition(":")
            return load_extern_type(path, attr)
        module_name, _, attr = target.rpartition(".")
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError, FileNotFoundError) as exc:
        raise ValueError(f"agent loop _target_={target!r} cannot be imported: {exc}") from exc


def get_agent_loop_class(agent_name: str) -> type:
    if agent_name not in _agent_loop_registry:
        raise ValueError(
            f"agent loop {agent_name!r} is not registered; registered agent loops: {sorted(_agent_loop_registry)}"
        )
    entry = _agent_loop_registry[agent_name]
    if entry.get("_cls") is None:
        entry["_cls"] = _locate(entry["_target_"])
    return entry["_cls"]


def load_agent_loop_config(path: str | None) -> list[str]:
    """Register the loops listed in `agent.agent_loop_config_path` (yaml list of `{name, _target_}`)."""
    if not path:
        return []
    from omegaconf import OmegaConf

    entries = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not isinstance(entries, list):
        raise ValueError(
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path!r}: expected a yaml list of {{name, "
            "_target_}}"
        )
    names = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or "name" not in e or "_target_" not in e:
            raise ValueError(f"{path}: entry {i} must have 'name' and '_target_', got {e!r}")
        _agent_loop_registry[e["name"]] = {"_target_": e["_target_"], "_cls": _locate(e["_target_"])}
        names.append(e["name"])
    return names


class AgentLoopBase(ABC):
    """Base of agent loops.

    Args:
        trainer_config: wrapper whose `.config` has `actor_rollout_ref` (and `data` when known).
        server_manager: the generation server (`generate(request_id, *, prompt_ids, sampling_params)`).
        tokenizer / processor: the policy's.
        kwargs: `rollout_config` (the `RolloutConfig`), `tools` (loaded tools: a list or a
            `ToolListWrap`), `renderer`
            (`ChatRenderer`) and `tool_parser`, shared by the worker's loops.
    """

    def __init__(self, trainer_config, server_manager, tokenizer, processor=None, **kwargs):
        self.config = trainer_config.config
        self.rollout_config = kwargs.get("rollout_config") or self.config.actor_rollout_ref.rollout
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        tools = kwargs.get("tools") or []
        self.tools = {t.name: t for t in (tools.tools if isinstance(tools, ToolListWrap) else tools)}
        self.renderer = kwargs.get("renderer")
        self.tool_parser = kwargs.get("tool_parser")
        self.loop = asyncio.get_event_loop()

    @abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        """Produce one trajectory for the sample whose fields are `kwargs`."""


# ---------------------------------------------------------------------------------------------
# the worker: run a batch of loops, pad the outputs
# ---------------------------------------------------------------------------------------------


def _plain(value):
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    return value


def derive_turns(mask: list[int]) -> tuple[list[int], list[int]]:
    """`turn_ids` and `step_end_mask` from a response mask: each maximal run of 1s is one turn."""
    turn_ids, ends = [-1] * len(mask), [0] * len(mask)
    turn = -1
    for i, m in enumerate(mask):
        if m:
            if i == 0 or not mask[i - 1]:
                turn += 1
            turn_ids[i] = turn
            if i + 1 == len(mask) or not mask[i + 1]:
                ends[i] = 1
    return turn_ids, ends


class AgentLoopWorker:
    """Runs the agent loops of one rank's share of the batch.

    Args:
        config: the `actor_rollout_ref` section (what `trainer_config.config.actor_rollout_ref` shows).
        rollout_config: the `RolloutConfig` dataclass.
        server_manager: the generation server.
        tokenizer / processor: the policy's.
        chat_template_kwargs: `data.apply_chat_template_kwargs`.
    """

    def __init__(self, config, rollout_config, server_manager, tokenizer, processor=None, chat_template_kwargs=None):
        from omegaconf import OmegaConf

        import verl.experimental.agent_loop  # noqa: F401  (registers the built-in loops)
        from verl.experimental.agent_loop.chat import ChatRenderer
        from verl.experimental.agent_loop.tool_parser import ToolParser
        from verl.tools.tool_registry import load_all_tools

        self.rollout_config = rollout_config
        mt, agent = rollout_config.multi_turn, rollout_config.agent
        load_agent_loop_config(agent.agent_loop_config_path)
        self.tools = load_all_tools(mt.tool_config_path, mt.function_tool_path)
        schemas = [t.tool_schema.model_dump(exclude_none=True) for t in self.tools]
        # the inference template (the model's own) is always used for rendering here; with
        # use_inference_chat_template=False tools are not listed in the template (upstream's
        # training-template rendering strips them in the same way)
        template_tools = schemas if (schemas and mt.use_inference_chat_template) else None
        self.renderer = ChatRenderer(tokenizer, template_tools, chat_template_kwargs)
        self.tool_parser = ToolParser.get_tool_parser(mt.format, tokenizer, schemas)
        section = config if config is not None else {}
        try:
            container = OmegaConf.to_container(section, resolve=True) if not isinstance(section, dict) else section
        except Exception:  # noqa: BLE001 - a plain object: expose it as it is
            container = section
        self.trainer_config = DictConfigWrap(
            OmegaConf.create({"actor_rollout_ref": container}) if isinstance(container, dict) else container
        )
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor

    def _make_loop(self, name: str) -> AgentLoopBase:
        cls = get_agent_loop_class(name)
        return cls(
            trainer_config=self.trainer_config,
            server_manager=self.server_manager,
            tokenizer=self.tokenizer,
            processor=self.processor,
            rollout_config=self.rollout_config,
            tools=self.tools,
            renderer=self.renderer,
            tool_parser=self.tool_parser,
        )

    async def _run_all(
        self, samples: list[dict], names: list[str], sampling_params: dict, num_workers: int
    ) -> list[AgentLoopOutput]:
        # num_workers bounds the trajectories in flight at once (upstream: agent-loop worker processes)
        limit = asyncio.Semaphore(max(1, int(num_workers)) * 64)

        async def one(sample, name):
            async with limit:
                out = await self._make_loop(name).run(dict(sampling_params), **sample)
                if not isinstance(out, AgentLoopOutput):
                    raise TypeError(f"agent loop {name!r} returned {type(out).__name__}, expected AgentLoopOutput")
                return out

        return list(await asyncio.gather(*(one(s, n) for s, n in zip(samples, names, strict=True))))

    def run(self, prompts, sampling_params: dict):
        """Blocking: run every sample's loop (see the module docstring for the output)."""
        ntb = prompts.non_tensor_batch
        b = len(prompts)
        default = self.rollout_config.agent.default_agent_loop
        names = [str(n) if n is not None else default for n in ntb.get("agent_name", [default] * b)]
        for n in set(names):
            get_agent_loop_class(n)  # fail before any generation on an unknown name
        samples = []
        for i in range(b):
            s = {k: _plain(v[i]) for k, v in ntb.items()}
            extra = s.get("extra_info") if isinstance(s.get("extra_info"), dict) else {}
            s.setdefault("tools_kwargs", (extra or {}).get("tools_kwargs", {}) or {})
            s["validate"] = bool(prompts.meta_info.get("validate", False))
            samples.append(s)
        start = time.perf_counter()
        outputs = asyncio.run(self._run_all(samples, names, sampling_params, self.rollout_config.agent.num_workers))
        elapsed = time.perf_counter() - start
        return self.postprocess(outputs, elapsed)

    def postprocess(self, outputs: list[AgentLoopOutput], elapsed: float = 0.0):
        """Pad the loops' outputs into the batch layout of docs/agent_loop.md (prompts left-padded to
        `rollout.prompt_length`, responses right-padded to `rollout.response_length`)."""
        from verl.protocol import DataProto

        cfg = self.rollout_config
        P, R = int(cfg.prompt_length), int(cfg.response_length)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for i, o in enumerate(outputs):
            check_output(i, o, P, R)
        t = pad_outputs(outputs, P, R, pad)
        attention = torch.cat([t.pop("prompt_mask"), t.pop("response_attention")], dim=1)
        tensors = {
            "prompts": t["prompts"],
            "responses": t["responses"],
            "response_mask": t["response_mask"],
            "input_ids": torch.cat([t["prompts"], t["responses"]], dim=1),
            "attention_mask": attention,
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0) * attention,
            "turn_ids": t["turn_ids"],
            "step_end_mask": t["step_end_mask"],
        }
        if cfg.calculate_log_probs:
            tensors["rollout_log_probs"] = t["rollout_log_probs"]
        rm = reward_scores(outputs, t["response_mask"])
        if rm is not None:
            tensors["rm_scores"] = rm
        non_tensors = {
            key: np.empty(len(outputs), dtype=object)
            for key in ("__num_turns__", "agent_trace", "turn_scores", "tool_rewards")
        }
        for i, o in enumerate(outputs):
            non_tensors["__num_turns__"][i] = int(o.num_turns)
            non_tensors["agent_trace"][i] = o.extra_fields.get("trace")
            non_tensors["turn_scores"][i] = list(o.extra_fields.get("turn_scores") or [])
            non_tensors["tool_rewards"][i] = list(o.extra_fields.get("tool_rewards") or [])
        out = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
        out.meta_info["metrics"] = agent_metrics(outputs, elapsed)
        return out


def check_output(i: int, o: AgentLoopOutput, prompt_length: int, response_length: int) -> None:
    """Fail on an output that does not fit the batch widths or whose per-token lists disagree."""
    if len(o.prompt_ids) > prompt_length:
        raise ValueError(
            f"agent loop prompt of {len(o.prompt_ids)} tokens (chat template with tools) exceeds "
            f"actor_rollout_ref.rollout.prompt_length={prompt_length}; raise data.max_prompt_length"
        )
    n = len(o.response_ids)
    if (
        n > response_length
        or len(o.response_mask) != n
        or (o.response_logprobs is not None and len(o.response_logprobs) != n)
    ):
        raise ValueError(
            f"agent loop output {i}: {n} response ids (limit rollout.response_length={response_length}), "
            f"{len(o.response_mask)} mask entries, "
            f"{None if o.response_logprobs is None else len(o.response_logprobs)} log-probs"
        )


def pad_outputs(outputs: list[AgentLoopOutput], P: int, R: int, pad: int) -> dict[str, torch.Tensor]:
    """Per-token tensors of b outputs: `prompts` / `prompt_mask` [b, P] (left-padded); `responses`,
    `response_attention` (1 on every real token), `response_mask` (1 on generated tokens),
    `rollout_log_probs` (0 off the mask), `turn_ids` (-1 off turns), `step_end_mask` [b, R]
    (right-padded). `turn_ids` / `step_end_mask` come from the mask unless a loop's extra_fields
    give them."""
    b = len(outputs)
    t = {
        "prompts": torch.full((b, P), pad, dtype=torch.long),
        "prompt_mask": torch.zeros((b, P), dtype=torch.long),
        "responses": torch.full((b, R), pad, dtype=torch.long),
        "response_attention": torch.zeros((b, R), dtype=torch.long),
        "response_mask": torch.zeros((b, R), dtype=torch.long),
        "rollout_log_probs": torch.zeros((b, R), dtype=torch.float32),
        "turn_ids": torch.full((b, R), -1, dtype=torch.long),
        "step_end_mask": torch.zeros((b, R), dtype=torch.long),
    }
    for i, o in enumerate(outputs):
        if o.prompt_ids:
            t["prompts"][i, P - len(o.prompt_ids) :] = torch.tensor(o.prompt_ids, dtype=torch.long)
            t["prompt_mask"][i, P - len(o.prompt_ids) :] = 1
        n = len(o.response_ids)
        if not n:
            continue
        t["responses"][i, :n] = torch.tensor(o.response_ids, dtype=torch.long)
        t["response_attention"][i, :n] = 1
        t["response_mask"][i, :n] = torch.tensor(o.response_mask, dtype=torch.long)
        if o.response_logprobs is not None:
            t["rollout_log_probs"][i, :n] = torch.tensor(o.response_logprobs, dtype=torch.float32)
        tid, ends = derive_turns(list(o.response_mask))
        t["turn_ids"][i, :n] = torch.tensor(o.extra_fields.get("turn_ids", tid), dtype=torch.long)
        t["step_end_mask"][i, :n] = torch.tensor(o.extra_fields.get("step_end_mask", ends), dtype=torch.long)
    t["rollout_log_probs"] *= t["response_mask"]
    return t


def reward_scores(outputs: list[AgentLoopOutput], response_mask: torch.Tensor) -> torch.Tensor | None:
    """`rm_scores` [b, R]: each loop's `reward_score` on its last generated token; None when no loop
    scores. A batch with some scored and some unscored outputs is an error."""
    scored = [o.reward_score is not None for o in outputs]
    if not any(scored):
        return None
    if not all(scored):
        raise ValueError(
            f"{sum(scored)} of {len(outputs)} agent loop outputs carry a reward_score and the others do not; the "
            "batch's rm_scores would silently replace the rule reward of the unscored ones: score all or none"
        )
    rm = torch.zeros(response_mask.shape, dtype=torch.float32)
    for i, o in enumerate(outputs):
        last = int(response_mask[i].nonzero().max()) if response_mask[i].any() else 0
        rm[i, last] = float(o.reward_score)
    return rm


def agent_metrics(outputs: list[AgentLoopOutput], elapsed: float = 0.0) -> dict[str, float]:
    """Per-batch figures: turns, tool calls, tool errors, tool latency, share cut by the budget."""
    if not outputs:
        return {}
    turns = [o.num_turns for o in outputs]
    a_turns = [int(o.extra_fields.get("assistant_turns", 0)) for o in outputs]
    calls = [int(o.extra_fields.get("tool_calls", 0)) for o in outputs]
    errors = [int(o.extra_fields.get("tool_errors", 0)) for o in outputs]
    lat = [x for o in outputs for x in o.extra_fields.get("tool_latencies", [])]
    cut = [bool(o.extra_fields.get("cut_by_length", False)) for o in outputs]
    sanity = [o.extra_fields.get("sanity_ok") for o in outputs if o.extra_fields.get("sanity_ok") is not None]
    n_calls = sum(calls)
    m = {
        "num_turns/mean": float(np.mean(turns)),
        "num_turns/max": float(np.max(turns)),
        "num_turns/min": float(np.min(turns)),
        "agent/assistant_turns/mean": float(np.mean(a_turns)),
        "agent/assistant_turns/max": float(np.max(a_turns)),
        "agent/tool_calls/mean": float(np.mean(calls)),
        "agent/tool_call_rate": float(np.mean([c > 0 for c in calls])),
        "agent/tool_error_rate": float(sum(errors) / n_calls) if n_calls else 0.0,
        "agent/tool_latency_s/mean": float(np.mean(lat)) if lat else 0.0,
        "agent/tool_latency_s/max": float(np.max(lat)) if lat else 0.0,
        "agent/cut_by_length_budget": float(np.mean(cut)),
        "agent/generate_s/mean": float(np.mean([o.metrics.generate_sequences for o in outputs])),
        "agent/rollout_s": float(elapsed),
    }
    if sanity:
        m["agent/tokenization_mismatch_rate"] = float(1.0 - np.mean(sanity))
    return m


def new_request_id() -> str:
    return uuid4().hex
