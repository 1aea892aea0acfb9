"""A multi-process job on one machine (MASTER_ADDR is loopback, as a worker group whose slots
are all on one node sets it) rendezvous on 127.0.0.1 only: rank 0's store listens on no other
interface."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import end_spawned_rank

pytestmark = pytest.mark.slow


def _listening(pid: int) -> list[str]:
    import psutil

    return sorted({c.laddr.ip for c in psutil.Process(pid).net_connections(kind="inet") if c.status == "LISTEN"})


def _rank(rank, port, out):
    from verl.single_controller.base.worker import init_process_group_if_needed

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    assert init_process_group_if_needed("gloo")
    import torch.distributed as dist

    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"sum": t.item(), "listening": _listening(os.getpid())}, fh)
    end_spawned_rank()


def test_rank_zero_store_listens_on_loopback_only(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "rank0.json")
    mp.spawn(_rank, args=(port, out), nprocs=2, join=True)
    result = json.load(open(out))
    assert result["sum"] == 3.0
    assert result["listening"] and all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for ip in result["listening"]), result
