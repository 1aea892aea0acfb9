"""Save and resume of `SFTTrainer` with the RL trainer's checkpoint guarantees.

Every rank calls `save` / `load` (they are collective). Rank 0 owns the directory protocol of
`verl.trainer.ppo.checkpoint.save_checkpoint_atomically` (hidden staging directory, manifest,
fsync, rename, tracker file last); every rank writes its part into the staging directory, whose
name rank 0 broadcasts: the model, optimizer, schedule and RNG through `FSDPCheckpointManager`
(the RL actor's format) and its own data-loader position `data_<rank>.pt`. Layout: see
`verl.trainer.sft_trainer`.

Resume restores the weights, the optimizer state, the schedule, every rank's RNG streams, every
rank's position in the epoch (`StatefulDataLoader`: mid-epoch, or "epoch finished" at a boundary)
and the step counter, so the run continues exactly as it would have without the restart. The
data position depends on the number of processes: resuming with another number fails, naming both.
"""

from __future__ import annotations

import logging
import os
import shutil

import torch.distributed as dist

from verl.trainer.ppo.checkpoint import (
    TRAINER_STATE_FILE,
    checkpoint_to_resume,
    list_checkpoints,
    remove_stale_tmp_dirs,
    save_checkpoint_atomically,
    step_dir,
    step_of,
    verify_checkpoint,
)
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.checkpoint.integrity import load_plain, save_plain, verify_manifest

logger = logging.getLogger(__name__)

__all__ = ["SFTCheckpointer", "data_state_file"]


def data_state_file(rank: int) -> str:
    return f"data_{rank}.pt"


def _broadcast(value):
    """Rank 0's `value` on every rank."""
    if dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _barrier() -> None:
    if dist.get_world_size() > 1:
        dist.barrier()


class SFTCheckpointer:
    """Checkpoints of one `SFTTrainer` under `trainer.default_local_dir` (see the module docstring)."""

    def __init__(self, trainer):
        self.trainer = trainer
        cfg = trainer.config
        contents = {
            "save_contents": list(cfg.checkpoint.save_contents),
            "load_contents": list(cfg.checkpoint.get("load_contents") or cfg.checkpoint.save_contents),
        }
        self.manager = FSDPCheckpointManager(
            trainer.model,
            trainer.optimizer,
            trainer.lr_scheduler,
            processing_class=trainer.tokenizer,
            checkpoint_config=contents,
        )
        self.root = os.path.abspath(cfg.trainer.default_local_dir)
        self.latest_path: str | None = None
        self.saved_step: int | None = None

    # -- save ----------------------------------------------------------------------------------------
    def save(self, step: int) -> str:
        """Write `global_step_<step>` (collective); returns its path."""
        t = self.trainer
        if step == self.saved_step:
            return self.latest_path
        rank = t.rank
        state = {"global_step": int(step), "total_tokens": int(t.total_tokens), "world_size": t.world_size}

        def write(tmp: str | None) -> None:
            tmp = _broadcast(tmp)
            self.manager.save_checkpoint(tmp, global_step=step)
            save_plain(t.train_loader.state_dict(), os.path.join(tmp, data_state_file(rank)), "dataloader state")
            _barrier()  # every rank's files are in place before rank 0 marks the directory complete
            if rank == 0:
                save_plain(state, os.path.join(tmp, TRAINER_STATE_FILE), "trainer state")

        if rank == 0:
            path = save_checkpoint_atomically(self.root, step, write)
            self._prune(step)
            self._copy_to_hdfs_dir(path)
        else:
            write(None)
            path = step_dir(self.root, step)
        _barrier()
        self.saved_step, self.latest_path = step, path
        return path

    def _prune(self, newest_step: int) -> None:
        keep = self.trainer.config.trainer.get("max_ckpt_to_keep")
        if not keep or int(keep) <= 0:
            return
        ckpts = [p for s, p in list_checkpoints(self.root) if s <= newest_step]
        for path in ckpts[: -int(keep)]:
            shutil.rmtree(path, ignore_errors=True)

    def _copy_to_hdfs_dir(self, path: str) -> None:
        remote = self.trainer.config.trainer.get("default_hdfs_dir")
        if not remote:
            return
        if "://" in str(remote):
            raise NotImplementedError(
                f"trainer.default_hdfs_dir={remote!r}: only a local or mounted directory is supported here"
            )
        dest = os.path.join(remote, os.path.basename(path))
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(path, dest)

    # -- resume --------------------------------------------------------------------------------------
    def _path_to_resume(self) -> str | None:
        tr = self.trainer.config.trainer
        mode = tr.get("resume_mode", "auto")
        if mode == "disable":
            return None
        path = tr.get("resume_from_path")
        if path:
            path = os.path.abspath(path)
            if not os.path.isfile(os.path.join(path, TRAINER_STATE_FILE)):
                raise FileNotFoundError(
                    f"trainer.resume_from_path={path!r} is not a complete checkpoint (no {TRAINER_STATE_FILE})"
                )
            step_of(path)
            verify_checkpoint(path)
            return path
        return checkpoint_to_resume(self.root)

    def load(self) -> int:
        """Resume per `trainer.resume_mode` (collective); returns the restored step (0: fresh)."""
        t = self.trainer
        found = None
        if t.rank == 0:
            try:
                remove_stale_tmp_dirs(self.root)
                found = (self._path_to_resume(), None)
            except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
                found = (None, exc)
        path, error = _broadcast(found)
        if error is not None:
            raise error
        if path is None:
            return 0
        data_file = data_state_file(t.rank)
        verify_manifest(path, recursive=False, only=[TRAINER_STATE_FILE, data_file])
        state = load_plain(os.path.join(path, TRAINER_STATE_FILE))
        if int(state["world_size"]) != t.world_size:
            raise ValueError(
                f"checkpoint {path} was written by {state['world_size']} processes and this run has {t.world_size}: "
                "the position in the data depends on the number of processes; resume with the same number"
            )
        self.manager.load_checkpoint(path)
        t.train_loader.load_state_dict(load_plain(os.path.join(path, data_file)))
        t.total_tokens = int(state["total_tokens"])
        if t.rank == 0:
            logger.warning("resumed from %s (step %d)", path, state["global_step"])
        self.saved_step, self.latest_path = int(state["global_step"]), path
        return int(state["global_step"])
