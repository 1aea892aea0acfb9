#!/usr/bin/env python
"""Concurrency of the agent loop: N trajectories per worker, each making `--calls` tool calls to a
tool that sleeps `--sleep_ms`, on the hf engine with a tiny random model.

Prints the wall time of the concurrent rollout next to its parts: the time spent in batched
decoding calls (`generate`), one tool wait per round (`calls x sleep`), and the sum of all waits
(`N x calls x sleep`, what a loop that blocks on each tool would add). The claim checked: wall is
about generate + calls x sleep, not generate + N x calls x sleep.

    python scripts/bench_agent_loop.py --n 32 --sleep_ms 50 --calls 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=32, help="trajectories")
    p.add_argument("--sleep_ms", type=float, default=50.0)
    p.add_argument("--calls", type=int, default=2, help="tool calls per trajectory")
    p.add_argument("--max_tokens", type=int, default=8, help="tokens per assistant turn")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--serial", action="store_true", help="also time the trajectories one after another (measured baseline)"
    )
    return p.parse_args(argv)


def sleepy_tool_config(args):
    """The rollout config of the benchmark: a `sleepy` function tool (written to a temp dir) that waits
    `--sleep_ms`, called by a parser that asks for it on every turn, `--calls` + 1 assistant turns."""
    from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
    from verl.workers.config import MultiTurnConfig, RolloutConfig

    @ToolParser.register("bench_always_call")
    class AlwaysCall(ToolParser):
        async def extract_tool_calls(self, ids):
            return "", [FunctionCall(name="sleepy", arguments="{}")]

    tmp = Path(tempfile.mkdtemp(prefix="bench_agent_"))
    (tmp / "sleepy.py").write_text(
        "import asyncio\nfrom verl.tools.function_tool import function_tool\n\n"
        "@function_tool\nasync def sleepy() -> str:\n"
        '    """Sleep, then answer."""\n'
        f"    await asyncio.sleep({args.sleep_ms / 1000.0})\n    return 'ok'\n"
    )
    return RolloutConfig(
        prompt_length=16,
        response_length=(args.max_tokens + 8) * (args.calls + 1),
        do_sample=False,
        multi_turn=MultiTurnConfig(
            enable=True,
            format="bench_always_call",
            function_tool_path=str(tmp / "sleepy.py"),
            max_assistant_turns=args.calls + 1,
            tokenization_sanity_check_mode="disable",
        ),
    )


def fixed_length_rollout(model, cfg, turn_tokens: int, eos: int):
    """An hf rollout whose every turn is exactly `turn_tokens` long and ends with EOS: EOS replaces the
    last of `turn_tokens` decoded tokens."""
    from verl.workers.rollout import HFRollout

    class FixedLength(HFRollout):
        def generate_token_lists(self, prompt_ids, max_tokens, sampling, eos_ids, pad_id, generator=None):
            outs = super().generate_token_lists(
                prompt_ids, [min(m, turn_tokens) for m in max_tokens], sampling, [], pad_id, generator
            )
            for o in outs:
                o.token_ids[-1], o.stop_reason = eos, "eos"
            return outs

    return FixedLength(model, cfg)


def timed_result(args, wall: float, out) -> dict:
    """The printed summary: the concurrent run's wall time next to its decode time and tool waits."""
    m = out.meta_info["metrics"]
    calls = float(m["agent/tool_calls/mean"])
    gen = float(m["agent/generate_s/mean"])
    return {
        "n": args.n,
        "sleep_ms": args.sleep_ms,
        "tool_calls_per_trajectory": calls,
        "wall_s": round(wall, 3),
        "decode_batches": m["agent/decode_batches"],
        "decode_batch_size_mean": round(m["agent/decode_batch_size/mean"], 2),
        "one_wait_per_round_s": round(calls * args.sleep_ms / 1000, 3),
        "sum_of_waits_s": round(args.n * calls * args.sleep_ms / 1000, 3),
        "decode_s": round(m["agent/decode_s"], 3),
        "wall_minus_decode_s": round(wall - m["agent/decode_s"], 3),
        "mean_wait_for_generation_per_trajectory_s": round(gen, 3),
        "tool_latency_mean_s": round(m["agent/tool_latency_s/mean"], 4),
    }


def main(argv=None) -> dict:
    args = parse_args(argv)

    import importlib.util

    import numpy as np
    import torch

    from verl.protocol import DataProto
    from verl.workers.rollout.agent_rollout import AgentRollout

    torch.set_num_threads(args.threads)
    spec = importlib.util.spec_from_file_location("bed", REPO_ROOT / "scripts" / "build_embedded_default.py")
    bed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bed)
    tok = bed.build_calculator_tokenizer()
    model = bed.build_model(tok, 64, 2, 4, 2, 128, 512, seed=0).eval()
    eos = tok.eos_token_id
    cfg = sleepy_tool_config(args)
    ro = AgentRollout(fixed_length_rollout(model, cfg, args.max_tokens, eos), None, cfg, tok)
    raw = np.empty(args.n, dtype=object)
    for i in range(args.n):
        raw[i] = [{"role": "user", "content": f"{i}"}]
    data = DataProto.from_dict(
        tensors={"d": torch.zeros(args.n, 1)},
        non_tensors={"raw_prompt": raw, "agent_name": np.array(["tool_agent"] * args.n, dtype=object)},
        meta_info={"eos_token_id": eos, "pad_token_id": tok.pad_token_id},
    )
    ro.generate_sequences(data.select_idxs(np.arange(min(4, args.n))))  # warm-up
    start = time.perf_counter()
    out = ro.generate_sequences(data)
    wall = time.perf_counter() - start
    result = timed_result(args, wall, out)
    if args.serial:
        start = time.perf_counter()
        for i in range(args.n):
            ro.generate_sequences(data.select_idxs(np.array([i])))
        result["serial_wall_s"] = round(time.perf_counter() - start, 3)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
