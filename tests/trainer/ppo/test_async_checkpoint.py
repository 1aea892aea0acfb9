"""`checkpoint.async_save=True` at the trainer level: the step directory is published only once
the workers' shards are written (`TrainerCheckpointer.finish_pending`), and a process killed while
the shards are being written leaves the previous checkpoint current and only a hidden directory
that resume ignores and removes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from test_workers_common import build_tiny_llama

from verl.trainer.ppo.checkpoint import (
    TMP_PREFIX,
    TRACKER_FILE,
    TrainerCheckpointer,
    checkpoint_to_resume,
    remove_stale_tmp_dirs,
)

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class InProcessGroup:
    """The two checkpoint methods of a worker group, for one manager in this process."""

    def __init__(self, manager):
        self.manager = manager

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        self.manager.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    def finalize_checkpoint(self):
        self.manager.finalize_save()


def make_trainer(model_dir: str, root: str, async_save: bool = True):
    from transformers import AutoModelForCausalLM

    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    checkpoint = {"save_contents": ["model", "optimizer", "extra"], "async_save": async_save}
    manager = FSDPCheckpointManager(model, opt, checkpoint_config=checkpoint)
    trainer = SimpleNamespace(
        config=OmegaConf.create({"trainer": {"default_local_dir": root}}),  # the run record's resolved config
        cfg=SimpleNamespace(
            trainer=SimpleNamespace(
                default_local_dir=root,
                max_actor_ckpt_to_keep=None,
                max_critic_ckpt_to_keep=None,
                torch_threads_per_worker=None,
            ),
            actor=SimpleNamespace(checkpoint=checkpoint),
        ),
        use_critic=False,
        actor_rollout_wg=InProcessGroup(manager),
        train_dataloader=SimpleNamespace(state_dict=lambda: {"position": 0}),
        global_steps=1,
        tracking=None,
    )
    trainer.state_dict = lambda: {"global_steps": trainer.global_steps}
    return trainer, TrainerCheckpointer(trainer), model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return build_tiny_llama(str(tmp_path_factory.mktemp("tiny_async")))


def test_an_async_save_is_published_only_when_its_shards_are_written(model_dir, tmp_path):
    root = str(tmp_path / "ckpts")
    trainer, checkpointer, model = make_trainer(model_dir, root)
    path = checkpointer.save()
    assert path == os.path.join(root, "global_step_1")
    assert not os.path.exists(path) and not os.path.exists(os.path.join(root, TRACKER_FILE))
    assert checkpointer.pending is not None
    with torch.no_grad():  # training goes on while the shards are written: they hold the saved values
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        for p in model.parameters():
            p.add_(1.0)
    assert checkpointer.finish_pending() == path
    assert open(os.path.join(root, TRACKER_FILE)).read() == "1"
    trainer.global_steps = 2
    checkpointer.save()  # the next save publishes nothing before its own shards are written...
    assert not os.path.exists(os.path.join(root, "global_step_2"))
    checkpointer.finish_pending()  # ...the end of the run does
    assert open(os.path.join(root, TRACKER_FILE)).read() == "2"

    from transformers import AutoModelForCausalLM

    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    fresh = AutoModelForCausalLM.from_pretrained(model_dir)
    FSDPCheckpointManager(fresh, checkpoint_config={"save_contents": ["model"]}).load_checkpoint(
        os.path.join(path, "actor")
    )
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, saved[k]), k


CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.path[:0] = [{tests!r}, {here!r}, {workers!r}]
    import torch.distributed.checkpoint as dcp
    from test_async_checkpoint import make_trainer

    root, model_dir, marker = sys.argv[1:4]
    trainer, checkpointer, _ = make_trainer(model_dir, root)
    checkpointer.save()
    checkpointer.finish_pending()  # step 1: published
    real_write = dcp.FileSystemWriter.write_data

    def slow_write(self, plan, planner):  # the background writer: data written, metadata not yet
        done = real_write(self, plan, planner)
        open(marker, "w").close()
        time.sleep(120)
        return done

    dcp.FileSystemWriter.write_data = slow_write
    trainer.global_steps = 2
    checkpointer.save()  # returns while the shards of step 2 are being written
    while not os.path.exists(marker):
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.slow
def test_a_kill_during_an_async_save_never_publishes_it(model_dir, tmp_path):
    root = str(tmp_path / "ckpts")
    script = tmp_path / "child.py"
    here = os.path.dirname(os.path.abspath(__file__))
    script.write_text(CHILD.format(tests=TESTS, here=here, workers=os.path.join(TESTS, "workers")))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(script), root, model_dir, str(tmp_path / "writing")], env=env, timeout=300
    )
    assert proc.returncode == -9  # killed mid-write, as intended
    names = sorted(os.listdir(root))
    assert "global_step_1" in names and "global_step_2" not in names
    assert open(os.path.join(root, TRACKER_FILE)).read() == "1"
    (hidden,) = [n for n in names if n.startswith(TMP_PREFIX)]
    shards = os.path.join(root, hidden, "actor.incomplete", "dcp")
    assert os.listdir(shards) and not os.path.exists(os.path.join(shards, ".metadata"))  # caught mid-write
    assert checkpoint_to_resume(root) == os.path.join(root, "global_step_1")
    assert remove_stale_tmp_dirs(root) == [os.path.join(root, hidden)]
    trainer, _, _ = make_trainer(model_dir, str(tmp_path / "other"), async_save=False)
    meta = trainer.actor_rollout_wg.manager.load_checkpoint(os.path.join(root, "global_step_1", "actor"))
    assert meta["global_step"] == 1
