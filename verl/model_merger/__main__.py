"""Entry point of `python -m verl.model_merger` (see the package docstring)."""

from __future__ import annotations

import sys

from verl.model_merger.base_model_merger import generate_config_from_args, parse_args


def main(argv: list[str] | None = None) -> None:
    config = generate_config_from_args(parse_args(argv))
    if config.backend == "megatron":
        raise SystemExit(
            "--backend megatron: Megatron is not available in this build (FSDP2 is the only training backend); "
            "use --backend fsdp"
        )
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    merger = FSDPModelMerger(config)
    merger.merge_and_save()
    merger.cleanup()


if __name__ == "__main__":
    main(sys.argv[1:])
