"""FSDPCheckpointManager on one process: layout (DCP shards), exact resume (weights, optimizer,
schedule, RNG), the streamed Hugging Face export, the earlier full-state layout, atomic
replacement, retention, contents selection, tracker helpers, damage and safety. Two ranks and
resharding: test_checkpoint_reshard.py."""

from __future__ import annotations

import os

import pytest
import torch
from test_workers_common import build_tiny_llama

from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path, get_checkpoint_tracker_filename
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return build_tiny_llama(str(tmp_path_factory.mktemp("tiny_ckpt")))


def _setup(model_dir, **ckpt_cfg):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
    tok = AutoTokenizer.from_pretrained(model_dir)
    mgr = FSDPCheckpointManager(model, opt, sched, processing_class=tok, checkpoint_config=ckpt_cfg or None)
    return model, opt, sched, mgr


def _train_step(model, opt, sched):
    ids = torch.randint(0, 40, (2, 6))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()


def test_save_load_resumes_exactly(model_dir, tmp_path):

    model, opt, sched, mgr = _setup(model_dir)
    _train_step(model, opt, sched)
    path = str(tmp_path / "global_step_1" / "actor")
    mgr.save_checkpoint(path, global_step=1)
    assert sorted(os.listdir(path)) == [
        "checkpoint_meta.json",
        "dcp",
        "extra_state_world_size_1_rank_0.pt",
        "huggingface",
        "manifest.json",
    ]
    assert sorted(os.listdir(os.path.join(path, "dcp"))) == [".metadata", "__0_0.distcp"]
    assert not os.path.exists(path + ".incomplete")
    # huggingface/ holds config and tokenizer (for the merger); the weights only with hf_model
    hf_files = os.listdir(os.path.join(path, "huggingface"))
    assert {"config.json", "tokenizer.json"} <= set(hf_files) and "model.safetensors" not in hf_files
    # continue: the reference trajectory
    torch.manual_seed(7)
    _train_step(model, opt, sched)
    expected = {k: v.clone() for k, v in model.state_dict().items()}

    model2, opt2, sched2, mgr2 = _setup(model_dir)
    meta = mgr2.load_checkpoint(path)
    assert meta["global_step"] == 1 and sched2.last_epoch == sched.last_epoch - 1
    torch.manual_seed(7)
    _train_step(model2, opt2, sched2)
    for k, v in model2.state_dict().items():
        torch.testing.assert_close(v, expected[k], atol=0, rtol=0)
    # RNG state saved at checkpoint time is restored by load
    model3, opt3, sched3, mgr3 = _setup(model_dir)
    torch.manual_seed(123)
    mgr3.save_checkpoint(str(tmp_path / "rng"), global_step=2)
    first = torch.rand(3)
    mgr3.load_checkpoint(str(tmp_path / "rng"))
    assert torch.equal(torch.rand(3), first)


def test_hf_model_export_is_streamed_from_the_shards(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    model, opt, sched, mgr = _setup(model_dir, save_contents=["model", "optimizer", "extra", "hf_model"])
    _train_step(model, opt, sched)
    path = str(tmp_path / "ckpt")
    mgr.save_checkpoint(path, global_step=1)
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(path, "huggingface"))
    theirs = hf.state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(value, theirs[name]), name
    assert os.path.exists(os.path.join(path, "huggingface", "tokenizer.json"))


def test_the_earlier_full_state_layout_still_loads(model_dir, tmp_path):
    """A checkpoint of the layout before DCP (huggingface/model.safetensors + optim.pt) resumes."""
    import json

    from safetensors.torch import save_file

    from verl.utils.checkpoint.integrity import rng_state_to_plain, save_plain, write_manifest
    from verl.utils.fsdp_utils import get_full_optimizer_state_dict

    model, opt, sched, mgr = _setup(model_dir)
    _train_step(model, opt, sched)
    path = tmp_path / "old"
    (path / "huggingface").mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "huggingface/model.safetensors"))
    model.config.save_pretrained(str(path / "huggingface"))
    save_plain(get_full_optimizer_state_dict(model, opt), str(path / "optim.pt"))
    save_plain(
        {"lr_scheduler": sched.state_dict(), "rng": rng_state_to_plain(mgr.get_rng_state())},
        str(path / "extra_state_world_size_1_rank_0.pt"),
    )
    meta = {"global_step": 3, "world_size": 1, "contents": ["extra", "model", "optimizer"]}
    (path / "checkpoint_meta.json").write_text(json.dumps(meta))
    write_manifest(str(path))
    model2, opt2, sched2, mgr2 = _setup(model_dir)
    assert mgr2.load_checkpoint(str(path))["global_step"] == 3
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)
        assert torch.equal(opt.state[a]["exp_avg_sq"], opt2.state[b]["exp_avg_sq"])


