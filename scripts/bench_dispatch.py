"""Round-trip time of worker-group calls carrying a DataProto of int64 tokens.

Measures, on a local Ray with two CPU workers per group:

0. ``empty_call``: a ONE_TO_ALL call without data, the fixed cost of a group call;
1. ``single``: one blocking DP_COMPUTE_PROTO call (driver -> 2 workers -> driver), the workers
   returning a batch of the same size (tokens + 1);
2. ``two_stage_blocking``: group A's result comes back to the driver and is sent to group B;
3. ``two_stage_chained``: group A is called with ``blocking=False`` and its DataProtoFuture is
   passed straight to group B, so the data never returns to the driver in between;
4. ``nonblocking_call_and_get``: a ``blocking=False`` call resolved on the driver with ``.get()``;
5. ``pickle_*``: serialising the batch with DataProto's buffer pickling vs. pickling the TensorDict.

The variants run round-robin (one call of each per round) so they share the background load.

Usage: ``python scripts/bench_dispatch.py [--rows 256] [--seq 1024] [--iters 30] [--json out.json]``.
Reports median and 90th percentile in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from verl import DataProto  # noqa: E402
from verl.single_controller.base import Worker  # noqa: E402
from verl.single_controller.base.decorator import Dispatch, register  # noqa: E402


class EchoWorker(Worker):
    """Returns ``tokens + 1`` for its chunk: the work is negligible, so the time is transport."""

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def step(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"tokens": data.batch["tokens"] + 1})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        return None

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def step_async(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"tokens": data.batch["tokens"] + 1})


def timed_round_robin(variants: dict, iters: int, warmup: int) -> dict[str, dict[str, float]]:
    """Time every variant once per round, `iters` rounds: on a shared, noisy machine the variants
    then see the same background load, so their medians compare fairly."""
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(iters):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - t0) * 1e3)
    out = {}
    for name, values in samples.items():
        values.sort()
        out[name] = {
            "median_ms": round(statistics.median(values), 2),
            "p90_ms": round(values[int(0.9 * (len(values) - 1))], 2),
            "min_ms": round(values[0], 2),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", type=str, default=None, help="also write the results to this file")
    args = parser.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    torch.set_num_threads(1)
    import ray

    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    repo = str(Path(__file__).resolve().parents[1])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level="WARNING",
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": {"PYTHONPATH": repo}},
    )
    try:
        pool = RayResourcePool([2], use_gpu=False, num_cpus_per_worker=1.0, max_colocate_count=2)
        group_a = RayWorkerGroup(pool, RayClassWithInitArgs(cls=EchoWorker), num_threads_per_worker=1)
        group_b = RayWorkerGroup(pool, RayClassWithInitArgs(cls=EchoWorker), num_threads_per_worker=1)
        data = DataProto.from_dict({"tokens": torch.randint(0, 32000, (args.rows, args.seq), dtype=torch.int64)})

        # correctness before timing
        assert torch.equal(group_a.step(data).batch["tokens"], data.batch["tokens"] + 1)
        assert torch.equal(group_b.step(group_a.step_async(data)).batch["tokens"], data.batch["tokens"] + 2)

        def future_returned():
            future = group_a.step_async(data)
            future.get()  # not timed separately: keeps the workers' queues empty for the next variant
            return future

        variants = {
            "empty_call": group_a.noop,
            "single": lambda: group_a.step(data),
            "two_stage_blocking": lambda: group_b.step(group_a.step(data)),
            "two_stage_chained": lambda: group_b.step(group_a.step_async(data)),
            "nonblocking_call_and_get": future_returned,
            "pickle_dataproto": lambda: pickle.loads(pickle.dumps(data, protocol=5)),
            "pickle_tensordict": lambda: pickle.loads(pickle.dumps(data.batch, protocol=5)),
        }
        results = {
            "payload_MiB": round(args.rows * args.seq * 8 / 2**20, 2),
            "rows": args.rows,
            "seq": args.seq,
            "workers_per_group": 2,
            **timed_round_robin(variants, args.iters, args.warmup),
        }
    finally:
        ray.shutdown()

    width = max(len(k) for k in results)
    print(
        f"DataProto {args.rows} x {args.seq} int64 ({results['payload_MiB']} MiB), 2 workers per group, "
        f"{args.iters} iterations"
    )
    for key, value in results.items():
        if isinstance(value, dict):
            print(
                f"  {key:<{width}}  median {value['median_ms']:8.2f} ms   p90 {value['p90_ms']:8.2f} ms   min "
                f"{value['min_ms']:8.2f} ms"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
