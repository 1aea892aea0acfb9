"""Datasets and data loading: `RLHFDataset` (RL prompts), `SFTDataset`, and a resumable loader.

Public names (upstream paths): `verl.utils.dataset.rl_dataset.RLHFDataset` / `collate_fn`,
`verl.utils.dataset.sft_dataset.SFTDataset`; loader and samplers from `verl.utils.dataset.dataloader`.
"""

from verl.utils.dataset.dataloader import SeededRandomSampler, StatefulDataLoader, create_sampler
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn, create_rl_dataset, create_rl_sampler
from verl.utils.dataset.sft_dataset import SFTDataset

__all__ = [
    "RLHFDataset",
    "SFTDataset",
    "SeededRandomSampler",
    "StatefulDataLoader",
    "collate_fn",
    "create_rl_dataset",
    "create_rl_sampler",
    "create_sampler",
]
