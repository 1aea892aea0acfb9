"""Checkpoints of an FSDP2 (or single-process) model, its optimizer, scheduler and RNG.

Directory written by `FSDPCheckpointManager.save_checkpoint(local_path, ...)`:

    local_path/
      huggingface/                      full weights as a Hugging Face model directory
        config.json, model.safetensors, generation_config.json?, tokenizer files
      optim.pt                          full optimizer state keyed by parameter name
      extra_state_world_size_<W>_rank_<r>.pt   lr scheduler state and every RNG state of rank r
      checkpoint_meta.json              global_step, world_size, contents
      manifest.json                     size and SHA-256 of every file above (written last)

LoRA (a peft model): `model` writes `lora_adapter/` (peft format: `adapter_config.json` with the
rank and alpha, `adapter_model.safetensors` with the adapter weights, plus the tokenizer), which is
what resume loads (the frozen base comes from `model.path` again), and `huggingface/` holds the
merged weights W + delta_W under the plain names, a model that loads without peft.
`checkpoint.save_lora_only=True` leaves the merged export out unless `hf_model` is listed.

Weights and optimizer state are full (gathered), so a checkpoint resumes on any world size; the
RNG streams resume exactly when the world size is the same (otherwise they are left as they are
and a warning says so). `huggingface/` loads directly with `from_pretrained` (e.g. as
`actor_rollout_ref.model.path` of a new run). The directory appears atomically (written under
`<local_path>.incomplete`, renamed when every rank is done). The `.pt` files hold only tensors
and plain containers and are read with `torch.load(weights_only=True)`; each rank verifies the
files it reads against the manifest first, so a damaged file is named instead of failing in a
decoder (see `verl.utils.checkpoint.integrity`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import warnings

import torch

from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager, _barrier
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
    get_full_optimizer_state_dict,
    get_full_state_dict,
    get_lora_merged_state_dict,
    load_full_optimizer_state_dict,
    load_full_state_dict,
)

__all__ = ["FSDPCheckpointManager", "save_lora_adapter", "load_lora_adapter"]

logger = logging.getLogger(__name__)

HF_DIR = "huggingface"
LORA_DIR = "lora_adapter"
OPTIM_FILE = "optim.pt"
META_FILE = "checkpoint_meta.json"


def _extra_file(world_size: int, rank: int) -> str:
    return f"extra_state_world_size_{world_size}_rank_{rank}.pt"


def _save_hf_weights(model, state_dict: dict[str, torch.Tensor], out_dir: str, processing_class=None) -> None:
    """Write `state_dict` as a Hugging Face model directory (config + safetensors + tokenizer)."""
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    config = getattr(model, "config", None)
    if config is not None:
        config.save_pretrained(out_dir)
    gen_config = getattr(model, "generation_config", None)
    if gen_config is not None:
        try:
            gen_config.save_pretrained(out_dir)
        except Exception as exc:  # noqa: BLE001 - an unusual generation config must not lose the weights
            logger.warning("generation config not saved: %s", exc)
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
    if processing_class is not None:
        processing_class.save_pretrained(out_dir)


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


class FSDPCheckpointManager(BaseCheckpointManager):
    """Save/load a model sharded with FSDP2 (or a plain module) with optimizer, scheduler, RNG.

    Every rank of the process group must call `save_checkpoint` / `load_checkpoint` (they are
    collective). See the module docstring for the layout.
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
        # LoRA: write only the adapter, no merged export (upstream's checkpoint.save_lora_only)
        self.save_lora_only = self.should_save_lora_only

    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ):
        if local_path is None:
            raise ValueError("save_checkpoint: local_path is None")
        if hdfs_path is not None and "://" in hdfs_path:
            # checked on every rank before any collective: raising on rank 0 alone would leave the
            # other ranks waiting in a barrier
            raise NotImplementedError(
                f"hdfs_path={hdfs_path!r}: only local / mounted file-system paths are supported for the "
                "checkpoint copy; mount the remote store or set trainer.default_hdfs_dir to null"
            )
        local_path = os.path.abspath(local_path)
        staging = self._begin_atomic(local_path)
        try:
            self._write_parts(staging, global_step)
        except Exception as exc:  # noqa: BLE001 - re-raised naming the directory, the step and the cause
            if self.rank == 0:
                shutil.rmtree(staging, ignore_errors=True)  # give the space back; the previous copy is untouched
            cause = disk_full_cause(exc, staging)
            if cause:
                raise OSError(
                    errno.ENOSPC,
                    f"saving the checkpoint of step {global_step} into {local_path} failed on "
                    f"rank {self.rank}: {cause}",
                ) from exc
            raise
        self._commit_atomic(staging, local_path)
        self._apply_retention(local_path, max_ckpt_to_keep)
        self.previous_global_step = int(global_step)
        if hdfs_path is not None:
            self._copy_to_remote(local_path, hdfs_path)
        _barrier(self.process_group)
        return local_path

    def _write_parts(self, staging: str, global_step: int) -> None:
        contents = set(self.save_contents)
        lora = _is_peft(self.model)
        if lora and contents & {"model", "hf_model"}:
            if "model" in contents:
                state_dict = get_full_state_dict(self.model)  # collective
                if self.rank == 0:
                    save_lora_adapter(self.model, state_dict, os.path.join(staging, LORA_DIR), self.processing_class)
                del state_dict
            if "hf_model" in contents or not self.save_lora_only:
                merged = get_lora_merged_state_dict(self.model)  # collective
                if self.rank == 0:
                    _save_hf_weights(
                        self.model.get_base_model(), merged, os.path.join(staging, HF_DIR), self.processing_class
                    )
                del merged
        elif contents & {"model", "hf_model"}:
            state_dict = get_full_state_dict(self.model)  # collective
            if self.rank == 0:
                _save_hf_weights(self.model, state_dict, os.path.join(staging, HF_DIR), self.processing_class)
            del state_dict
        if "optimizer" in contents and self.optimizer is not None:
            optim_state = get_full_optimizer_state_dict(self.model, self.optimizer)  # collective
            if self.rank == 0:
                save_plain(optim_state, os.path.join(staging, OPTIM_FILE), "optimizer state")
            del optim_state
        if "extra" in contents:
            extra = {
                "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
                "rng": rng_state_to_plain(self.get_rng_state()),
            }
            save_plain(extra, os.path.join(staging, _extra_file(self.world_size, self.rank)), "extra state")
        if self.rank == 0:
            meta = {"global_step": int(global_step), "world_size": self.world_size, "contents": sorted(contents)}
            if lora:
                meta["lora"] = {"adapter_dir": LORA_DIR, "save_lora_only": self.save_lora_only}
            with open(os.path.join(staging, META_FILE), "w") as f:
                json.dump(meta, f, indent=2)

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
        if self.world_size > 1:
            import torch.distributed as dist

            from verl.utils.fsdp_utils import all_reduce_scalar

            ok = all_reduce_scalar(int(error is None), dist.ReduceOp.MIN, self.process_group, dtype=torch.int64)
        else:
            ok = error is None
        if not ok:
            raise RuntimeError(f"copying checkpoint {local_path} to {remote_path} failed on rank 0: {error}") from error

    def load_checkpoint(self, local_path: str | None, hdfs_path: str | None = None, del_local_after_load: bool = False):
        """Restore what `load_contents` names from `local_path` (or a copy of `hdfs_path`).

        Returns the checkpoint's metadata dict (global_step, world_size, contents), or None when
        `local_path` is None (nothing to resume).
        """
        if local_path is None and hdfs_path is None:
            return None
        if local_path is None:
            local_path = hdfs_path
        local_path = os.path.abspath(local_path)
        meta_path = os.path.join(local_path, META_FILE)
        if os.path.isdir(local_path):
            verify_manifest(local_path, only=[META_FILE])  # a lost or damaged meta file is named as such
        if not os.path.exists(meta_path):
            raise FileNotFoundError(
                f"{local_path} is not a checkpoint written by FSDPCheckpointManager (no {META_FILE})"
            )
        with open(meta_path) as f:
            meta = json.load(f)
        contents = set(self.load_contents)
        saved = set(meta.get("contents", []))
        available = saved | ({"model", "hf_model"} if saved & {"model", "hf_model"} else set())
        missing = sorted(contents - available)
        if missing:
            raise ValueError(
                f"checkpoint {local_path} does not contain {missing} (it has {sorted(saved)}); adjust "
                "checkpoint.load_contents"
            )

        same_world = meta.get("world_size") == self.world_size
        rank_file = _extra_file(meta["world_size"], self.rank if same_world else 0)
        reads = []
        if contents & {"model", "hf_model"}:
            lora_weights = os.path.join(LORA_DIR, "adapter_model.safetensors")
            lora_saved = os.path.exists(os.path.join(local_path, lora_weights))
            reads.append(
                lora_weights if _is_peft(self.model) and lora_saved else os.path.join(HF_DIR, "model.safetensors")
            )
        if "optimizer" in contents and self.optimizer is not None:
            reads.append(OPTIM_FILE)
        if "extra" in contents:
            reads.append(rank_file)
        if not verify_manifest(local_path, only=reads) and self.rank == 0:
            logger.warning(
                "checkpoint %s has no %s (written by an older version): its files are not verified",
                local_path,
                MANIFEST_FILE,
            )

        if contents & {"model", "hf_model"} and _is_peft(self.model):
            # the base is frozen and was built from model.path; only the adapter is restored
            load_lora_adapter(self.model, os.path.join(local_path, LORA_DIR))
        elif contents & {"model", "hf_model"}:
            state_dict = _load_hf_weights(os.path.join(local_path, HF_DIR))
            load_full_state_dict(self.model, state_dict)
            del state_dict
        if "optimizer" in contents and self.optimizer is not None:
            optim_state = load_plain(os.path.join(local_path, OPTIM_FILE))
            load_full_optimizer_state_dict(self.model, self.optimizer, optim_state)
            del optim_state
        if "extra" in contents:
            extra = load_plain(os.path.join(local_path, rank_file))
            if self.lr_scheduler is not None and extra.get("lr_scheduler") is not None:
                self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
            if same_world:
                self.load_rng_state(rng_state_from_plain(extra["rng"]))
            else:
                warnings.warn(
                    f"checkpoint {local_path} was written by {meta['world_size']} ranks, this group has "
                    f"{self.world_size}: weights, optimizer and schedule are restored, RNG streams are not",
                    stacklevel=2,
                )
        _barrier(self.process_group)
        if del_local_after_load and self.rank == 0:
            shutil.rmtree(local_path, ignore_errors=True)
        _barrier(self.process_group)
        self.previous_global_step = meta.get("global_step")
        return meta
