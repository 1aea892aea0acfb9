"""Trainer-level checkpoint orchestration: atomic publication, discovery, crash leftovers, pruning."""

import os

import pytest

from verl.trainer.ppo.checkpoint import (
    TRACKER_FILE,
    TRAINER_STATE_FILE,
    checkpoint_to_resume,
    find_latest_ckpt_path,
    list_checkpoints,
    prune_checkpoints,
    remove_stale_tmp_dirs,
    save_checkpoint_atomically,
    step_of,
    verify_checkpoint,
)
from verl.utils.checkpoint.integrity import MANIFEST_FILE


def writer(roles=("actor", "critic"), fail_after=None):
    def write(tmp):
        for i, role in enumerate(roles):
            if fail_after is not None and i >= fail_after:
                raise OSError("disk full")
            os.makedirs(os.path.join(tmp, role))
            open(os.path.join(tmp, role, "model.pt"), "w").write(role)
        open(os.path.join(tmp, TRAINER_STATE_FILE), "w").write("state")

    return write


def test_save_publishes_dir_then_tracker(tmp_path):
    root = str(tmp_path)
    assert find_latest_ckpt_path(root) is None
    path = save_checkpoint_atomically(root, 3, writer())
    assert path == os.path.join(root, "global_step_3") and step_of(path) == 3
    assert open(os.path.join(root, TRACKER_FILE)).read() == "3"
    assert find_latest_ckpt_path(root) == path
    assert not [n for n in os.listdir(root) if n.startswith(".tmp")]


def test_crash_mid_save_leaves_previous_checkpoint_current(tmp_path):
    root = str(tmp_path)
    save_checkpoint_atomically(root, 2, writer())
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint_atomically(root, 4, writer(fail_after=1))
    assert find_latest_ckpt_path(root).endswith("global_step_2")
    assert not os.path.exists(os.path.join(root, "global_step_4"))


def test_hard_crash_leftovers_are_ignored_and_removed(tmp_path):
    root = str(tmp_path)
    save_checkpoint_atomically(root, 2, writer())
    # a process killed mid-write leaves a hidden tmp dir; one killed between rename and tracker
    # update leaves a complete dir the tracker does not name yet
    os.makedirs(os.path.join(root, ".tmp_global_step_4_999", "actor"))
    assert find_latest_ckpt_path(root).endswith("global_step_2")
    assert remove_stale_tmp_dirs(root) == [os.path.join(root, ".tmp_global_step_4_999")]
    # a directory without the trainer state (never published by us) is not a checkpoint
    os.makedirs(os.path.join(root, "global_step_9", "actor"))
    assert [s for s, _ in list_checkpoints(root)] == [2]
    # tracker lost: the newest complete directory is found
    os.remove(os.path.join(root, TRACKER_FILE))
    save_checkpoint_atomically(root, 5, writer())
    os.remove(os.path.join(root, TRACKER_FILE))
    assert find_latest_ckpt_path(root).endswith("global_step_5")


def test_resaving_a_step_replaces_it(tmp_path):
    root = str(tmp_path)
    save_checkpoint_atomically(root, 2, writer(roles=("actor",)))
    save_checkpoint_atomically(root, 2, writer(roles=("actor", "critic")))
    assert os.path.isdir(os.path.join(root, "global_step_2", "critic"))


def test_prune_keeps_newest_per_role(tmp_path):
    root = str(tmp_path)
    for s in (1, 2, 3, 4):
        save_checkpoint_atomically(root, s, writer())
    prune_checkpoints(root, max_actor_ckpt_to_keep=2, max_critic_ckpt_to_keep=3)
    have = {s: sorted(os.listdir(p)) for s, p in list_checkpoints(root)}
    assert have[4] == have[3] == ["actor", "critic", MANIFEST_FILE, TRAINER_STATE_FILE]
    assert have[2] == ["critic", MANIFEST_FILE, TRAINER_STATE_FILE]
    assert 1 not in have  # no model part left: the directory is gone
    prune_checkpoints(root, 1, None)
    assert sorted(os.listdir(os.path.join(root, "global_step_4"))) == [
        "actor",
        "critic",
        MANIFEST_FILE,
        TRAINER_STATE_FILE,
    ]


def test_step_of_rejects_other_names():
    with pytest.raises(ValueError, match="global_step_N"):
        step_of("/x/checkpoint_3")


def test_prune_never_removes_the_checkpoint_just_saved(tmp_path):
    # a run restarted from step 2 (trainer.resume_from_path) while steps 4 and 6 of the abandoned
    # run still exist saves step 4 again: with one checkpoint kept, step 4 must survive
    root = str(tmp_path)
    for s in (2, 4, 6):
        save_checkpoint_atomically(root, s, writer())
    save_checkpoint_atomically(root, 4, writer())
    prune_checkpoints(root, 1, 1, newest_step=4)
    assert find_latest_ckpt_path(root).endswith("global_step_4")
    assert sorted(os.listdir(os.path.join(root, "global_step_4"))) == [
        "actor",
        "critic",
        MANIFEST_FILE,
        TRAINER_STATE_FILE,
    ]
    assert [s for s, _ in list_checkpoints(root)] == [4, 6]  # 2 pruned; the later 6 is left alone


