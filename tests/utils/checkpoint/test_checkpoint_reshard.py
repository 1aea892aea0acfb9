"""DCP checkpoints across world sizes (two gloo ranks with FSDP2 against one plain process):
a checkpoint written by 1 rank resumes on 2 and one written by 2 resumes on 1, with equal
weights and optimizer moments; on the same world size resume is exact; an asynchronous save
stays consistent while the next training step runs; every rank writes only its own shard."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import end_spawned_rank
from test_workers_common import build_tiny_llama

pytestmark = pytest.mark.slow


def _build(model_dir, fsdp: bool):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if fsdp:
        import torch.distributed as dist

        from verl.utils.fsdp_utils import apply_fsdp2, create_device_mesh

        apply_fsdp2(model, create_device_mesh(dist.get_world_size(), -1, "cpu"), reshard_after_forward=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
    return model, opt, sched


def _manager(model, opt, sched, **cfg):
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    return FSDPCheckpointManager(model, opt, sched, checkpoint_config=cfg or None)


def _step(model, opt, sched, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 40, (2, 6), generator=g)
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()


def _full_state(model, opt) -> dict:
    """Full weights and optimizer state keyed by parameter name (collective under FSDP2)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from verl.utils.fsdp_utils import get_full_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    optim = get_optimizer_state_dict(model, opt, options=opts).get("state", {})
    # copies: on CPU some entries are the live tensors (the `step` counters), which later steps change
    return {
        "model": {k: v.clone() for k, v in get_full_state_dict(model).items()},
        "optim": {k: {m: v.clone() for m, v in moments.items()} for k, moments in optim.items()},
    }


def _assert_same(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["optim"].keys() == b["optim"].keys()
    for k, moments in a["optim"].items():
        for m, v in moments.items():
            assert torch.equal(v, b["optim"][k][m]), (k, m)


def _two_rank_worker(rank, init_file, model_dir, work):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    # 1 -> 2: the checkpoint the single process wrote
    model, opt, sched = _build(model_dir, fsdp=True)
    _manager(model, opt, sched).load_checkpoint(os.path.join(work, "w1"))
    loaded = _full_state(model, opt)
    if rank == 0:
        torch.save(loaded, os.path.join(work, "w1_loaded_by_2.pt"))
    # 2 -> 1: train on this world size, save, keep the reference
    _step(model, opt, sched, seed=10 + rank)
    _manager(model, opt, sched, save_contents=["model", "optimizer", "extra", "hf_model"]).save_checkpoint(
        os.path.join(work, "w2"), global_step=2
    )
    reference = _full_state(model, opt)
    if rank == 0:
        torch.save(reference, os.path.join(work, "w2_reference.pt"))
    # same world size: the next step after a resume equals the next step without one
    torch.manual_seed(100 + rank)
    _step(model, opt, sched, seed=20 + rank)
    straight = _full_state(model, opt)
    model2, opt2, sched2 = _build(model_dir, fsdp=True)
    _manager(model2, opt2, sched2).load_checkpoint(os.path.join(work, "w2"))
    torch.manual_seed(100 + rank)
    _step(model2, opt2, sched2, seed=20 + rank)
    resumed = _full_state(model2, opt2)
    # asynchronous save: the step that runs while the shards are written does not change them
    mgr = _manager(model2, opt2, sched2, async_save=True)
    before = _full_state(model2, opt2)
    mgr.save_checkpoint(os.path.join(work, "async"), global_step=3)
    _step(model2, opt2, sched2, seed=30 + rank)  # collectives on the default group meanwhile
    mgr.finalize_save()
    model3, opt3, sched3 = _build(model_dir, fsdp=True)
    _manager(model3, opt3, sched3).load_checkpoint(os.path.join(work, "async"))
    async_loaded = _full_state(model3, opt3)
    if rank == 0:
        _assert_same(straight, resumed)
        _assert_same(before, async_loaded)
        torch.save("ok", os.path.join(work, "two_rank_ok.pt"))
    end_spawned_rank()


def test_checkpoints_reshard_between_one_and_two_ranks(tmp_path):
    import torch.multiprocessing as mp

    torch.set_num_threads(1)
    model_dir = build_tiny_llama(str(tmp_path / "model"))
    work = str(tmp_path / "work")
    model, opt, sched = _build(model_dir, fsdp=False)
    _step(model, opt, sched, seed=1)
    _manager(model, opt, sched).save_checkpoint(os.path.join(work, "w1"), global_step=1)
    written_by_1 = _full_state(model, opt)

    mp.spawn(_two_rank_worker, args=(str(tmp_path / "init"), model_dir, work), nprocs=2, join=True)

    assert torch.load(os.path.join(work, "two_rank_ok.pt")) == "ok"
    _assert_same(written_by_1, torch.load(os.path.join(work, "w1_loaded_by_2.pt")))
    w2 = os.path.join(work, "w2")
    # every rank wrote its own file; each holds about half of the state
    shards = sorted(n for n in os.listdir(os.path.join(w2, "dcp")) if n.endswith(".distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]
    sizes = [os.path.getsize(os.path.join(w2, "dcp", n)) for n in shards]
    assert max(sizes) < 0.7 * sum(sizes)
    # 2 -> 1
    model1, opt1, sched1 = _build(model_dir, fsdp=False)
    with pytest.warns(UserWarning, match="written by 2 ranks.*resharded"):
        meta = _manager(model1, opt1, sched1).load_checkpoint(w2)
    assert meta["world_size"] == 2 and meta["global_step"] == 2
    reference = torch.load(os.path.join(work, "w2_reference.pt"))
    _assert_same(reference, _full_state(model1, opt1))
    assert sched1.last_epoch == 2
    # the Hugging Face export rank 0 streamed out of both ranks' shards
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(os.path.join(w2, "huggingface")).state_dict()
    for k, v in reference["model"].items():
        assert torch.equal(v, hf[k]), k
