"""Sharded model and optimizer state with torch.distributed.checkpoint (DCP).

Each rank writes only its own part of the (FSDP2-sharded) weights and optimizer moments into one
file, `<dir>/__<rank>_0.distcp`; rank 0 adds `<dir>/.metadata`, which records the global shape of
every tensor and which byte range of which file holds each chunk. So no rank ever holds the full
state, and a checkpoint written by W ranks loads on W' ranks: each reader asks for the chunks that
overlap its own shard (`load_sharded`).

Keys inside the checkpoint: `model.<fqn>` (the model's state-dict names), `optim.state.<fqn>.<moment>`
and `optim.param_groups.<i>.<field>` (`get_optimizer_state_dict`, keyed by parameter name).

Safety: DCP reads its metadata with `pickle` and its non-tensor entries with
`torch.load(weights_only=False)`. Here the metadata is read by an unpickler that admits only DCP's
own metadata classes, dtypes and `torch.Size` (`SafeFileSystemReader`), and non-tensor entries with
`weights_only=True` (`SafeLoadPlanner`): loading a checkpoint from elsewhere cannot run code.

`iter_full_tensors` reads one full tensor at a time (any world size, no process group), which is
how the Hugging Face export (`write_safetensors_streaming`) and `verl.model_merger` stay within
the memory of one tensor.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import struct
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from verl.utils.checkpoint.integrity import CheckpointCorruptError

__all__ = [
    "METADATA_FILE",
    "SafeFileSystemReader",
    "SafeLoadPlanner",
    "is_dcp_dir",
    "iter_full_tensors",
    "load_sharded",
    "read_metadata",
    "save_sharded",
    "shard_files",
    "tensor_keys",
    "write_safetensors_streaming",
]

METADATA_FILE = ".metadata"

# (module, name) the DCP metadata file may reference; anything else is refused
_METADATA_MODULES = ("torch.distributed.checkpoint.metadata",)
_METADATA_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "Path"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, fh, path: str):
        super().__init__(fh)
        self.path = path

    def find_class(self, module: str, name: str):
        if module in _METADATA_MODULES or (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointCorruptError(
            f"checkpoint metadata {self.path} references {module}.{name}, which is not part of a DCP checkpoint's "
            "metadata; refused: loading it could run code",
            self.path,
        )


def read_metadata(directory: str) -> Metadata:
    """The DCP metadata of `directory`, read without running code from it."""
    path = os.path.join(directory, METADATA_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint shards {directory} have no {METADATA_FILE} (not a complete DCP save)")
    try:
        with open(path, "rb") as fh:
            metadata = _MetadataUnpickler(fh, path).load()
    except CheckpointCorruptError:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised naming the file
        raise CheckpointCorruptError(
            f"checkpoint metadata {path} cannot be read, it is damaged ({type(exc).__name__}: {exc})", path
        ) from exc
    if not isinstance(metadata, Metadata):
        raise CheckpointCorruptError(f"checkpoint metadata {path} holds a {type(metadata).__name__}", path)
    return metadata


class SafeFileSystemReader(dcp.FileSystemReader):
    """`FileSystemReader` whose metadata is read by `read_metadata` (no arbitrary unpickling)."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        metadata = read_metadata(str(self.path))
        if getattr(metadata, "storage_meta", None) is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """`DefaultLoadPlanner` that reads non-tensor entries (optimizer hyper-parameters) with
    `torch.load(weights_only=True)`."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._nested_dict import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def is_dcp_dir(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, METADATA_FILE))


def shard_files(directory: str) -> list[str]:
    """Names of the data files of a DCP directory (one per writing rank), sorted."""
    return sorted(n for n in os.listdir(directory) if n.endswith(".distcp"))


def _no_dist(process_group=None) -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _quiet():
    """DCP warns on every single-process call that it assumes one process: that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_sharded(state: dict[str, Any], directory: str, process_group=None, async_save: bool = False):
    """Write `state` (sharded DTensors or plain tensors, plus plain values) into `directory`.

    Collective over `process_group` (every rank writes its own file). `async_save=True` copies the
    state to host memory, then writes in a background thread and returns a future at once; the
    caller must keep the process group free for DCP (use a dedicated group) and wait on the future
    before publishing the directory."""
    writer = dcp.FileSystemWriter(directory, single_file_per_rank=True, sync_files=True)
    no_dist = _no_dist(process_group)
    with _quiet():
        if async_save:
            return dcp.async_save(state, storage_writer=writer, process_group=process_group, no_dist=no_dist)
        dcp.save(state, storage_writer=writer, process_group=process_group, no_dist=no_dist)
    return None


