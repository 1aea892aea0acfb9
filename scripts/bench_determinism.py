#!/usr/bin/env python
"""CPU seconds of the default job's actor update with torch's deterministic algorithms on and off.

`trainer.deterministic` changes kernels of the backward pass only (the repeated-index gathers of
the prefix grouper add serially instead of with racing threads), so the update is where its cost
is. One process builds the default job's actor worker (embedded model, its preset: 32 prompts x
8 samples, <= 8 response tokens), generates one batch, and then runs `update_actor` on it
alternately with the switch on and off (`--rounds` each, after one warm-up of each), measuring
the process's CPU time (user + system, which a loaded machine disturbs far less than wall time)
and the wall time of each update; medians are printed. Each update changes the weights a little;
the work is the same.

    python scripts/bench_determinism.py --threads 2 --rounds 10

It also times the kernels the switch changes in isolation (`kernel_seconds`), fastest of 200
runs, which a loaded machine leaves readable when the update's own times are not.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np
import torch


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build_worker_and_batch():
    """The default job's actor worker (in this process) and one generated batch with GRPO-like
    advantages and old log-probs."""
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf

    from verl.protocol import DataProto
    from verl.trainer.config.upstream_keys import check_upstream_surface
    from verl.trainer.main_ppo import fill_embedded_defaults, load_default_config
    from verl.utils import embedded_default
    from verl.utils.model import compute_position_id_with_mask
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    cfg = fill_embedded_defaults(load_default_config(["algorithm.adv_estimator=grpo"]))
    # what the workers get: upstream's keys mapped onto ours, resolved
    cfg = OmegaConf.create(OmegaConf.to_container(check_upstream_surface(cfg), resolve=True))
    worker = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="actor_rollout")
    worker.init_model()
    tok = worker.tokenizer
    n_prompts, n = int(cfg.data.train_batch_size), int(cfg.actor_rollout_ref.rollout.n)
    rows = pq.read_table(embedded_default.train_files()).slice(0, n_prompts).to_pylist()
    texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    enc = tok(texts, add_special_tokens=False, padding="longest", padding_side="left", return_tensors="pt")
    gen_in = DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": enc["attention_mask"],
            "position_ids": compute_position_id_with_mask(enc["attention_mask"]),
        },
        non_tensors={"uid": np.array([f"u{i}" for i in range(n_prompts)], dtype=object)},
    ).repeat(n, interleave=True)
    out = worker.generate_sequences(gen_in)
    batch = DataProto.from_dict(tensors=dict(out.batch.items()), non_tensors={"uid": gen_in.non_tensor_batch["uid"]})
    old = worker.compute_log_prob(batch)
    batch.batch["old_log_probs"] = old.batch["old_log_probs"]
    scores = torch.randn(len(batch), generator=torch.Generator().manual_seed(0))
    batch.batch["advantages"] = scores.unsqueeze(1) * batch.batch["response_mask"]
    return worker, batch


def kernel_seconds(reps: int = 200) -> dict[bool, float]:
    """Fastest of `reps` runs (robust to a loaded machine) of one update's repeated-index
    backward kernels: `index_put_(accumulate=True)` of the prefix grouper's KV-cache selection
    (8 per micro-batch: keys and values of 4 layers, [256, 2, 9, 32] rows into 32 prompts, as
    attention's gradient lays them out) and of its last logits ([256, 1, 262] into 32)."""
    from verl.utils.reproducibility import set_deterministic

    gen = torch.Generator().manual_seed(0)
    index = torch.sort(torch.randint(0, 32, (256,), generator=gen)).values
    kv = torch.randn(256, 12, 2, 32, generator=gen).transpose(1, 2)[:, :, :9]
    logits = torch.randn(256, 1, 262, generator=gen)
    out = {}
    for flag in (False, True):
        set_deterministic(flag)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(8):
                torch.zeros(32, 2, 9, 32).index_put_((index,), kv, accumulate=True)
            torch.zeros(32, 1, 262).index_put_((index,), logits, accumulate=True)
            best = min(best, time.perf_counter() - t0)
        out[flag] = best
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--kernels_only", action="store_true", help="only the kernel timing (seconds)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from verl.utils.reproducibility import set_deterministic

    if args.kernels_only:
        kernels = kernel_seconds()
        print(f"repeated-index backward kernels: off {1e3 * kernels[False]:.3f} ms, on {1e3 * kernels[True]:.3f} ms")
        return
    worker, batch = build_worker_and_batch()
    cpu: dict[bool, list[float]] = {True: [], False: []}
    wall: dict[bool, list[float]] = {True: [], False: []}
    for i in range(args.rounds + 1):
        for flag in (True, False) if i % 2 == 0 else (False, True):
            set_deterministic(flag)
            c0, w0 = _cpu_seconds(), time.perf_counter()
            worker.update_actor(batch)
            if i > 0:  # round 0 warms both up
                cpu[flag].append(_cpu_seconds() - c0)
                wall[flag].append(time.perf_counter() - w0)
    print(f"update_actor, {len(batch)} sequences, {args.threads} torch threads, {args.rounds} rounds (medians):")
    for flag, name in ((False, "deterministic off"), (True, "deterministic on ")):
        print(f"  {name}: {statistics.median(cpu[flag]):.4f} CPU s, {statistics.median(wall[flag]):.4f} wall s")
    ratio = statistics.median(cpu[True]) / statistics.median(cpu[False]) - 1
    print(f"  cost of deterministic: {100 * ratio:+.1f}% of the update's CPU time")
    kernels = kernel_seconds()
    print(
        "the repeated-index backward kernels of one micro-batch (fastest of 200): "
        f"off {1e3 * kernels[False]:.3f} ms, on {1e3 * kernels[True]:.3f} ms"
    )


if __name__ == "__main__":
    main()