def test_overwrite_is_atomic_and_stale_staging_is_removed(model_dir, tmp_path):
    model, opt, sched, mgr = _setup(model_dir)
    path = str(tmp_path / "ckpt")
    os.makedirs(path + ".incomplete")  # left by a crash
    open(os.path.join(path + ".incomplete", "junk"), "w").close()
    mgr.save_checkpoint(path, global_step=1)
    _train_step(model, opt, sched)
    mgr.save_checkpoint(path, global_step=2)  # replaces the directory as a whole
    assert not os.path.exists(path + ".incomplete") and not os.path.exists(path + ".old")
    model2, opt2, sched2, mgr2 = _setup(model_dir)
    assert mgr2.load_checkpoint(path)["global_step"] == 2
    for a, b in zip(model.parameters(), model2.parameters(), strict=False):
        assert torch.equal(a, b)


def test_retention_keeps_the_newest(model_dir, tmp_path):
    _, _, _, mgr = _setup(model_dir, save_contents=["model"])
    paths = [str(tmp_path / f"global_step_{i}") for i in range(4)]
    for i, p in enumerate(paths):
        mgr.save_checkpoint(p, global_step=i, max_ckpt_to_keep=2)
    assert [os.path.exists(p) for p in paths] == [False, False, True, True]


def test_contents_selection_and_missing_contents(model_dir, tmp_path):
    model, opt, sched, mgr = _setup(model_dir, save_contents=["model"])
    path = str(tmp_path / "weights_only")
    mgr.save_checkpoint(path)
    assert sorted(os.listdir(path)) == ["checkpoint_meta.json", "dcp", "huggingface", "manifest.json"]
    _, _, _, full = _setup(model_dir)  # wants model + optimizer + extra
    with pytest.raises(ValueError, match=r"does not contain \['extra', 'optimizer'\]"):
        full.load_checkpoint(path)
    with pytest.raises(ValueError, match="unknown entries"):
        _setup(model_dir, save_contents=["model", "weights"])
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        full.load_checkpoint(str(tmp_path))
    assert full.load_checkpoint(None) is None


def test_copy_to_local_hdfs_path(model_dir, tmp_path):
    _, _, _, mgr = _setup(model_dir, save_contents=["model"])
    mgr.save_checkpoint(str(tmp_path / "a"), hdfs_path=str(tmp_path / "mirror"))
    assert os.path.exists(tmp_path / "mirror" / "dcp" / ".metadata")
    with pytest.raises(NotImplementedError, match="hdfs://"):
        mgr.save_checkpoint(str(tmp_path / "b"), hdfs_path="hdfs://cluster/x")
    assert not os.path.exists(tmp_path / "b")  # refused before anything (or any collective) ran
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the mirror's parent directory should be")
    with pytest.raises(RuntimeError, match="failed on rank 0"):
        mgr.save_checkpoint(str(tmp_path / "c"), hdfs_path=str(blocker / "mirror"))


def test_tracker_helpers(tmp_path):
    root = str(tmp_path)
    assert find_latest_ckpt_path(root) is None
    os.makedirs(tmp_path / "global_step_5")
    with open(get_checkpoint_tracker_filename(root), "w") as f:
        f.write("5")
    assert find_latest_ckpt_path(root) == os.path.join(root, "global_step_5")
    with open(get_checkpoint_tracker_filename(root), "w") as f:
        f.write("7")
    assert find_latest_ckpt_path(root) is None  # tracker points at a missing directory


