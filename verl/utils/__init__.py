"""Utilities (the lowest layer: they import nothing else of verl). Upstream's package-level names
are re-exported here."""

from .config import omega_conf_to_dataclass
from .groupwise import as_torch_index, group_mean_std
from .tokenizer import hf_processor, hf_tokenizer, normalize_token_ids

__all__ = [
    "omega_conf_to_dataclass",
    "hf_tokenizer",
    "hf_processor",
    "normalize_token_ids",
    "as_torch_index",
    "group_mean_std",
]
