"""Trainer-level checkpoints: atomic step directories, the tracker file, discovery and pruning.

Layout under `trainer.default_local_dir`::

    latest_checkpointed_iteration.txt    "N": the newest complete checkpoint (written last)
    global_step_N/
        actor/                           the actor worker group's files (model, optimizer, scheduler, RNG)
        critic/                          the critic's, when there is one
        data.pt                          dataloader state (position in the epoch, sampler state)
        trainer_state.pt                 step counter, driver RNG states, KL controller, hook state,
                                         the step's metrics (re-logged on resume if the log lacks them)
        run_record.json                  what `verl.trainer.replay` needs: the resolved config, the
                                         versions, threads and device of the run
        manifest.json                    size and SHA-256 of every file (a part's own manifest covers
                                         its files), written last, before the rename

Atomicity: everything is written into a hidden sibling `.tmp_global_step_N_<pid>` first; only when
all writers returned (and their files are fsynced) is it renamed to `global_step_N` (a rename
within one directory is atomic), and only then is the tracker file replaced (also atomically). A
crash at any point leaves either the previous checkpoint as the newest one, or the new one
complete; half-written directories are hidden, ignored by discovery and removed at the next
start. (Workers on other nodes must see the same directory: multi-node runs need a shared file
system for checkpoints.)

Integrity: `.pt` files hold only tensors and plain containers and load with
`torch.load(weights_only=True)`. Before resuming, the checkpoint is verified against its manifest;
a damaged or truncated file is named. With `resume_mode=auto` a damaged newest checkpoint is
skipped with a warning and the previous complete one is used (`checkpoint_to_resume`). A failed
save (a full disk, typically) raises naming the directory, the step and the cause; the previous
checkpoint and the tracker are untouched.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from verl.trainer.ppo.step_context import is_due
from verl.utils.checkpoint.integrity import (
    CheckpointCorruptError,
    disk_full_cause,
    load_plain,
    rng_state_from_plain,
    rng_state_to_plain,
    save_plain,
    verify_manifest,
    write_manifest,
)
from verl.utils.fs import atomic_write_text, fsync_dir, fsync_tree
from verl.utils.reproducibility import environment
from verl.utils.tracking import to_jsonable

logger = logging.getLogger(__name__)

TRACKER_FILE = "latest_checkpointed_iteration.txt"
STEP_DIR_RE = re.compile(r"^global_step_(\d+)$")
TMP_PREFIX = ".tmp_global_step_"
TRAINER_STATE_FILE = "trainer_state.pt"
RUN_RECORD_FILE = "run_record.json"


def get_checkpoint_tracker_filename(root_path: str) -> str:
    """Path of the tracker file of a checkpoint root (upstream name)."""
    return os.path.join(root_path, TRACKER_FILE)


def step_dir(root_path: str, step: int) -> str:
    return os.path.join(root_path, f"global_step_{step}")


def list_checkpoints(root_path: str) -> list[tuple[int, str]]:
    """Complete checkpoint directories (step, path), oldest first."""
    if not os.path.isdir(root_path):
        return []
    out = []
    for name in os.listdir(root_path):
        m = STEP_DIR_RE.match(name)
        path = os.path.join(root_path, name)
        if m and os.path.isfile(os.path.join(path, TRAINER_STATE_FILE)):
            out.append((int(m.group(1)), path))
    return sorted(out)


def find_latest_ckpt_path(root_path: str) -> str | None:
    """The newest complete checkpoint: the one the tracker names, else the highest complete
    `global_step_N` (tracker lost); None when there is none."""
    tracker = get_checkpoint_tracker_filename(root_path)
    if os.path.isfile(tracker):
        text = open(tracker, encoding="utf-8").read().strip()
        if not text.isdigit():
            raise ValueError(f"checkpoint tracker {tracker} holds {text!r}; expected a step number")
        path = step_dir(root_path, int(text))
        if os.path.isfile(os.path.join(path, TRAINER_STATE_FILE)):
            return path
        logger.warning(
            "checkpoint tracker %s names %s, which is missing or incomplete; looking for others", tracker, path
        )
    ckpts = list_checkpoints(root_path)
    return ckpts[-1][1] if ckpts else None


def step_of(path: str) -> int:
    m = STEP_DIR_RE.match(os.path.basename(os.path.normpath(path)))
    if not m:
        raise ValueError(f"{path!r} is not a checkpoint directory (expected a name like global_step_N)")
    return int(m.group(1))


def upstream_step_dir(path: str) -> str | None:
    """The `global_step_N` directory when `path` is one written by upstream verl's FSDP trainer
    (its `actor/` holds `fsdp_config.json` and per-rank model files), or is its `actor/`; else None."""
    from verl.utils.checkpoint.upstream_fsdp import is_upstream_fsdp_dir

    path = os.path.normpath(path)
    if os.path.isdir(os.path.join(path, "actor")) and is_upstream_fsdp_dir(os.path.join(path, "actor")):
        return path if STEP_DIR_RE.match(os.path.basename(path)) else None
    if os.path.isdir(path) and is_upstream_fsdp_dir(path) and os.path.basename(path) == "actor":
        parent = os.path.dirname(path)
        return parent if STEP_DIR_RE.match(os.path.basename(parent)) else None
    return None


def remove_stale_tmp_dirs(root_path: str) -> list[str]:
    """Delete half-written checkpoint directories left by a crash; returns what was removed."""
    removed = []
    if os.path.isdir(root_path):
        for name in os.listdir(root_path):
            if name.startswith(TMP_PREFIX):
                path = os.path.join(root_path, name)
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def save_checkpoint_atomically(root_path: str, step: int, write_fn: Callable[[str], None]) -> str:
    """Call `write_fn(tmp_dir)` to write all parts of the checkpoint of `step`, then publish it.

    `write_fn` must write `trainer_state.pt` (the marker of a complete checkpoint) among its
    files. Returns the final `global_step_N` path.
    """
    return publish_checkpoint(root_path, step, stage_checkpoint(root_path, step, write_fn))


def stage_checkpoint(root_path: str, step: int, write_fn: Callable[[str], None]) -> str:
    """Call `write_fn(tmp_dir)` in a fresh hidden `.tmp_global_step_N_<pid>`; returns it. Nothing
    is published: a crash from here to `publish_checkpoint` leaves only the hidden directory."""
    os.makedirs(root_path, exist_ok=True)
    tmp = os.path.join(root_path, f"{TMP_PREFIX}{step}_{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        write_fn(tmp)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception):
            raise _save_error(exc, root_path, step) from exc
        raise
    return tmp


def publish_checkpoint(root_path: str, step: int, tmp: str) -> str:
    """Check the staged `tmp` is complete, write its manifest, fsync, rename it to `global_step_N`
    and then update the tracker; returns the final path."""
    try:
        try:
            if not os.path.isfile(os.path.join(tmp, TRAINER_STATE_FILE)):
                raise RuntimeError(f"checkpoint writer produced no {TRAINER_STATE_FILE} in {tmp}")
            write_manifest(tmp)  # last: a directory with a manifest was written completely
            fsync_tree(tmp)  # the files are on disk before their directory is published
        except Exception as exc:  # noqa: BLE001 - re-raised naming the directory, the step and the cause
            raise _save_error(exc, root_path, step) from exc
        final = step_dir(root_path, step)
        if os.path.exists(final):
            # the same step saved again (e.g. a run restarted from an older checkpoint): the old
            # copy is moved aside first so the rename below stays a single atomic step
            old = os.path.join(root_path, f"{TMP_PREFIX}{step}_replaced_{os.getpid()}")
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, final)
        fsync_dir(root_path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(get_checkpoint_tracker_filename(root_path), str(step))
    return final


def _save_error(exc: Exception, root_path: str, step: int) -> Exception:
    previous = find_latest_ckpt_path(root_path)
    kept = f"; the previous checkpoint {previous} is intact" if previous else ""
    cause = disk_full_cause(exc, root_path)
    if cause:
        return OSError(
            errno.ENOSPC,
            f"saving the checkpoint of step {step} into {root_path} failed: {cause}{kept}. "
            "Free space there, point trainer.default_local_dir elsewhere, or keep fewer checkpoints "
            "(trainer.max_actor_ckpt_to_keep)",
        )
    text = str(exc).strip().splitlines()
    message = (
        f"saving the checkpoint of step {step} into {root_path} failed: {type(exc).__name__}: "
        f"{text[0] if text else ''}{kept}"
    )
    if isinstance(exc, OSError):
        return OSError(exc.errno, message) if exc.errno is not None else OSError(message)
    return RuntimeError(message)


def verify_checkpoint(path: str) -> bool:
    """Check `path` against its manifest(s); raises `CheckpointCorruptError` naming the bad file.
    False when it has no manifest (written by an older version; a warning says it is unchecked)."""
    if verify_manifest(path, recursive=True):
        return True
    logger.warning("checkpoint %s has no manifest (written by an older version): resuming without verifying it", path)
    return False


def checkpoint_to_resume(root_path: str) -> str | None:
    """`resume_mode=auto`: the newest checkpoint under `root_path` that verifies, else None when
    there is none. A damaged one is skipped with a warning naming its bad file; if every
    checkpoint is damaged, the error lists them (starting from scratch would hide it)."""
    newest = find_latest_ckpt_path(root_path)
    if newest is None:
        return None
    candidates = [newest] + [
        p for _, p in reversed(list_checkpoints(root_path)) if p != newest and step_of(p) < step_of(newest)
    ]
    problems = []
    for path in candidates:
        try:
            verify_checkpoint(path)
        except CheckpointCorruptError as exc:
            problems.append(str(exc))
            logger.warning(
                "resume: checkpoint %s is damaged (%s); falling back to the previous complete checkpoint", path, exc
            )
            continue
        if problems:
            logger.warning("resume: using %s instead of the damaged newer checkpoint(s)", path)
        return path
    raise CheckpointCorruptError(
        f"every checkpoint under {root_path} is damaged: {'; '.join(problems)}. Remove or repair them, or set "
        "trainer.resume_mode=disable to start from scratch",
        candidates[0],
    )


def prune_checkpoints(
    root_path: str,
    max_actor_ckpt_to_keep: int | None,
    max_critic_ckpt_to_keep: int | None,
    roles: tuple[str, ...] = ("actor", "critic"),
    newest_step: int | None = None,
) -> list[str]:
    """Keep the newest `max_actor_ckpt_to_keep` actor parts and `max_critic_ckpt_to_keep` critic
    parts (None = keep all); a step directory whose model parts are all gone is removed entirely.
    The newest checkpoint is never touched. Returns the removed paths.

    `newest_step` (the step just saved) counts as the newest: checkpoints of later steps (left by
    an earlier run when this one was restarted from an older checkpoint) are neither counted nor
    removed, so the checkpoint just written is never pruned."""
    limits = {"actor": max_actor_ckpt_to_keep, "critic": max_critic_ckpt_to_keep}
    ckpts = list_checkpoints(root_path)
    if newest_step is not None:
        ckpts = [(s, p) for s, p in ckpts if s <= newest_step]
    removed = []
    for role in roles:
        limit = limits.get(role)
        if limit is None:
            continue
        limit = max(int(limit), 1)
        for _, path in ckpts[:-limit]:
            part = os.path.join(path, role)
            if os.path.isdir(part):
                shutil.rmtree(part)
                removed.append(part)
    for _, path in ckpts[:-1]:
        if not any(os.path.isdir(os.path.join(path, r)) for r in roles):
            shutil.rmtree(path)
            removed.append(path)
    return removed


def seed_driver(seed: int) -> None:
    """Seed the driver's Python, NumPy and torch generators (restored from a checkpoint on resume)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def driver_rng_state() -> dict:
    """The driver's Python / NumPy / torch generator states as plain containers (numpy's state as
    lists), so `trainer_state.pt` loads with `weights_only=True`."""
    return rng_state_to_plain(
        {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    )


def restore_driver_rng(plain: dict) -> None:
    """Restore what `driver_rng_state` saved."""
    rng = rng_state_from_plain(plain)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])


