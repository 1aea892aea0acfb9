"""`build_optimizer` picks the fused AdamW kernel (faster on CPU) and its updates equal the
single-tensor AdamW torch uses by default on CPU, on plain and on FSDP2-sharded (world size 2)
parameters."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import end_spawned_rank
from test_workers_common import build_tiny_llama

from verl.utils.fsdp_utils import build_optimizer
from verl.workers.config import OptimizerConfig

STEPS = 10


def _grads(step, params_shapes):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=g) * 0.01 for s in params_shapes]


def _single_tensor_run(model, cfg):
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=False
    )
    shapes = [p.shape for p in model.parameters()]
    for step in range(STEPS):
        for p, g in zip(model.parameters(), _grads(step, shapes), strict=False):
            p.grad = g
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _cfg():
    return OptimizerConfig(lr=1e-2, weight_decay=0.01, betas=[0.9, 0.99], eps=1e-8)


def test_fused_adamw_equals_single_tensor(tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(build_tiny_llama(str(tmp_path)))
    cfg = _cfg()
    expected = _single_tensor_run(model, cfg)
    fused_model = copy.deepcopy(model)
    opt = build_optimizer(fused_model.parameters(), cfg)
    assert opt.param_groups[0]["fused"] is True
    assert opt.param_groups[0]["lr"] == cfg.lr and opt.param_groups[0]["betas"] == (0.9, 0.99)
    shapes = [p.shape for p in fused_model.parameters()]
    for step in range(STEPS):
        for p, g in zip(fused_model.parameters(), _grads(step, shapes), strict=False):
            p.grad = g
        opt.step()
    moved = max(float((expected[n] - p.detach()).abs().max()) for n, p in model.named_parameters())
    assert moved > 0.05  # 10 steps of lr 1e-2 move weights by ~0.1
    for n, p in fused_model.named_parameters():
        torch.testing.assert_close(p.detach(), expected[n], atol=1e-6, rtol=0, msg=n)


def test_frozen_parameters_are_left_out():
    frozen = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2)), frozen], _cfg())
    assert len(opt.param_groups[0]["params"]) == 1 and opt.param_groups[0]["fused"] is True


def _dp_worker(rank, path, init_file, out_file):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    from verl.utils.fsdp_utils import apply_fsdp2

    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    model = AutoModelForCausalLM.from_pretrained(path)
    shapes = [p.shape for p in model.parameters()]
    model = apply_fsdp2(model, init_device_mesh("cpu", (2,)))
    opt = build_optimizer(model.parameters(), _cfg())
    for step in range(STEPS):
        for p, g in zip(model.parameters(), _grads(step, shapes), strict=False):
            p.grad = (
                torch.distributed.tensor.distribute_tensor(g, p.device_mesh, p.placements)
                if isinstance(p, DTensor)
                else g
            )
        opt.step()
    full = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for n, p in model.named_parameters()}
    if rank == 0:
        torch.save({"params": full, "fused": opt.param_groups[0]["fused"]}, out_file)
    end_spawned_rank()


@pytest.mark.slow
def test_fused_adamw_on_fsdp2_shards_equals_single_tensor(tmp_path):
    from transformers import AutoModelForCausalLM

    path = build_tiny_llama(str(tmp_path / "m"))
    expected = _single_tensor_run(AutoModelForCausalLM.from_pretrained(path), _cfg())
    out = str(tmp_path / "out.pt")
    mp.spawn(_dp_worker, args=(path, str(tmp_path / "init"), out), nprocs=2, join=True)
    got = torch.load(out)
    assert got["fused"] is True
    for n, p in expected.items():
        torch.testing.assert_close(got["params"][n], p, atol=1e-6, rtol=0, msg=n)