# ------------------------------------------------------------------ safety and damage (issue 15)
def test_pt_files_load_with_weights_only_and_hold_only_plain_objects(model_dir, tmp_path):
    from verl.utils.checkpoint.integrity import load_plain

    model, opt, sched, mgr = _setup(model_dir)
    _train_step(model, opt, sched)
    path = str(tmp_path / "ckpt")
    mgr.save_checkpoint(path, global_step=1)
    torch.load(os.path.join(path, "extra_state_world_size_1_rank_0.pt"), weights_only=True)  # plain objects only
    extra = load_plain(os.path.join(path, "extra_state_world_size_1_rank_0.pt"))
    assert isinstance(extra["rng"]["numpy"], dict)  # numpy's ndarray state stored as lists


class Opaque:
    """Stands for any class: unpickling it means importing and running code named by the file."""


def test_a_pickled_object_is_refused_on_load(tmp_path):
    from verl.utils.checkpoint.integrity import CheckpointCorruptError, load_plain, save_plain

    path = str(tmp_path / "evil.pt")
    torch.save({"x": Opaque()}, path)
    with pytest.raises(
        CheckpointCorruptError, match=r"evil\.pt holds an object other than .*test_checkpoint_manager.Opaque.*refused"
    ):
        load_plain(path)
    with pytest.raises(TypeError, match=r"state\['x'\] is a test_checkpoint_manager.Opaque"):
        save_plain({"x": Opaque()}, path, "state")


def test_dcp_metadata_that_would_run_code_is_refused(model_dir, tmp_path):
    """DCP itself unpickles `.metadata` without restriction; the manager's reader admits only DCP's
    own classes, so a crafted file (with a manifest that matches it) is refused, naming the class."""
    import pickle

    from verl.utils.checkpoint.integrity import CheckpointCorruptError, write_manifest

    _, _, _, mgr = _setup(model_dir)
    path = str(tmp_path / "ckpt")
    mgr.save_checkpoint(path, global_step=1)
    with open(os.path.join(path, "dcp", ".metadata"), "wb") as fh:
        pickle.dump(Opaque(), fh)
    write_manifest(path)
    with pytest.raises(CheckpointCorruptError, match=r"references test_checkpoint_manager.Opaque.*refused"):
        _setup(model_dir)[3].load_checkpoint(path)


@pytest.mark.parametrize(
    "victim",
    ["dcp/__0_0.distcp", "dcp/.metadata", "extra_state_world_size_1_rank_0.pt", "checkpoint_meta.json"],
)
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_file_is_named_on_load(model_dir, tmp_path, victim, damage):
    from verl.utils.checkpoint.integrity import CheckpointCorruptError

    model, opt, sched, mgr = _setup(model_dir)
    path = str(tmp_path / "ckpt")
    mgr.save_checkpoint(path, global_step=1)
    target = os.path.join(path, victim)
    data = open(target, "rb").read()
    with open(target, "wb") as fh:
        if damage == "truncate":
            fh.write(data[: len(data) // 2])
        else:
            fh.write(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CheckpointCorruptError, match="truncated" if damage == "truncate" else "damaged") as e:
        _setup(model_dir)[3].load_checkpoint(path)
    assert e.value.path == target and victim.split("/")[-1] in str(e.value)


def test_disk_full_during_save_names_directory_step_and_cause(model_dir, tmp_path, monkeypatch):
    import errno

    from verl.utils.checkpoint import integrity

    model, opt, sched, mgr = _setup(model_dir)
    good = str(tmp_path / "global_step_1" / "actor")
    mgr.save_checkpoint(good, global_step=1)
    real_save = torch.save

    def full_disk(obj, f, *a, **kw):
        if str(f).endswith("rank_0.pt"):
            # what torch's zip writer raises when a write hits ENOSPC
            raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 1472 vs 1366")
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(integrity.torch, "save", full_disk)
    target = str(tmp_path / "global_step_2" / "actor")
    with pytest.raises(OSError) as e:
        mgr.save_checkpoint(target, global_step=2)
    msg = str(e.value)
    assert e.value.errno == errno.ENOSPC
    assert "step 2" in msg and target in msg and "no space left on the device (ENOSPC" in msg
    assert not os.path.exists(target) and not os.path.exists(target + ".incomplete")
    assert _setup(model_dir)[3].load_checkpoint(good)["global_step"] == 1  # the previous one is intact