def write_run_record(trainer: Any, path: str) -> None:
    """`run_record.json` of a checkpoint: the step, the resolved config and the environment
    (`verl.utils.reproducibility.environment`: versions, the workers' torch threads, the device)."""
    from omegaconf import OmegaConf

    tr = trainer.cfg.trainer
    record = {
        "format": 1,
        "step": trainer.global_steps,
        "config": OmegaConf.to_container(trainer.config, resolve=True),
        "environment": environment(threads=tr.torch_threads_per_worker, device=getattr(trainer, "device_name", None)),
    }
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1, sort_keys=True, default=str)


def read_run_record(step_path: str) -> dict | None:
    """The `run_record.json` of a `global_step_N` directory, or None (written before records)."""
    path = os.path.join(step_path, RUN_RECORD_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def trainer_state(trainer: Any) -> dict:
    """The driver's state saved in `trainer_state.pt`: `global_steps`, `epoch`, `rng` (the
    driver's generators), `kl_ctrl_value` (adaptive KL in reward) and `callbacks` (each hook's
    `state_dict()`); `TrainerCheckpointer.save` adds `step_metrics`."""
    kl = trainer.kl_ctrl_in_reward
    return {
        "global_steps": trainer.global_steps,
        "epoch": trainer.epoch,
        "rng": driver_rng_state(),
        "kl_ctrl_value": None if kl is None else kl.value,
        "callbacks": [cb.state_dict() for cb in trainer.callbacks],
    }


def restore_trainer_state(trainer: Any, state: dict) -> None:
    """Restore what `trainer_state` saved (callback states in order; a count mismatch warns)."""
    trainer.global_steps = int(state["global_steps"])
    trainer.epoch = int(state["epoch"])
    restore_driver_rng(state["rng"])
    trainer._resumed_step_metrics = state.get("step_metrics")
    if trainer.kl_ctrl_in_reward is not None and state.get("kl_ctrl_value") is not None:
        trainer.kl_ctrl_in_reward.value = float(state["kl_ctrl_value"])
    saved = state.get("callbacks", [])
    if len(saved) != len(trainer.callbacks):
        logger.warning(
            "the checkpoint holds the state of %d callbacks but this run has %d; states are restored "
            "in order and the rest is left as constructed",
            len(saved),
            len(trainer.callbacks),
        )
    for cb, s in zip(trainer.callbacks, saved, strict=False):
        cb.load_state_dict(s)


class TrainerCheckpointer:
    """Checkpoint cadence, save and resume of one `RayPPOTrainer` (torchtitan-style component).

    A checkpoint holds the worker groups' parts (`actor/`, `critic/`), the dataloader position
    (`data.pt`) and the trainer's `state_dict()` (`trainer_state.pt`, plus the step's metrics).
    `saved_step` is the last step saved (a resumed run's current step counts), so a run that ends
    early is saved once at its end.

    With `checkpoint.async_save` (actor or critic) the workers return while their shards are still
    being written: the step directory stays hidden (`pending`) until `finish_pending()`, which the
    next save and the end of the run call; it waits for the workers' writes and only then
    publishes the directory and the tracker.
    """

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.saved_step: int | None = None
        self.pending: tuple[int, str] | None = None  # (step, hidden directory) of an async save

    @property
    def async_save(self) -> bool:
        t = self.trainer
        roles = [t.cfg.actor.checkpoint] + ([t.cfg.critic.checkpoint] if t.use_critic else [])
        return any(bool(dict(c or {}).get("async_save", False)) for c in roles)

    def should_save(self, step: int, is_last: bool) -> bool:
        """Every `trainer.save_freq` steps and at the last step, once per step; never when
        `save_freq <= 0`."""
        if step <= 0 or step == self.saved_step:
            return False
        return is_due(self.trainer.cfg.trainer.save_freq, step, is_last)

    def save(self, metrics: dict | None = None) -> str:
        """Write `global_step_N` atomically, then prune old ones; returns its path.

        `metrics` (the step's metrics so far) are saved with the trainer state: a run killed
        after the save but before the step's log line is re-logged on resume."""
        t = self.trainer
        tr = t.cfg.trainer
        root = tr.default_local_dir
        if getattr(t, "tracking", None) is not None:
            t.tracking.sync()  # every earlier step's line is durable before this checkpoint exists

        def write(tmp: str) -> None:
            t.actor_rollout_wg.save_checkpoint(os.path.join(tmp, "actor"), None, t.global_steps, max_ckpt_to_keep=None)
            if t.use_critic:
                t.critic_wg.save_checkpoint(os.path.join(tmp, "critic"), None, t.global_steps, max_ckpt_to_keep=None)
            save_plain(t.train_dataloader.state_dict(), os.path.join(tmp, "data.pt"), "dataloader state")
            write_run_record(t, os.path.join(tmp, RUN_RECORD_FILE))
            state = t.state_dict()
            state["step_metrics"] = {k: to_jsonable(v) for k, v in (metrics or {}).items()}
            save_plain(state, os.path.join(tmp, TRAINER_STATE_FILE), "trainer state")

        self.finish_pending()
        tmp = stage_checkpoint(root, t.global_steps, write)
        self.saved_step = t.global_steps
        self.pending = (t.global_steps, tmp)
        if self.async_save:
            return step_dir(root, t.global_steps)  # published by finish_pending()
        return self.finish_pending()

    def finish_pending(self) -> str | None:
        """Wait for the workers' asynchronous writes of the staged checkpoint, then publish it and
        prune old ones; returns its path (None when nothing is pending)."""
        if self.pending is None:
            return None
        (step, tmp), self.pending = self.pending, None
        t = self.trainer
        tr = t.cfg.trainer
        if self.async_save:
            try:
                t.actor_rollout_wg.finalize_checkpoint()
                if t.use_critic:
                    t.critic_wg.finalize_checkpoint()
            except BaseException as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                if isinstance(exc, Exception):
                    raise _save_error(exc, tr.default_local_dir, step) from exc
                raise
        path = publish_checkpoint(tr.default_local_dir, step, tmp)
        prune_checkpoints(tr.default_local_dir, tr.max_actor_ckpt_to_keep, tr.max_critic_ckpt_to_keep, newest_step=step)
        return path

    def load(self) -> int:
        """Resume per `trainer.resume_mode`; returns the restored step (0 = fresh start).

        The checkpoint is verified against its manifest first. `auto` falls back to the previous
        complete checkpoint (with a warning) when the newest is damaged; `resume_path` fails naming
        the damaged file."""
        t = self.trainer
        root = t.cfg.trainer.default_local_dir
        remove_stale_tmp_dirs(root)
        t._resumed_step_metrics = None
        path = self._path_to_resume()
        if path is None:
            return 0
        logger.info("resuming from %s", path)
        upstream = upstream_step_dir(path) if not os.path.isfile(os.path.join(path, TRAINER_STATE_FILE)) else None
        if upstream is not None:
            return self._load_upstream(upstream)
        t.actor_rollout_wg.load_checkpoint(os.path.join(path, "actor"), None, del_local_after_load=False)
        if t.use_critic:
            critic_path = os.path.join(path, "critic")
            if not os.path.isdir(critic_path):
                raise FileNotFoundError(f"checkpoint {path} has no critic/ part but this run trains a critic")
            t.critic_wg.load_checkpoint(critic_path, None, del_local_after_load=False)
        t.train_dataloader.load_state_dict(load_plain(os.path.join(path, "data.pt")))
        t.load_state_dict(load_plain(os.path.join(path, TRAINER_STATE_FILE)))
        return t.global_steps

    def _path_to_resume(self) -> str | None:
        tr = self.trainer.cfg.trainer
        if tr.resume_mode == "disable":
            return None
        if tr.resume_mode == "resume_path":
            path = tr.resume_from_path
            if not os.path.isfile(os.path.join(path, TRAINER_STATE_FILE)) and upstream_step_dir(path) is not None:
                return path
            if not os.path.isfile(os.path.join(path, TRAINER_STATE_FILE)):
                raise FileNotFoundError(
                    f"trainer.resume_from_path={path!r} is not a complete checkpoint (no {TRAINER_STATE_FILE})"
                )
            step_of(path)
            verify_checkpoint(path)
            return path
        return checkpoint_to_resume(tr.default_local_dir)

    def _load_upstream(self, path: str) -> int:
        """Continue from a checkpoint written by upstream verl's FSDP trainer: the workers load its
        weights, optimizer moments and LR schedule (any world size); the step comes from the
        directory name and the data position from its `data.pt` when that loads safely. The driver's
        RNG, the KL controller and callback states start anew (upstream does not save them)."""
        t = self.trainer
        t.actor_rollout_wg.load_checkpoint(os.path.join(path, "actor"), None, del_local_after_load=False)
        if t.use_critic:
            critic = os.path.join(path, "critic")
            if not os.path.isdir(critic):
                raise FileNotFoundError(f"upstream checkpoint {path} has no critic/ part but this run trains a critic")
            t.critic_wg.load_checkpoint(critic, None, del_local_after_load=False)
        data = os.path.join(path, "data.pt")
        try:
            t.train_dataloader.load_state_dict(load_plain(data))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("resume: the data position of %s is not restored (%s); the epoch starts over", path, exc)
        t.global_steps = step_of(path)
        logger.warning("resumed from the upstream verl checkpoint %s at step %d", path, t.global_steps)
        return t.global_steps

    def relog_saved_step(self) -> None:
        """After a resume: log the checkpointed step's metrics if the metrics file lacks them (the
        previous run was killed between its save and its log line)."""
        t = self.trainer
        saved = getattr(t, "_resumed_step_metrics", None)
        if saved and t.global_steps > 0 and t.tracking.has_logged_step(t.global_steps) is False:
            logger.warning(
                "resume: the metrics of step %d were not in the log; logged now from the checkpoint", t.global_steps
            )
            t.tracking.log(saved, step=t.global_steps)
