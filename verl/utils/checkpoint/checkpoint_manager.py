"""Common parts of checkpointing: the latest-step tracker file, RNG state, retention of old
checkpoints and the atomic-directory protocol.

Layout written by the trainer (upstream convention):

    <default_local_dir>/latest_checkpointed_iteration.txt      "<global_step>"
    <default_local_dir>/global_step_<n>/actor/ ...             FSDPCheckpointManager of the actor
    <default_local_dir>/global_step_<n>/critic/ ...
"""

from __future__ import annotations

import os
import random
import shutil
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

__all__ = [
    "BaseCheckpointManager",
    "find_latest_ckpt_path",
    "get_checkpoint_tracker_filename",
    "should_save_ckpt_contents",
]

TRACKER_FILENAME = "latest_checkpointed_iteration.txt"


def get_checkpoint_tracker_filename(root_path: str) -> str:
    """Path of the file that holds the latest saved global step under `root_path`."""
    return os.path.join(root_path, TRACKER_FILENAME)


def find_latest_ckpt_path(path: str | None, directory_format: str = "global_step_{}") -> str | None:
    """Directory of the latest checkpoint under `path` per its tracker file, or None when there is
    none (no tracker, or the directory it names is missing)."""
    if path is None:
        return None
    tracker = get_checkpoint_tracker_filename(path)
    if not os.path.exists(tracker):
        return None
    with open(tracker) as f:
        text = f.read().strip()
    try:
        step = int(text)
    except ValueError as exc:
        raise ValueError(f"checkpoint tracker {tracker} holds {text!r}; expected an integer global step") from exc
    ckpt = os.path.join(path, directory_format.format(step))
    return ckpt if os.path.isdir(ckpt) else None


def should_save_ckpt_contents(contents, name: str) -> bool:
    return name in set(contents or [])


def _as_mapping(config) -> dict:
    """A checkpoint config as a plain dict: a mapping, or an object with `get` and iterable keys
    (`BaseConfig`), or None (empty)."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return dict(config)
    if hasattr(config, "items"):
        return dict(config.items())
    return {key: config.get(key) for key in config}


def _rank_and_world(group=None) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _barrier(group=None) -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.barrier(group=group)


class BaseCheckpointManager:
    """Holds the objects to checkpoint and implements retention and atomic writes.

    Args:
        model, optimizer, lr_scheduler: what to save (optimizer/scheduler may be None).
        processing_class: tokenizer or processor saved beside the weights (may be None).
        checkpoint_config: mapping (or a config object such as `verl.trainer.config.CheckpointConfig`)
            with `save_contents` (subset of model, optimizer, extra, hf_model), optionally
            `load_contents` (default: save_contents) and `save_lora_only`.
    """

    ALLOWED_CONTENTS = ("model", "optimizer", "extra", "hf_model")

    def __init__(
        self,
        model,
        optimizer=None,
        lr_scheduler=None,
        processing_class=None,
        checkpoint_config=None,
        process_group=None,
    ):
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.processing_class = processing_class
        self.checkpoint_config = checkpoint_config
        cfg = _as_mapping(checkpoint_config)
        self.save_contents = list(cfg.get("save_contents") or ["model", "optimizer", "extra"])
        self.load_contents = list(cfg.get("load_contents") or self.save_contents)
        for key, contents in (("save_contents", self.save_contents), ("load_contents", self.load_contents)):
            bad = sorted(set(contents) - set(self.ALLOWED_CONTENTS))
            if bad:
                raise ValueError(f"checkpoint.{key} has unknown entries {bad}; accepted: {list(self.ALLOWED_CONTENTS)}")
        self.process_group = process_group
        self.rank, self.world_size = _rank_and_world(process_group)
        self.previous_saved_paths: list[str] = []
        self.previous_global_step: int | None = None

    @property
    def should_save_lora_only(self) -> bool:
        """`checkpoint_config.save_lora_only`: a LoRA model writes only its adapter (false when unset)."""
        return bool(_as_mapping(self.checkpoint_config).get("save_lora_only", False))

    @staticmethod
    def is_lora_only_state_dict(state_dict: dict | None) -> bool:
        """True when every key of a (non-empty) state dict is an adapter weight (`lora_*` or
        `.adapter_*`): a LoRA-only checkpoint rather than full model weights."""
        return bool(state_dict) and all("lora_" in k or ".adapter_" in k for k in state_dict)

    # -- retention -----------------------------------------------------------------------------

    def remove_previous_save_local_path(self, paths) -> None:
        """Delete the given checkpoint directories (rank 0 only)."""
        if isinstance(paths, str):
            paths = [paths]
        if self.rank != 0:
            return
        for path in paths:
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)

    def _apply_retention(self, new_path: str, max_ckpt_to_keep: int | None) -> None:
        """Keep at most `max_ckpt_to_keep` checkpoints written by this manager (None/0 = all)."""
        if new_path in self.previous_saved_paths:
            self.previous_saved_paths.remove(new_path)
        self.previous_saved_paths.append(new_path)
        if max_ckpt_to_keep and max_ckpt_to_keep > 0 and len(self.previous_saved_paths) > max_ckpt_to_keep:
            drop = self.previous_saved_paths[: len(self.previous_saved_paths) - max_ckpt_to_keep]
            self.remove_previous_save_local_path(drop)
            self.previous_saved_paths = self.previous_saved_paths[len(drop) :]

    # -- atomic directory ----------------------------------------------------------------------

    def _begin_atomic(self, local_path: str) -> str:
        """Create the staging directory `<local_path>.incomplete` (rank 0) and return it."""
        staging = local_path.rstrip("/") + ".incomplete"
        if self.rank == 0:
            if os.path.exists(staging):
                shutil.rmtree(staging)
            os.makedirs(staging)
        _barrier(self.process_group)
        return staging

    def _commit_atomic(self, staging: str, local_path: str) -> None:
        """Replace `local_path` by the staging directory once every rank has written its files.

        A crash before this point leaves the previous checkpoint (if any) intact and only a
        `.incomplete` directory behind, which the next save removes.
        """
        _barrier(self.process_group)
        if self.rank == 0:
            from verl.utils.checkpoint.integrity import write_manifest

            write_manifest(staging)  # last, after every rank's files: a published directory always has one
            old = None
            if os.path.exists(local_path):
                old = local_path.rstrip("/") + ".old"
                if os.path.exists(old):
                    shutil.rmtree(old)
                os.rename(local_path, old)
            os.rename(staging, local_path)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        _barrier(self.process_group)

    # -- RNG -----------------------------------------------------------------------------------

    @staticmethod
    def get_rng_state() -> dict[str, Any]:
        state = {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    @staticmethod
    def load_rng_state(state: dict[str, Any]) -> None:
        torch.set_rng_state(state["cpu"])
        np.random.set_state(state["numpy"])
        random.setstate(state["random"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])

    # -- interface -----------------------------------------------------------------------------

    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ):
        raise NotImplementedError

    def load_checkpoint(self, local_path: str | None, hdfs_path: str | None = None, del_local_after_load: bool = False):
        raise NotImplementedError
