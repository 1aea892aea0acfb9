"""Command line, configuration and the shared part of the model mergers (upstream's names).

Arguments follow upstream's `python -m verl.model_merger`: `merge` / `test`, `--backend`,
`--local_dir`, `--target_dir`, `--test_hf_dir`, `--hf_upload_path`, `--private`,
`--tie-word-embedding`, `--trust-remote-code`, `--is-value-model`, `--use_cpu_initialization`.
Ours: `--lora_adapter_only` writes only the LoRA adapter (peft format) into `--target_dir`.

Divergences (docs/checkpoints.md#the-model-merger): `--hf_upload_path` is refused before any work
(this build runs offline and never uploads; upload the directory yourself); the merged weights keep
the checkpoint's dtype (upstream casts to bf16); a LoRA checkpoint is written merged, W + delta_W
(upstream writes the base weights and the adapter beside them), with the adapter also in
`<target_dir>/lora_adapter/`; `--tie-word-embedding`, `--is-value-model` and
`--use_cpu_initialization` are Megatron options upstream and are accepted without effect.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

__all__ = ["BaseModelMerger", "ModelMergerConfig", "generate_config_from_args", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m verl.model_merger", description="verl model merger")
    ops = parser.add_subparsers(dest="operation", required=True, help="merge or test")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", required=True, choices=["fsdp", "megatron"], help="training backend")
    common.add_argument("--local_dir", default=None, help="the checkpoint's actor (or critic) directory")
    common.add_argument("--tie-word-embedding", action="store_true", help="Megatron only upstream; no effect")
    common.add_argument("--trust-remote-code", action="store_true", help="allow code shipped with the model")
    common.add_argument("--is-value-model", action="store_true", help="Megatron only upstream; no effect")
    common.add_argument("--use_cpu_initialization", action="store_true", help="Megatron only upstream; no effect")
    common.add_argument(
        "--lora_adapter_only", action="store_true", help="(ours) write only the LoRA adapter, in peft format"
    )
    merge = ops.add_parser("merge", parents=[common], help="write a Hugging Face model directory")
    merge.add_argument("--target_dir", default="tmp", help="directory of the merged model")
    merge.add_argument("--hf_upload_path", default=None, help="refused: this build never uploads")
    merge.add_argument("--private", action="store_true", help="with --hf_upload_path (refused)")
    test = ops.add_parser("test", parents=[common], help="compare the checkpoint with a Hugging Face model")
    test.add_argument("--test_hf_dir", required=True, help="reference Hugging Face model directory")
    return parser.parse_args(argv)


@dataclass
class ModelMergerConfig:
    """What one merger run does (upstream's fields; `lora_adapter_only` is ours)."""

    operation: str
    backend: str
    target_dir: str | None = "tmp"
    hf_upload_path: str | None = None
    private: bool = False
    test_hf_dir: str | None = None
    tie_word_embedding: bool = False
    trust_remote_code: bool = False
    is_value_model: bool = False
    local_dir: str | None = None
    hf_model_config_path: str | None = None
    hf_upload: bool = field(init=False)
    use_cpu_initialization: bool = False
    lora_adapter_only: bool = False

    def __post_init__(self):
        self.hf_upload = self.operation == "merge" and bool(self.hf_upload_path)
        if self.operation == "test":
            self.target_dir = None
            self.hf_upload_path = None
            self.private = False


def generate_config_from_args(args: argparse.Namespace) -> ModelMergerConfig:
    """The config of a parsed command line; bad paths and `--hf_upload_path` fail here, before any work."""
    if not args.local_dir or not os.path.isdir(args.local_dir):
        raise SystemExit(
            f"--local_dir={args.local_dir!r} is not a directory; expected <checkpoint>/global_step_N/actor"
        )
    if getattr(args, "hf_upload_path", None):
        raise SystemExit(
            f"--hf_upload_path={args.hf_upload_path!r}: uploading to the Hugging Face Hub is not available here "
            "(this build runs offline and never uploads). Merge without it, then upload the directory yourself "
            f"on a machine with network access: huggingface-cli upload {args.hf_upload_path} <target_dir>"
        )
    config = ModelMergerConfig(
        operation=args.operation,
        backend=args.backend,
        target_dir=getattr(args, "target_dir", None),
        private=getattr(args, "private", False),
        test_hf_dir=getattr(args, "test_hf_dir", None),
        tie_word_embedding=args.tie_word_embedding,
        trust_remote_code=args.trust_remote_code,
        is_value_model=args.is_value_model,
        local_dir=args.local_dir,
        hf_model_config_path=os.path.join(args.local_dir, "huggingface"),
        use_cpu_initialization=args.use_cpu_initialization,
        lora_adapter_only=args.lora_adapter_only,
    )
    if config.operation == "test" and not os.path.isdir(config.test_hf_dir or ""):
        raise SystemExit(f"--test_hf_dir={config.test_hf_dir!r} is not a directory")
    return config


class BaseModelMerger:
    """Holds the config; subclasses implement `merge_and_save` (and `cleanup`)."""

    def __init__(self, config: ModelMergerConfig):
        self.config = config
        self.hf_model_config_path = config.hf_model_config_path

    def merge_and_save(self) -> None:
        raise NotImplementedError

    def cleanup(self) -> None:
        """Nothing to clean up: mergers here write no temporary files."""
