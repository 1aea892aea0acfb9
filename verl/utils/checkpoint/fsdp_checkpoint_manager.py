"""Checkpoints of an FSDP2 (or single-process) model, its optimizer, scheduler and RNG.

Directory written by `FSDPCheckpointManager.save_checkpoint(local_path, ...)`:

    local_path/
      dcp/                              model weights and optimizer moments as DCP shards:
        __<r>_0.distcp                  what rank r holds (one file per rank, written in parallel)
        .metadata                       global shapes and where each chunk lies (rank 0)
      huggingface/                      config.json, generation_config.json, tokenizer files; with
        model.safetensors               `hf_model` in save_contents, the full weights too
      extra_state_world_size_<W>_rank_<r>.pt   lr scheduler state and every RNG state of rank r
      checkpoint_meta.json              format, global_step, world_size, contents
      manifest.json                     size and SHA-256 of every file above (written last)

No rank ever holds the full state: each writes its own shards (`verl.utils.checkpoint.dcp_shards`),
and the `hf_model` export is streamed by rank 0 out of the shards one tensor at a time. A
checkpoint written by W ranks resumes on W' ranks (each reads the chunks overlapping its shards);
the RNG streams resume exactly when the world size is the same (otherwise they are left as they
are and a warning says so). Without `hf_model`, `python -m verl.model_merger merge --backend fsdp
--local_dir <local_path> --target_dir <dir>` writes the Hugging Face model.

`checkpoint.async_save=True`: the shards are copied to host memory and written by a background
thread while training continues; the checkpoint is published by the next `save_checkpoint`,
`load_checkpoint` or `finalize_save()` (the trainer calls it before the next save and at the end
of the run). Until then it stays under `<local_path>.incomplete`, so a crash never leaves a
partial checkpoint in place.

LoRA (a peft model): `model` writes `lora_adapter/` (peft format: `adapter_config.json` with the
rank and alpha, `adapter_model.safetensors` with the adapter weights, plus the tokenizer), which is
what resume loads (the frozen base comes from `model.path` again), and `huggingface/` holds the
merged weights W + delta_W under the plain names, a model that loads without peft.
`checkpoint.save_lora_only=True` leaves the merged export out unless `hf_model` is listed. The
optimizer is sharded as above.

Checkpoints of the earlier layout (`huggingface/model.safetensors` + `optim.pt`, full state) still
load. The `.pt` files hold only tensors and plain containers and are read with
`torch.load(weights_only=True)`, the DCP metadata by an unpickler that admits only its own classes;
the ranks verify the files they read against the manifest first (the shard files split between
them), so a damaged file is named instead of failing in a decoder (see
`verl.utils.checkpoint.integrity`).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import shutil
import warnings
from typing import Any

import torch
import torch.distributed as dist

from verl.utils.checkpoint import dcp_shards, upstream_fsdp
from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager, _barrier
from verl.utils.checkpoint.hf_export import export_hf_weights_from_shards, save_hf_metadata
from verl.utils.checkpoint.integrity import (
    MANIFEST_FILE,
    CheckpointCorruptError,
    disk_full_cause,
    load_plain,
    rng_state_from_plain,
    rng_state_to_plain,
    save_plain,
    verify_manifest,
)
from verl.utils.fsdp_utils import (
    get_full_state_dict,
    get_lora_merged_state_dict,
    load_full_optimizer_state_dict,
    load_full_state_dict,
)

__all__ = ["FSDPCheckpointManager", "save_lora_adapter", "load_lora_adapter"]

logger = logging.getLogger(__name__)

HF_DIR = "huggingface"
LORA_DIR = "lora_adapter"
SHARDS_DIR = "dcp"
OPTIM_FILE = "optim.pt"  # earlier layout: the full optimizer state
META_FILE = "checkpoint_meta.json"
FORMAT = "dcp"


def _extra_file(world_size: int, rank: int) -> str:
    return f"extra_state_world_size_{world_size}_rank_{rank}.pt"


def _save_hf_weights(state_dict: dict[str, torch.Tensor], out_dir: str) -> None:
    """Write a full `state_dict` as `out_dir/model.safetensors` (the LoRA merged export)."""
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    # safetensors refuses tensors that share storage (tied embeddings): give each key its own copy
    seen: set[int] = set()
    tensors = {}
    for key, value in state_dict.items():
        value = value.detach().cpu().contiguous()
        ptr = value.untyped_storage().data_ptr()
        if ptr in seen:
            value = value.clone()
        seen.add(value.untyped_storage().data_ptr())
        tensors[key] = value
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})


def _load_hf_weights(in_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    path = os.path.join(in_dir, "model.safetensors")
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint weights {path} are missing")
    try:
        return load_file(path)
    except Exception as exc:  # noqa: BLE001 - safetensors' decoder errors do not name the file
        raise CheckpointCorruptError(
            f"checkpoint weights {path} cannot be read ({type(exc).__name__}: {exc})", path
        ) from exc


def _is_peft(model) -> bool:
    from verl.utils.model import is_peft_model

    return is_peft_model(model)


def _adapter_key_map(model) -> dict[str, str]:
    """peft adapter-file key -> key in `model.state_dict()`, as peft's own
    `get_peft_model_state_dict` names them (adapter name dropped, `modules_to_save` copies under
    the plain module name). Computed on placeholder values, so no weight is gathered."""
    from peft import get_peft_model_state_dict

    keys = list(model.state_dict().keys())
    index = {k: torch.tensor(i) for i, k in enumerate(keys)}
    picked = get_peft_model_state_dict(model, state_dict=index)
    return {file_key: keys[int(t)] for file_key, t in picked.items()}


def save_lora_adapter(model, state_dict: dict[str, torch.Tensor], out_dir: str, processing_class=None) -> None:
    """Write the adapter in peft's format (what `PeftModel.from_pretrained(base, out_dir)` reads)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    model.peft_config["default"].save_pretrained(out_dir)
    adapter = get_peft_model_state_dict(model, state_dict=state_dict)
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in adapter.items()},
        os.path.join(out_dir, "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )
    if processing_class is not None:
        processing_class.save_pretrained(out_dir)


def load_lora_adapter(model, in_dir: str) -> None:
    """Load `in_dir/adapter_model.safetensors` into the adapter of `model` (every rank passes
    the full tensors; FSDP2 keeps its shards). Every adapter weight must be in the file."""
    from safetensors.torch import load_file

    path = os.path.join(in_dir, "adapter_model.safetensors")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"LoRA checkpoint weights {path} are missing: this model trains a LoRA adapter and resumes from the "
            f"{LORA_DIR}/ folder of a checkpoint (a full fine-tuning checkpoint cannot be resumed with lora_rank > 0)"
        )
    saved = load_file(path)
    key_map = _adapter_key_map(model)
    missing = sorted(set(key_map) - set(saved))
    unexpected = sorted(set(saved) - set(key_map))
    if missing or unexpected:
        raise RuntimeError(
            f"LoRA adapter {path} does not match the model's adapter: missing {missing[:10]}, "
            f"unexpected {unexpected[:10]}"
        )
    load_full_state_dict(model, {key_map[k]: v for k, v in saved.items()}, strict=False)


