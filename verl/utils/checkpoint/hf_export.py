"""Hugging Face model directories written from checkpoints: config, generation config and
tokenizer (`save_hf_metadata`), and the weights streamed out of DCP shards one tensor at a time
(`export_hf_weights_from_shards`), which is what both the trainer's `hf_model` export and
`python -m verl.model_merger` use. Memory stays within one full tensor whatever the model size."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterator

import torch

from verl.utils.checkpoint.dcp_shards import iter_full_tensors, tensor_keys, write_safetensors_streaming

__all__ = ["HF_WEIGHTS_FILE", "copy_hf_metadata", "export_hf_weights_from_shards", "save_hf_metadata"]

logger = logging.getLogger(__name__)

HF_WEIGHTS_FILE = "model.safetensors"
# files of a Hugging Face directory that are not weights (config, generation config, tokenizer, processor)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".safetensors.index.json", ".bin.index.json")


def save_hf_metadata(model, out_dir: str, processing_class=None) -> None:
    """Write `model`'s config, generation config and the tokenizer/processor into `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    config = getattr(model, "config", None)
    if config is not None:
        config.save_pretrained(out_dir)
    gen_config = getattr(model, "generation_config", None)
    if gen_config is not None:
        try:
            gen_config.save_pretrained(out_dir)
        except Exception as exc:  # noqa: BLE001 - an unusual generation config must not lose the checkpoint
            logger.warning("generation config not saved: %s", exc)
    if processing_class is not None:
        processing_class.save_pretrained(out_dir)


def copy_hf_metadata(src_dir: str, out_dir: str) -> list[str]:
    """Copy every non-weight file of the Hugging Face directory `src_dir` into `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    copied = []
    for name in sorted(os.listdir(src_dir)):
        path = os.path.join(src_dir, name)
        if os.path.isfile(path) and not name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(path, os.path.join(out_dir, name))
            copied.append(name)
    return copied


def export_hf_weights_from_shards(
    shard_dir: str,
    out_dir: str,
    prefix: str = "model.",
    rename: Callable[[str], str | None] | None = None,
    transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
    dtype: torch.dtype | None = None,
) -> str:
    """Write `out_dir/model.safetensors` from the tensors under `prefix` of the DCP checkpoint
    `shard_dir`, one full tensor in memory at a time. `rename(key)` gives the exported name (None
    drops the tensor); `transform(name, tensor)` may change a tensor (same shape), e.g. a LoRA
    merge; `dtype` casts floating tensors. Returns the file's path."""
    names: dict[str, str] = {}
    specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for key, meta in sorted(tensor_keys(shard_dir, prefix).items()):
        name = key[len(prefix) :]
        out = rename(name) if rename is not None else name
        if out is None:
            continue
        if out in specs:
            raise ValueError(f"two checkpoint entries map to the exported weight {out!r} (the second is {name!r})")
        names[name] = out
        specs[out] = (tuple(meta.size), meta.properties.dtype)

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in iter_full_tensors(shard_dir, prefix, only=set(names)):
            out = names[name]
            yield out, (transform(out, tensor) if transform is not None else tensor)

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, HF_WEIGHTS_FILE)
    write_safetensors_streaming(path, specs, stream(), dtype=dtype)
    return path
