#!/usr/bin/env python
"""Peak resident memory and time of one actor checkpoint save, per rank, at several world sizes.

Each measurement is a fresh `torch.multiprocessing.spawn` of W gloo ranks. Every rank builds the
30.6M-parameter Llama of `scripts/bench_step.py`'s `30m` shape (hidden 512, 8 layers; built once
into `--work_dir`), shards it with FSDP2, takes one AdamW step (so the optimizer has its moments),
returns freed heap to the OS (`malloc_trim`), then calls `FSDPCheckpointManager.save_checkpoint`
while a thread samples the process's RSS every 2 ms. Printed per rank: RSS before the save, peak
RSS during it, the difference (what the save itself allocates) and the save's wall time; medians
over `--repeats`.

Whatever `verl` is imported is measured, so before/after a change is:

    git archive <old commit> | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before python scripts/bench_checkpoint.py --label before
    PYTHONPATH=$PWD python scripts/bench_checkpoint.py --label after
    PYTHONPATH=$PWD python scripts/bench_checkpoint.py --label after+hf --save_contents model,optimizer,extra,hf_model
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


class PeakRss(threading.Thread):
    """Highest RSS of this process seen while running (sampled every `interval` seconds)."""

    def __init__(self, interval: float = 0.002):
        super().__init__(daemon=True)
        import psutil

        self.proc = psutil.Process()
        self.interval = interval
        self.peak = self.proc.memory_info().rss
        self.running = True

    def run(self):
        while self.running:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def stop(self) -> int:
        self.running = False
        self.join()
        return max(self.peak, self.proc.memory_info().rss)


def _rank(rank: int, world: int, init_file: str, model_dir: str, out_dir: str, contents: list[str]) -> None:
    import ctypes
    import gc

    import psutil
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.fsdp_utils import apply_fsdp2, create_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    apply_fsdp2(model, create_device_mesh(world, -1, "cpu"), reshard_after_forward=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 100, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    manager = FSDPCheckpointManager(model, opt, checkpoint_config={"save_contents": contents})
    gc.collect()
    # return the heap that training freed to the OS, so that the peak shows what the save allocates
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    dist.barrier()
    before = psutil.Process().memory_info().rss
    sampler = PeakRss()
    sampler.start()
    t0 = time.perf_counter()
    manager.save_checkpoint(os.path.join(out_dir, "ckpt"), global_step=1)
    seconds = time.perf_counter() - t0
    peak = sampler.stop()
    result = {"rank": rank, "before_mb": before / 2**20, "peak_mb": peak / 2**20, "save_s": seconds}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(result, fh)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def measure(world: int, model_dir: str, contents: list[str]) -> list[dict]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(world, os.path.join(tmp, "init"), model_dir, tmp, contents), nprocs=world, join=True)
        return [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(world)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world_sizes", default="1,2")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--save_contents", default="model,optimizer,extra")
    p.add_argument("--label", default="")
    p.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "verl_bench_step"))
    args = p.parse_args()
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import bench_step

    import verl

    model_dir = bench_step.model_path("30m", Path(args.work_dir))
    contents = args.save_contents.split(",")
    print(f"{args.label or 'verl'} from {os.path.dirname(verl.__file__)}; save_contents={contents}")
    print("| world | rank | RSS before (MB) | peak RSS (MB) | peak - before (MB) | save (s) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for world in (int(w) for w in args.world_sizes.split(",")):
        runs = [measure(world, model_dir, contents) for _ in range(args.repeats)]
        for rank in range(world):
            rows = [r[rank] for r in runs]

            def med(key, rows=rows):
                return statistics.median(x[key] for x in rows)

            extra = statistics.median(x["peak_mb"] - x["before_mb"] for x in rows)
            print(
                f"| {world} | {rank} | {med('before_mb'):.0f} | {med('peak_mb'):.0f} | {extra:.0f} | "
                f"{med('save_s'):.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