def load_sharded(state: dict[str, Any], directory: str, process_group=None) -> None:
    """Fill `state` in place from `directory`; each rank reads the chunks overlapping its shards,
    whatever the world size that wrote them. Keys of `state` missing from the checkpoint raise,
    naming them."""
    metadata = read_metadata(directory)
    wanted = _flat_keys(state)
    missing = sorted(k for k in wanted if k not in metadata.state_dict_metadata)
    if missing:
        raise KeyError(f"checkpoint shards {directory} lack {len(missing)} entries this model needs: {missing[:8]}")
    with _quiet():
        dcp.load(
            state,
            storage_reader=SafeFileSystemReader(directory),
            planner=SafeLoadPlanner(),
            process_group=process_group,
            no_dist=_no_dist(process_group),
        )


def _flat_keys(state: dict[str, Any]) -> list[str]:
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, _ = flatten_state_dict(state)
    return list(flat)


def tensor_keys(directory: str, prefix: str = "") -> dict[str, TensorStorageMetadata]:
    """Tensor entries of the checkpoint whose key starts with `prefix` (metadata only, no data)."""
    metadata = read_metadata(directory)
    return {
        k: v
        for k, v in metadata.state_dict_metadata.items()
        if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)
    }


def iter_full_tensors(
    directory: str, prefix: str = "model.", only: set[str] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name without `prefix`, full tensor) for every tensor under `prefix` (and in `only`, when
    given), one at a time, in sorted order. Runs in one process without a process group, whatever
    world size wrote the shards."""
    reader = SafeFileSystemReader(directory)
    for key, meta in sorted(tensor_keys(directory, prefix).items()):
        if only is not None and key[len(prefix) :] not in only:
            continue
        buf = {key: torch.empty(meta.size, dtype=meta.properties.dtype)}
        with _quiet():
            dcp.load(buf, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
        yield key[len(prefix) :], buf.pop(key)


_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def write_safetensors_streaming(
    path: str,
    specs: dict[str, tuple[tuple[int, ...], torch.dtype]],
    tensors: Iterator[tuple[str, torch.Tensor]],
    dtype: torch.dtype | None = None,
) -> None:
    """Write a `.safetensors` file tensor by tensor: the header is laid out from `specs`
    ({name: (shape, dtype)}, the order of `tensors`), then each tensor's bytes are appended as
    it arrives, so memory holds one tensor. `dtype` casts floating tensors (None: keep)."""

    def out_dtype(d: torch.dtype) -> torch.dtype:
        return dtype if (dtype is not None and d.is_floating_point) else d

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, d) in specs.items():
        d = out_dtype(d)
        if d not in _SAFETENSORS_DTYPES:
            raise TypeError(f"tensor {name} has dtype {d}, which safetensors cannot store")
        nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=d).element_size()
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[d],
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        for (name, (shape, d)), (got_name, tensor) in zip(specs.items(), tensors, strict=True):
            if got_name != name or tuple(tensor.shape) != tuple(shape):
                raise RuntimeError(f"streamed tensor {got_name} {tuple(tensor.shape)} where {name} {shape} was planned")
            t = tensor.detach().to("cpu", out_dtype(d)).contiguous()
            fh.write(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        fh.flush()
        os.fsync(fh.fileno())
