"""Utilities (the lowest layer: they import nothing else of verl). Upstream's package-level names
are re-exported here.

The re-exports are resolved on first access (PEP 562): `import verl.utils.config` (the config
check, which runs before Ray starts) must not import torch and transformers through this package.
"""

from __future__ import annotations

import importlib

# name -> submodule that defines it
_EXPORTS = {
    "omega_conf_to_dataclass": "config",
    "hf_tokenizer": "tokenizer",
    "hf_processor": "tokenizer",
    "normalize_token_ids": "tokenizer",
    "as_torch_index": "groupwise",
    "group_mean_std": "groupwise",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'verl.utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
