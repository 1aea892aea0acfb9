"""Building a model for an engine: load, optional gradient checkpointing and LoRA adapter, move to
the device, shard with FSDP2. Shared by the RL workers (`verl.workers.fsdp_workers`) and the SFT
trainer."""

from __future__ import annotations

import logging

import torch

from verl.utils.fsdp_utils import apply_fsdp2, create_device_mesh
from verl.utils.model import apply_lora, count_parameters

__all__ = ["build_fsdp_model"]

logger = logging.getLogger(__name__)


def build_fsdp_model(
    builder,
    path,
    model_config,
    fsdp_config,
    device_name: str,
    world_size: int,
    train: bool,
    lora_task: str | None = None,
    mesh=None,
):
    """Load with `builder`, optionally enable gradient checkpointing, move to the device, shard.

    `lora_task` (a peft task type) with `train` and `model_config.use_lora`: the model is wrapped
    in a peft LoRA adapter before sharding (frozen base, trainable adapter; see `apply_lora`).
    FSDP2 shards every parameter on its own, so frozen and trainable ones share a unit. `mesh`: the
    device mesh to shard over (default: one from `world_size` and `fsdp_config.fsdp_size`).
    """
    module = builder(
        path,
        override_config=model_config.override_config,
        torch_dtype=fsdp_config.model_dtype,
        trust_remote_code=model_config.trust_remote_code,
    )
    if train and model_config.enable_gradient_checkpointing:
        # transformers >= 5.2x renamed the switch and its kwargs; older versions have the old name
        if hasattr(module, "activation_checkpointing_enable"):
            module.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if train and lora_task is not None and model_config.use_lora:
        module = apply_lora(module, model_config, task_type=lora_task)
        trainable, total = count_parameters(module)
        logger.info("LoRA: %d of %d parameters trainable (%.3f%%)", trainable, total, 100.0 * trainable / max(total, 1))
    if device_name == "cuda":
        module.to(torch.device("cuda", torch.cuda.current_device()))
    if not train:
        module.requires_grad_(False)
        module.eval()
    if mesh is None:
        mesh = create_device_mesh(world_size, fsdp_config.fsdp_size, device_name)
    apply_fsdp2(
        module, mesh, reshard_after_forward=fsdp_config.reshard_after_forward, wrap_policy=fsdp_config.wrap_policy
    )
    return module
