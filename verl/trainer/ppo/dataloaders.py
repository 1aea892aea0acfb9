"""The PPO trainer's data: the stateful training dataloader and the validation dataloader."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RLDataloaders:
    train_dataset: Any
    val_dataset: Any
    train_dataloader: Any
    val_dataloader: Any


def build_dataloaders(
    data, data_config, tokenizer, processor, train_dataset=None, val_dataset=None, collate_fn=None, train_sampler=None
) -> RLDataloaders:
    """Datasets (built from `data.train_files` / `data.val_files` when not given), the stateful
    training dataloader (`data.train_batch_size` prompts per batch, the last partial batch
    dropped, `train_sampler` or the one `data.shuffle` / `data.seed` describe) and the
    validation dataloader (`data.val_batch_size`, default the whole set, in one batch).

    `data` is the validated `data` section, `data_config` the raw one (the dataset builders read
    upstream's keys from it). Fails naming the cause when a set is empty or the training set
    holds fewer prompts than one batch."""
    from verl.utils.dataset import StatefulDataLoader
    from verl.utils.dataset.rl_dataset import collate_fn as default_collate_fn
    from verl.utils.dataset.rl_dataset import create_rl_dataset, create_rl_sampler

    if train_dataset is None:
        train_dataset = create_rl_dataset(data.train_files, data_config, tokenizer, processor, is_train=True)
    if val_dataset is None:
        val_dataset = create_rl_dataset(data.val_files, data_config, tokenizer, processor, is_train=False)
    if train_sampler is None:
        train_sampler = create_rl_sampler(data_config, train_dataset)
    collate_fn = collate_fn or default_collate_fn
    if len(train_dataset) < data.train_batch_size:
        raise ValueError(
            f"the training set has {len(train_dataset)} prompts, fewer than "
            f"data.train_batch_size={data.train_batch_size}"
        )
    train_dataloader = StatefulDataLoader(
        dataset=train_dataset,
        batch_size=data.train_batch_size,
        num_workers=data.dataloader_num_workers,
        drop_last=True,
        collate_fn=collate_fn,
        sampler=train_sampler,
    )
    if len(val_dataset) == 0:
        raise ValueError(
            f"the validation set data.val_files={data.val_files!r} has no prompts "
            "(after data.filter_overlong_prompts, if it is on)"
        )
    val_dataloader = StatefulDataLoader(
        dataset=val_dataset,
        batch_size=data.val_batch_size or len(val_dataset),
        num_workers=data.dataloader_num_workers,
        shuffle=data.validation_shuffle,
        drop_last=False,
        collate_fn=collate_fn,
    )
    if len(train_dataloader) < 1:
        raise ValueError("the training dataloader is empty")
    return RLDataloaders(train_dataset, val_dataset, train_dataloader, val_dataloader)
