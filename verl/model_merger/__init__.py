"""`python -m verl.model_merger`: turn a training checkpoint into a Hugging Face model directory.

    python -m verl.model_merger merge --backend fsdp --local_dir <ckpt>/global_step_N/actor --target_dir <dir>
    python -m verl.model_merger test --backend fsdp --local_dir <...>/actor --test_hf_dir <reference model>

Reads this project's checkpoints (DCP shards, the earlier full-state layout, LoRA adapters) and
upstream verl's FSDP layout (`model_world_size_W_rank_r.pt` + `fsdp_config.json`). See
docs/checkpoints.md#the-model-merger.
"""

from verl.model_merger.base_model_merger import (
    BaseModelMerger,
    ModelMergerConfig,
    generate_config_from_args,
    parse_args,
)

__all__ = ["BaseModelMerger", "ModelMergerConfig", "generate_config_from_args", "parse_args"]