@dataclasses.dataclass
class _PendingSave:
    """A checkpoint written into `staging` that is not published at `local_path` yet."""

    staging: str
    local_path: str
    global_step: int
    max_ckpt_to_keep: int | None
    hdfs_path: str | None
    future: Any = None  # DCP's future while an asynchronous save is being written
    export_hf: bool = False  # rank 0 streams huggingface/model.safetensors out of the shards


class FSDPCheckpointManager(BaseCheckpointManager):
    """Save/load a model sharded with FSDP2 (or a plain module) with optimizer, scheduler, RNG.

    Every rank of the process group must call `save_checkpoint` / `load_checkpoint` /
    `finalize_save` (they are collective). See the module docstring for the layout.
    """

    def __init__(
        self,
        model,
        optimizer=None,
        lr_scheduler=None,
        processing_class=None,
        checkpoint_config=None,
        process_group=None,
    ):
        super().__init__(
            model,
            optimizer,
            lr_scheduler,
            processing_class=processing_class,
            checkpoint_config=checkpoint_config,
            process_group=process_group,
        )
        cfg = dict(checkpoint_config or {})
        # LoRA: write only the adapter, no merged export (upstream's checkpoint.save_lora_only)
        self.save_lora_only = self.should_save_lora_only
        self.async_save = bool(cfg.get("async_save", False))
        self._pending: _PendingSave | None = None
        self._dcp_group = process_group
        if self.async_save and self.world_size > 1:
            # the background writer's collectives get a group of their own, so they never interleave
            # with the training step's collectives on the default group
            ranks = dist.get_process_group_ranks(process_group) if process_group is not None else None
            self._dcp_group = dist.new_group(ranks=ranks, backend="gloo")

    # -- save ----------------------------------------------------------------------------------

    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ):
        """Write the checkpoint of `global_step` at `local_path`; returns the path. With
        `async_save` it is published later (see `finalize_save`)."""
        if local_path is None:
            raise ValueError("save_checkpoint: local_path is None")
        if hdfs_path is not None and "://" in hdfs_path:
            # checked on every rank before any collective: raising on rank 0 alone would leave the
            # other ranks waiting in a barrier
            raise NotImplementedError(
                f"hdfs_path={hdfs_path!r}: only local / mounted file-system paths are supported for the "
                "checkpoint copy; mount the remote store or set trainer.default_hdfs_dir to null"
            )
        self.finalize_save()
        local_path = os.path.abspath(local_path)
        staging = self._begin_atomic(local_path)
        pending = _PendingSave(staging, local_path, int(global_step), max_ckpt_to_keep, hdfs_path)
        try:
            self._write_parts(pending)
        except Exception as exc:  # noqa: BLE001 - re-raised naming the directory, the step and the cause
            self._fail(pending, exc)
        if self.async_save:
            self._pending = pending
            return local_path
        return self._publish(pending)

    def finalize_save(self) -> str | None:
        """Wait for the asynchronous save still being written, if any, and publish it (manifest,
        atomic rename, retention, copy). Returns its path, or None when nothing was pending."""
        pending, self._pending = self._pending, None
        return None if pending is None else self._publish(pending)

    def _fail(self, pending: _PendingSave, exc: Exception) -> None:
        """Remove the staging directory (the previous copy is untouched) and raise, naming a full disk."""
        if self.rank == 0:
            shutil.rmtree(pending.staging, ignore_errors=True)  # give the space back
        cause = disk_full_cause(exc, pending.staging)
        if cause:
            raise OSError(
                errno.ENOSPC,
                f"saving the checkpoint of step {pending.global_step} into {pending.local_path} failed on "
                f"rank {self.rank}: {cause}",
            ) from exc
        raise exc

    def _publish(self, pending: _PendingSave) -> str:
        try:
            if pending.future is not None:
                pending.future.result()  # the background write: raises what it raised
            error = None
            if pending.export_hf and self.rank == 0:
                try:
                    export_hf_weights_from_shards(
                        os.path.join(pending.staging, SHARDS_DIR), os.path.join(pending.staging, HF_DIR)
                    )
                except Exception as exc:  # noqa: BLE001 - every rank raises below, not only rank 0
                    error = exc
            self._raise_if_any_failed(error, "writing huggingface/ from the shards")
        except Exception as exc:  # noqa: BLE001 - re-raised naming the directory, the step and the cause
            self._fail(pending, exc)
        self._commit_atomic(pending.staging, pending.local_path)
        self._apply_retention(pending.local_path, pending.max_ckpt_to_keep)
        self.previous_global_step = pending.global_step
        if pending.hdfs_path is not None:
            self._copy_to_remote(pending.local_path, pending.hdfs_path)
        _barrier(self.process_group)
        return pending.local_path

    def _raise_if_any_failed(self, error: Exception | None, what: str) -> None:
        """Raise on every rank when `error` happened on any (no rank is left in a collective)."""
        ok = error is None
        if self.world_size > 1:
            from verl.utils.fsdp_utils import all_reduce_scalar

            ok = bool(all_reduce_scalar(int(ok), dist.ReduceOp.MIN, self.process_group, dtype=torch.int64))
        if error is not None:
            raise error
        if not ok:
            raise RuntimeError(f"{what} failed on another rank (see its error)")

    def _write_parts(self, pending: _PendingSave) -> None:
        """Every rank: its shards (started asynchronously with `async_save`) and its extra state;
        rank 0: the Hugging Face config and tokenizer, the LoRA adapter, the meta file."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        staging, contents = pending.staging, set(self.save_contents)
        lora = _is_peft(self.model)
        if self.rank == 0:
            base = self.model.get_base_model() if lora else self.model
            save_hf_metadata(base, os.path.join(staging, HF_DIR), self.processing_class)
        if lora and contents & {"model", "hf_model"}:
            self._write_lora(staging, contents)
        state: dict[str, Any] = {}
        if not lora and contents & {"model", "hf_model"}:
            state["model"] = get_model_state_dict(self.model)  # this rank's shards (DTensors under FSDP2)
            pending.export_hf = "hf_model" in contents
        if "optimizer" in contents and self.optimizer is not None:
            state["optim"] = get_optimizer_state_dict(self.model, self.optimizer)
        if state:
            pending.future = dcp_shards.save_sharded(
                state, os.path.join(staging, SHARDS_DIR), self._dcp_group, async_save=self.async_save
            )
        if "extra" in contents:
            extra = {
                "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
                "rng": rng_state_to_plain(self.get_rng_state()),
            }
            save_plain(extra, os.path.join(staging, _extra_file(self.world_size, self.rank)), "extra state")
        if self.rank == 0:
            meta = {
                "format": FORMAT,
                "global_step": pending.global_step,
                "world_size": self.world_size,
                "contents": sorted(contents | ({"model"} if "model" in state else set())),
                "shards": sorted(state),
            }
            if lora:
                meta["lora"] = {"adapter_dir": LORA_DIR, "save_lora_only": self.save_lora_only}
            with open(os.path.join(staging, META_FILE), "w") as f:
                json.dump(meta, f, indent=2)

    def _write_lora(self, staging: str, contents: set[str]) -> None:
        if "model" in contents:
            state_dict = get_full_state_dict(self.model)  # collective
            if self.rank == 0:
                save_lora_adapter(self.model, state_dict, os.path.join(staging, LORA_DIR), self.processing_class)
            del state_dict
        if "hf_model" in contents or not self.save_lora_only:
            merged = get_lora_merged_state_dict(self.model)  # collective
            if self.rank == 0:
                _save_hf_weights(merged, os.path.join(staging, HF_DIR))
            del merged

    def _copy_to_remote(self, local_path: str, remote_path: str) -> None:
        """Rank 0 copies the checkpoint; a failure is raised on every rank (no rank is left
        waiting in a collective)."""
        error = None
        if self.rank == 0:
            try:
                if os.path.exists(remote_path):
                    shutil.rmtree(remote_path)
                shutil.copytree(local_path, remote_path)
            except OSError as exc:
                error = exc
        try:
            self._raise_if_any_failed(error, "copying the checkpoint")
        except Exception as exc:  # noqa: BLE001 - re-raised with both paths
            raise RuntimeError(f"copying checkpoint {local_path} to {remote_path} failed on rank 0: {error}") from exc

    # -- load ----------------------------------------------------------------------------------

    def load_checkpoint(self, local_path: str | None, hdfs_path: str | None = None, del_local_after_load: bool = False):
        """Restore what `load_contents` names from `local_path` (or a copy of `hdfs_path`).

        Returns the checkpoint's metadata dict (format, global_step, world_size, contents), or None
        when `local_path` is None (nothing to resume). Shards written by another world size are
        resharded; the RNG streams are restored only when the world size is the same.
        """
        self.finalize_save()
        if local_path is None and hdfs_path is None:
            return None
        local_path = os.path.abspath(local_path if local_path is not None else hdfs_path)
        if upstream_fsdp.is_upstream_fsdp_dir(local_path):
            return self._load_upstream(local_path)
        meta = self._read_meta(local_path)
        contents = self._contents_to_load(meta, local_path)
        same_world = meta.get("world_size") == self.world_size
        rank_file = _extra_file(meta["world_size"], self.rank if same_world else 0)
        self._verify_reads(local_path, meta, contents, rank_file)
        if contents & {"model", "hf_model"} and _is_peft(self.model):
            # the base is frozen and was built from model.path; only the adapter is restored
            load_lora_adapter(self.model, os.path.join(local_path, LORA_DIR))
        if meta.get("format") == FORMAT:
            self._load_shards(local_path, meta, contents)
        else:
            self._load_full_state(local_path, contents)
        if "extra" in contents:
            self._load_extra(os.path.join(local_path, rank_file), meta, same_world, local_path)
        _barrier(self.process_group)
        if del_local_after_load and self.rank == 0:
            shutil.rmtree(local_path, ignore_errors=True)
        _barrier(self.process_group)
        self.previous_global_step = meta.get("global_step")
        return meta

    def _read_meta(self, local_path: str) -> dict:
        if os.path.isdir(local_path):
            verify_manifest(local_path, only=[META_FILE])  # a lost or damaged meta file is named as such
        meta_path = os.path.join(local_path, META_FILE)
        if not os.path.exists(meta_path):
            raise FileNotFoundError(
                f"{local_path} is not a checkpoint written by FSDPCheckpointManager (no {META_FILE})"
            )
        with open(meta_path) as f:
            return json.load(f)

    def _contents_to_load(self, meta: dict, local_path: str) -> set[str]:
        contents = set(self.load_contents)
        saved = set(meta.get("contents", []))
        available = saved | ({"model", "hf_model"} if saved & {"model", "hf_model"} else set())
        missing = sorted(contents - available)
        if missing:
            raise ValueError(
                f"checkpoint {local_path} does not contain {missing} (it has {sorted(saved)}); adjust "
                "checkpoint.load_contents"
            )
        return contents

    def _verify_reads(self, local_path: str, meta: dict, contents: set[str], rank_file: str) -> None:
        """Each rank checks its own files; the shard files, which any rank may read from, are
        split between the ranks and a damaged one is named on every rank."""
        reads = [rank_file] if "extra" in contents else []
        lora_weights = os.path.join(LORA_DIR, "adapter_model.safetensors")
        wants_model = bool(contents & {"model", "hf_model"})
        if wants_model and _is_peft(self.model) and os.path.exists(os.path.join(local_path, lora_weights)):
            reads.append(lora_weights)
        elif meta.get("format") != FORMAT:
            reads += [os.path.join(HF_DIR, "model.safetensors")] if wants_model else []
            reads += [OPTIM_FILE] if "optimizer" in contents and self.optimizer is not None else []
        if not verify_manifest(local_path, only=reads) and self.rank == 0:
            logger.warning(
                "checkpoint %s has no %s (written by an older version): its files are not verified",
                local_path,
                MANIFEST_FILE,
            )
        shard_dir = os.path.join(local_path, SHARDS_DIR)
        if meta.get("format") == FORMAT and os.path.isdir(shard_dir):
            names = [dcp_shards.METADATA_FILE] + dcp_shards.shard_files(shard_dir)
            mine = [os.path.join(SHARDS_DIR, n) for n in names[self.rank :: self.world_size]]
            error = None
            try:
                verify_manifest(local_path, only=mine)
            except CheckpointCorruptError as exc:
                error = exc
            self._agree_on_damage(error)

    def _agree_on_damage(self, error: CheckpointCorruptError | None) -> None:
        if self.world_size > 1:
            found: list = [None] * self.world_size
            dist.all_gather_object(found, None if error is None else (str(error), error.path), group=self.process_group)
            first = next((f for f in found if f is not None), None)
            if first is not None and error is None:
                error = CheckpointCorruptError(first[0], first[1])
        if error is not None:
            raise error

    def _load_shards(self, local_path: str, meta: dict, contents: set[str]) -> None:
        """Read this rank's part of the weights and optimizer moments, whatever world size wrote them."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        shards = set(meta.get("shards", []))
        state: dict[str, Any] = {}
        if contents & {"model", "hf_model"} and not _is_peft(self.model):
            state["model"] = get_model_state_dict(self.model)
        if "optimizer" in contents and self.optimizer is not None:
            state["optim"] = get_optimizer_state_dict(self.model, self.optimizer)
        if not state:
            return
        lacking = sorted(set(state) - shards)
        if lacking:
            raise ValueError(f"checkpoint {local_path} holds no {lacking} shards (it has {sorted(shards)})")
        dcp_shards.load_sharded(state, os.path.join(local_path, SHARDS_DIR), self.process_group)
        if "model" in state:
            set_model_state_dict(self.model, state["model"], options=StateDictOptions(strict=True))
        if "optim" in state:
            set_optimizer_state_dict(self.model, self.optimizer, optim_state_dict=state["optim"])

    def _load_full_state(self, local_path: str, contents: set[str]) -> None:
        """The earlier layout: full weights in huggingface/, the full optimizer state in optim.pt."""
        if contents & {"model", "hf_model"} and not _is_peft(self.model):
            state_dict = _load_hf_weights(os.path.join(local_path, HF_DIR))
            load_full_state_dict(self.model, state_dict)
            del state_dict
        if "optimizer" in contents and self.optimizer is not None:
            optim_state = load_plain(os.path.join(local_path, OPTIM_FILE))
            load_full_optimizer_state_dict(self.model, self.optimizer, optim_state)
            del optim_state

    def _load_extra(self, path: str, meta: dict, same_world: bool, local_path: str) -> None:
        extra = load_plain(path)
        if self.lr_scheduler is not None and extra.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        if same_world:
            self.load_rng_state(rng_state_from_plain(extra["rng"]))
        else:
            warnings.warn(
                f"checkpoint {local_path} was written by {meta['world_size']} ranks, this group has "
                f"{self.world_size}: weights, optimizer and schedule are restored (resharded), RNG streams are not",
                stacklevel=3,
            )

    def _load_upstream(self, local_path: str) -> dict:
        """An actor/critic directory written by upstream verl (per-rank DTensor files): its weights,
        optimizer moments and LR schedule, whatever world size wrote them. Every rank assembles
        the full tensors (memory of one full copy per rank while loading); RNG streams are not
        restored (upstream's are numpy objects that weights_only loading refuses)."""
        contents = set(self.load_contents)
        if _is_peft(self.model):
            raise NotImplementedError(
                f"{local_path} is an upstream verl FSDP checkpoint; resuming a LoRA model from one is not supported "
                "here (merge it with python -m verl.model_merger and start from the merged model)"
            )
        if contents & {"model", "hf_model"}:
            load_full_state_dict(self.model, dict(upstream_fsdp.iter_full_model_tensors(local_path)))
        if "optimizer" in contents and self.optimizer is not None:
            names = {id(p): n for n, p in self.model.named_parameters()}
            ordered = [names[id(p)] for g in self.optimizer.param_groups for p in g["params"]]
            optim_state = upstream_fsdp.full_optimizer_state(local_path, ordered)
            load_full_optimizer_state_dict(self.model, self.optimizer, optim_state)
        extra = upstream_fsdp.load_extra_state(local_path) if "extra" in contents else None
        if extra and self.lr_scheduler is not None and extra.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        if self.rank == 0:
            logger.warning(
                "loaded the upstream verl FSDP checkpoint %s (weights, optimizer, LR schedule); RNG streams start anew",
                local_path,
            )
        _barrier(self.process_group)
        parent = os.path.basename(os.path.dirname(local_path))
        step = int(parent[len("global_step_") :]) if parent.startswith("global_step_") and parent[12:].isdigit() else 0
        meta = {
            "format": "upstream-fsdp",
            "global_step": step,
            "world_size": upstream_fsdp.upstream_world_size(local_path),
        }
        self.previous_global_step = step
        return meta
