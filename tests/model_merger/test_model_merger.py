"""`python -m verl.model_merger` on our checkpoints (DCP shards, LoRA) and on upstream verl's FSDP
layout (DTensor shards written by two ranks the way upstream writes them), the `test`
subcommand, the refused options, and resuming training from an upstream checkpoint."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch
from conftest import end_spawned_rank
from test_workers_common import build_tiny_llama

from verl.model_merger.__main__ import main


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return build_tiny_llama(str(tmp_path_factory.mktemp("tiny_merge")))


def _trained(model_dir, **ckpt):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    tok = AutoTokenizer.from_pretrained(model_dir)
    return model, FSDPCheckpointManager(model, opt, processing_class=tok, checkpoint_config=ckpt or None)


def _merge(local_dir, target, *extra):
    main(["merge", "--backend", "fsdp", "--local_dir", str(local_dir), "--target_dir", str(target), *extra])


def _assert_weights(target, expected: dict):
    from transformers import AutoModelForCausalLM

    got = AutoModelForCausalLM.from_pretrained(str(target)).state_dict()
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert torch.equal(got[k], v), k


def test_merge_a_dcp_checkpoint_and_test_it(model_dir, tmp_path, capsys):
    model, mgr = _trained(model_dir)
    ckpt = tmp_path / "global_step_1" / "actor"
    mgr.save_checkpoint(str(ckpt), global_step=1)
    _merge(ckpt, tmp_path / "merged")
    _assert_weights(tmp_path / "merged", model.state_dict())
    for name in ("config.json", "generation_config.json", "tokenizer.json"):
        assert (tmp_path / "merged" / name).is_file(), name
    main(["test", "--backend", "fsdp", "--local_dir", str(ckpt), "--test_hf_dir", str(tmp_path / "merged")])
    assert "test passed" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="differs from the reference"):  # the untrained model is another one
        main(["test", "--backend", "fsdp", "--local_dir", str(ckpt), "--test_hf_dir", model_dir])


def test_refused_options_say_why(model_dir, tmp_path):
    _, mgr = _trained(model_dir)
    mgr.save_checkpoint(str(tmp_path / "actor"))
    with pytest.raises(SystemExit, match="uploading to the Hugging Face Hub is not available"):
        _merge(tmp_path / "actor", tmp_path / "out", "--hf_upload_path", "me/model")
    assert not (tmp_path / "out").exists()  # refused before any work
    with pytest.raises(SystemExit, match="Megatron is not available"):
        main(["merge", "--backend", "megatron", "--local_dir", str(tmp_path / "actor"), "--target_dir", "x"])
    with pytest.raises(SystemExit, match="is not a directory"):
        _merge(tmp_path / "nowhere", tmp_path / "out")
    _, weightless = _trained(model_dir, save_contents=["optimizer"])
    weightless.save_checkpoint(str(tmp_path / "no_weights"))
    with pytest.raises(SystemExit, match="holds no model weights"):
        _merge(tmp_path / "no_weights", tmp_path / "out2")


def test_lora_checkpoints_merge_and_export_the_adapter(model_dir, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_()  # a non-zero delta, so that merged differs from the base
    adapter_dir = _save_adapter(lora, tmp_path)
    fresh = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter_dir)
    expected = {k: v.clone() for k, v in fresh.merge_and_unload().state_dict().items()}
    lora = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter_dir, is_trainable=True)
    for only in (False, True):  # with the merged export, and adapter only (merged from the base dir)
        ckpt = tmp_path / f"actor_{only}"
        FSDPCheckpointManager(
            lora, checkpoint_config={"save_contents": ["model"], "save_lora_only": only}
        ).save_checkpoint(str(ckpt))
        _merge(ckpt, tmp_path / f"merged_{only}")
        got = AutoModelForCausalLM.from_pretrained(str(tmp_path / f"merged_{only}")).state_dict()
        for k, v in expected.items():
            torch.testing.assert_close(got[k], v, atol=1e-6, rtol=0)
        assert (tmp_path / f"merged_{only}" / "lora_adapter" / "adapter_config.json").is_file()
    _merge(tmp_path / "actor_True", tmp_path / "adapter", "--lora_adapter_only")
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir() if p.name.startswith("adapter")) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]


def _save_adapter(lora, tmp_path):
    out = tmp_path / "adapter_src"
    lora.save_pretrained(str(out))
    return str(out)


# ------------------------------------------------------------------ upstream verl's FSDP layout
def _upstream_writer(rank, init_file, model_dir, out):
    """What upstream's FSDPCheckpointManager.save_checkpoint writes for one FSDP2 rank."""
    import random

    import numpy as np
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.utils.fsdp_utils import apply_fsdp2, create_device_mesh, get_full_state_dict

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    apply_fsdp2(model, create_device_mesh(2, -1, "cpu"), reshard_after_forward=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** (step + 1))
    ids = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(rank))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    sched.step()
    actor = os.path.join(out, "global_step_3", "actor")
    os.makedirs(actor, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(actor, f"model_world_size_2_rank_{rank}.pt"))
    torch.save(opt.state_dict(), os.path.join(actor, f"optim_world_size_2_rank_{rank}.pt"))
    rng = {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
    torch.save(
        {"lr_scheduler": sched.state_dict(), "rng": rng},
        os.path.join(actor, f"extra_state_world_size_2_rank_{rank}.pt"),
    )
    full = {k: v.clone() for k, v in get_full_state_dict(model).items()}
    moments = {n: opt.state[p]["exp_avg_sq"].full_tensor().clone() for n, p in model.named_parameters()}
    if rank == 0:
        model.config.save_pretrained(os.path.join(actor, "huggingface"))
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(os.path.join(actor, "huggingface"))
        with open(os.path.join(actor, "fsdp_config.json"), "w") as fh:
            json.dump({"FSDP_version": 2, "world_size": 2}, fh)
        torch.save({"model": full, "exp_avg_sq": moments}, os.path.join(out, "reference.pt"))
    end_spawned_rank()


@pytest.fixture(scope="module")
def upstream_ckpt(model_dir, tmp_path_factory):
    import torch.multiprocessing as mp

    out = str(tmp_path_factory.mktemp("upstream"))
    mp.spawn(_upstream_writer, args=(os.path.join(out, "init"), model_dir, out), nprocs=2, join=True)
    return out


@pytest.mark.slow
def test_merge_an_upstream_fsdp_checkpoint(upstream_ckpt, tmp_path):
    reference = torch.load(os.path.join(upstream_ckpt, "reference.pt"))
    _merge(os.path.join(upstream_ckpt, "global_step_3", "actor"), tmp_path / "merged")
    _assert_weights(tmp_path / "merged", reference["model"])


@pytest.mark.slow
def test_resume_from_an_upstream_fsdp_checkpoint(upstream_ckpt, model_dir):
    """`trainer.resume_from_path` at an upstream global_step_N: weights, Adam moments and the LR
    schedule of the two-rank run continue in one process."""
    from transformers import AutoModelForCausalLM

    from verl.trainer.ppo.checkpoint import TrainerCheckpointer, upstream_step_dir
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    step_dir = os.path.join(upstream_ckpt, "global_step_3")
    assert upstream_step_dir(step_dir) == step_dir == upstream_step_dir(os.path.join(step_dir, "actor"))
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** (step + 1))
    mgr = FSDPCheckpointManager(model, opt, sched)
    group = SimpleNamespace(load_checkpoint=lambda path, hdfs, del_local_after_load: mgr.load_checkpoint(path))
    trainer = SimpleNamespace(
        cfg=SimpleNamespace(
            trainer=SimpleNamespace(default_local_dir="unused", resume_mode="resume_path", resume_from_path=step_dir)
        ),
        actor_rollout_wg=group,
        use_critic=False,
        train_dataloader=SimpleNamespace(load_state_dict=lambda state: None),
        global_steps=0,
    )
    assert TrainerCheckpointer(trainer).load() == 3 and trainer.global_steps == 3
    reference = torch.load(os.path.join(upstream_ckpt, "reference.pt"))
    for name, value in model.state_dict().items():
        assert torch.equal(value, reference["model"][name]), name
    for name, p in model.named_parameters():
        assert torch.equal(opt.state[p]["exp_avg_sq"], reference["exp_avg_sq"][name]), name
    assert sched.last_epoch == 1 and opt.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.25)
