"""`FSDPModelMerger`: a Hugging Face model directory from an FSDP checkpoint's actor/critic dir.

Recognised layouts of `--local_dir` (first match):
- ours, DCP (`checkpoint_meta.json` format "dcp" with model shards in `dcp/`): the weights are
  streamed out of the shards one tensor at a time, whatever world size wrote them;
- upstream verl's (`fsdp_config.json` + `model_world_size_W_rank_r.pt`): each tensor is joined from
  the W DTensor shards (memory-mapped, one tensor at a time); a LoRA run's `lora_A`/`lora_B` are
  merged into the base weights with `lora_alpha / r` from `lora_train_meta.json`;
- ours, LoRA (`lora_adapter/`): the merged export in `huggingface/` when the checkpoint has it,
  else the base model named by the adapter (`base_model_name_or_path`, a local directory) merged
  with the adapter by peft;
- ours, the earlier full-state layout (`huggingface/model.safetensors`).
The target directory gets `model.safetensors`, the config, generation config and tokenizer from
the checkpoint's `huggingface/`, and `lora_adapter/` when there is an adapter.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator

import torch

from verl.model_merger.base_model_merger import BaseModelMerger
from verl.utils.checkpoint import dcp_shards, upstream_fsdp
from verl.utils.checkpoint.hf_export import HF_WEIGHTS_FILE, copy_hf_metadata

__all__ = ["FSDPModelMerger"]

Specs = dict[str, tuple[tuple[int, ...], torch.dtype]]
Stream = Callable[[], Iterator[tuple[str, torch.Tensor]]]


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _safetensors_plan(path: str) -> tuple[Specs, Stream]:
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        keys = list(f.keys())
        specs = {k: (tuple(f.get_slice(k).get_shape()), _SAFETENSORS_DTYPES[f.get_slice(k).get_dtype()]) for k in keys}

    def stream():
        with safe_open(path, "pt") as f:
            for k in keys:
                yield k, f.get_tensor(k)

    return specs, stream


def _dict_plan(state: dict[str, torch.Tensor]) -> tuple[Specs, Stream]:
    return {k: (tuple(v.shape), v.dtype) for k, v in state.items()}, lambda: iter(state.items())


class FSDPModelMerger(BaseModelMerger):
    """Merge an FSDP checkpoint (see the module docstring for the layouts)."""

    def merge_and_save(self) -> None:
        local = self.config.local_dir
        adapter = os.path.join(local, "lora_adapter")
        if self.config.lora_adapter_only:
            self._write_adapter_only(adapter)
            return
        specs, stream = self._plan()
        if self.config.operation == "test":
            self._validate_state_dict(dict(stream()))
            return
        target = self.config.target_dir
        os.makedirs(target, exist_ok=True)
        dcp_shards.write_safetensors_streaming(os.path.join(target, HF_WEIGHTS_FILE), specs, stream())
        if os.path.isdir(self.hf_model_config_path):
            copy_hf_metadata(self.hf_model_config_path, target)
        if os.path.isdir(adapter):
            shutil.copytree(adapter, os.path.join(target, "lora_adapter"), dirs_exist_ok=True)
        elif self._upstream_lora_meta() is not None:
            self._write_upstream_adapter(os.path.join(target, "lora_adapter"))
        self._check_output(target)
        print(f"merged model written to {target}")

    # -- layouts -------------------------------------------------------------------------------

    def _plan(self) -> tuple[Specs, Stream]:
        local = self.config.local_dir
        meta_path = os.path.join(local, "checkpoint_meta.json")
        meta = json.load(open(meta_path)) if os.path.isfile(meta_path) else {}
        shards = os.path.join(local, "dcp")
        if meta.get("format") == "dcp" and "model" in meta.get("shards", []):
            specs = {
                k[len("model.") :]: (tuple(m.size), m.properties.dtype)
                for k, m in sorted(dcp_shards.tensor_keys(shards, "model.").items())
            }
            return specs, lambda: dcp_shards.iter_full_tensors(shards, "model.")
        if upstream_fsdp.is_upstream_fsdp_dir(local):
            return self._upstream_plan(local)
        merged = os.path.join(local, "huggingface", HF_WEIGHTS_FILE)
        if os.path.isfile(merged):
            return _safetensors_plan(merged)
        adapter = os.path.join(local, "lora_adapter")
        if os.path.isdir(adapter):
            return _dict_plan(self._merge_adapter_with_its_base(adapter))
        raise SystemExit(
            f"--local_dir={local!r} holds no model weights this merger reads: expected dcp/ shards with a "
            "checkpoint_meta.json, upstream's model_world_size_W_rank_r.pt + fsdp_config.json, lora_adapter/, or "
            "huggingface/model.safetensors (a checkpoint saved with save_contents=[optimizer] only has no weights)"
        )

    def _upstream_lora_meta(self) -> dict | None:
        path = os.path.join(self.config.local_dir, "lora_train_meta.json")
        return json.load(open(path)) if os.path.isfile(path) else None

    def _upstream_plan(self, local: str) -> tuple[Specs, Stream]:
        from verl.utils.fsdp_utils import peft_to_hf_key

        specs = upstream_fsdp.model_tensor_specs(local)
        if not any(".lora_" in k for k in specs):
            return specs, lambda: upstream_fsdp.iter_full_model_tensors(local)
        meta = self._upstream_lora_meta()
        if not meta or not meta.get("r"):
            raise SystemExit(f"{local} holds LoRA weights but no lora_train_meta.json with r and lora_alpha")
        scale = float(meta.get("lora_alpha", meta["r"])) / float(meta["r"])
        lora = {k: v for k, v in upstream_fsdp.iter_full_model_tensors(local) if ".lora_" in k}  # small
        out_specs = {peft_to_hf_key(k): s for k, s in specs.items() if peft_to_hf_key(k) is not None}

        def stream():
            for key, tensor in upstream_fsdp.iter_full_model_tensors(local):
                name = peft_to_hf_key(key)
                if name is None:
                    continue
                if key.endswith(".base_layer.weight"):
                    stem = key[: -len(".base_layer.weight")]
                    a, b = lora.get(f"{stem}.lora_A.default.weight"), lora.get(f"{stem}.lora_B.default.weight")
                    if a is not None and b is not None:
                        tensor = tensor + (scale * (b.float() @ a.float())).to(tensor.dtype)
                yield name, tensor

        return out_specs, stream

    def _write_upstream_adapter(self, out_dir: str) -> None:
        """Upstream LoRA weights as a peft adapter directory (`PeftModel.from_pretrained` reads it)."""
        from safetensors.torch import save_file

        meta = self._upstream_lora_meta() or {}
        lora = {
            k.replace(".default.weight", ".weight"): v.contiguous()
            for k, v in upstream_fsdp.iter_full_model_tensors(self.config.local_dir)
            if ".lora_" in k
        }
        targets = sorted({k.split(".")[-3] for k in lora})
        os.makedirs(out_dir, exist_ok=True)
        save_file(lora, os.path.join(out_dir, "adapter_model.safetensors"), metadata={"format": "pt"})
        config = {
            "peft_type": "LORA",
            "r": int(meta["r"]),
            "lora_alpha": meta.get("lora_alpha", meta["r"]),
            "target_modules": targets,
            "task_type": meta.get("task_type", "CAUSAL_LM"),
        }
        with open(os.path.join(out_dir, "adapter_config.json"), "w") as fh:
            json.dump(config, fh, indent=2)

    def _merge_adapter_with_its_base(self, adapter: str) -> dict[str, torch.Tensor]:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base_dir = json.load(open(os.path.join(adapter, "adapter_config.json"))).get("base_model_name_or_path")
        if not base_dir or not os.path.isdir(base_dir):
            raise SystemExit(
                f"{self.config.local_dir} holds only a LoRA adapter (save_lora_only) and its base model "
                f"{base_dir!r} is not a local directory: merge needs the base weights. Use --lora_adapter_only to "
                "export the adapter alone"
            )
        base = AutoModelForCausalLM.from_pretrained(base_dir, trust_remote_code=self.config.trust_remote_code)
        merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
        return {k: v.detach().contiguous() for k, v in merged.state_dict().items()}

    def _write_adapter_only(self, adapter: str) -> None:
        target = self.config.target_dir
        if os.path.isdir(adapter):
            shutil.copytree(adapter, target, dirs_exist_ok=True)
        elif self._upstream_lora_meta() is not None:
            self._write_upstream_adapter(target)
        else:
            raise SystemExit(f"--lora_adapter_only: {self.config.local_dir} holds no LoRA adapter")
        print(f"LoRA adapter written to {target}")

    # -- checks --------------------------------------------------------------------------------

    @staticmethod
    def _check_output(target: str) -> None:
        for name in ("config.json", HF_WEIGHTS_FILE):
            path = os.path.join(target, name)
            if not os.path.isfile(path) or os.path.getsize(path) == 0:
                raise RuntimeError(f"the merged model in {target} is incomplete: {name} is missing or empty")

    def _validate_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """`test`: the checkpoint's weights equal those of `--test_hf_dir` (names, shapes, values)."""
        from transformers import AutoModelForCausalLM

        reference = AutoModelForCausalLM.from_pretrained(
            self.config.test_hf_dir, trust_remote_code=self.config.trust_remote_code
        ).state_dict()
        missing, extra = sorted(set(reference) - set(state_dict)), sorted(set(state_dict) - set(reference))
        if missing or extra:
            raise SystemExit(f"test failed: missing weights {missing[:10]}, unexpected weights {extra[:10]}")
        for key, ref in reference.items():
            got = state_dict[key]
            if tuple(got.shape) != tuple(ref.shape):
                raise SystemExit(f"test failed: {key} has shape {tuple(got.shape)}, the reference {tuple(ref.shape)}")
            try:
                torch.testing.assert_close(got.to(ref.dtype), ref, atol=1e-6, rtol=1e-6)
            except AssertionError as exc:
                raise SystemExit(f"test failed: {key} differs from the reference: {exc}") from exc
        print(f"test passed: the {len(reference)} weights equal those of {self.config.test_hf_dir}")