def test_files_are_fsynced_before_the_directory_is_published(tmp_path, monkeypatch):
    # a power loss right after the rename must not leave a published checkpoint with empty files
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save_checkpoint_atomically(str(tmp_path), 1, writer())
    publish = next(i for i, (kind, p) in enumerate(events) if kind == "replace" and ".tmp_global_step_1_" in p)
    synced = {os.path.relpath(p, events[publish][1]) for kind, p in events[:publish] if kind == "fsync"}
    assert {"actor/model.pt", "critic/model.pt", TRAINER_STATE_FILE} <= synced


# ------------------------------------------------------------------ manifest, fallback, full disk (issue 15)
def test_manifest_is_written_last_and_covers_every_file(tmp_path):
    import json

    from verl.utils.checkpoint.integrity import verify_manifest

    path = save_checkpoint_atomically(str(tmp_path), 1, writer())
    files = json.load(open(os.path.join(path, MANIFEST_FILE)))["files"]
    assert sorted(files) == ["actor/model.pt", "critic/model.pt", TRAINER_STATE_FILE]
    assert files["actor/model.pt"]["size"] == len("actor")
    assert verify_manifest(path)


def test_a_part_with_its_own_manifest_is_covered_through_it(tmp_path):
    from verl.utils.checkpoint.integrity import CheckpointCorruptError, write_manifest

    def write(tmp):
        writer()(tmp)
        open(os.path.join(tmp, "actor", "optim.pt"), "wb").write(b"x" * 100)
        write_manifest(os.path.join(tmp, "actor"))  # what FSDPCheckpointManager does for its part

    path = save_checkpoint_atomically(str(tmp_path), 1, write)
    import json

    assert "actor/optim.pt" not in json.load(open(os.path.join(path, MANIFEST_FILE)))["files"]
    with open(os.path.join(path, "actor", "optim.pt"), "wb") as fh:
        fh.write(b"x" * 99 + b"y")  # same size, other bytes
    with pytest.raises(CheckpointCorruptError, match=r"actor/optim\.pt is damaged"):
        verify_checkpoint(path)


def test_auto_resume_falls_back_to_the_previous_complete_checkpoint(tmp_path, caplog):
    root = str(tmp_path)
    for s in (2, 4):
        save_checkpoint_atomically(root, s, writer())
    assert checkpoint_to_resume(root).endswith("global_step_4")
    victim = os.path.join(root, "global_step_4", "critic", "model.pt")
    open(victim, "w").write("cr")  # truncated
    with caplog.at_level("WARNING"):
        assert checkpoint_to_resume(root).endswith("global_step_2")
    assert f"{victim} is truncated" in caplog.text and "falling back to the previous complete checkpoint" in caplog.text
    # resume_path to the damaged one names the file
    with pytest.raises(ValueError, match=r"critic/model\.pt is truncated: 2 bytes, the manifest says 6"):
        verify_checkpoint(os.path.join(root, "global_step_4"))
    # every checkpoint damaged: an error, not a silent fresh start
    os.remove(os.path.join(root, "global_step_2", TRAINER_STATE_FILE))
    save_checkpoint_atomically(root, 1, writer())
    os.remove(os.path.join(root, "global_step_1", "actor", "model.pt"))
    with pytest.raises(ValueError, match=r"every checkpoint under .* is damaged.*resume_mode=disable"):
        checkpoint_to_resume(root)


def test_checkpoints_without_manifest_resume_with_a_warning(tmp_path, caplog):
    root = str(tmp_path)
    path = save_checkpoint_atomically(root, 3, writer())
    os.remove(os.path.join(path, MANIFEST_FILE))
    with caplog.at_level("WARNING"):
        assert checkpoint_to_resume(root) == path
    assert "has no manifest" in caplog.text


def test_disk_full_during_save_names_directory_step_and_cause(tmp_path):
    import errno

    root = str(tmp_path)
    save_checkpoint_atomically(root, 2, writer())

    def full(tmp):
        os.makedirs(os.path.join(tmp, "actor"))
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as e:
        save_checkpoint_atomically(root, 4, full)
    msg = str(e.value)
    assert e.value.errno == errno.ENOSPC
    assert f"checkpoint of step 4 into {root} failed: no space left on the device (ENOSPC, " in msg
    assert "bytes free" in msg and "global_step_2 is intact" in msg
    assert open(os.path.join(root, TRACKER_FILE)).read() == "2"
    assert not [n for n in os.listdir(root) if n.startswith(".tmp")]

    # the same seen through a worker: a remote error whose text carries the cause
    def remote(tmp):
        raise RuntimeError("ActorDiedError... OSError: [Errno 28] No space left on device: '/ckpt/actor/optim.pt'")

    with pytest.raises(OSError, match="step 6 .* no space left on the device"):
        save_checkpoint_atomically(root, 6, remote)
    # any other failure still names the directory and the step
    with pytest.raises(RuntimeError, match=r"checkpoint of step 8 into .* failed: ValueError: odd"):
        save_checkpoint_atomically(root, 8, lambda tmp: (_ for _ in ()).throw(ValueError("odd")))
