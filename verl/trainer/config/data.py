"""Data config (`data.*`): which files, how prompts are built and how many go into a step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig, check_choice, check_range

TRUNCATION_MODES = ("left", "right", "middle", "error")


@dataclass
class CustomClassConfig(BaseConfig):
    """A user class loaded from a file: `path` (.py file or module path) and class `name`."""

    path: str | None = None
    name: str | None = None

    def __post_init__(self):
        if (self.path is None) != (self.name is None):
            raise ValueError(f"data.custom_cls needs both path and name (got path={self.path!r}, name={self.name!r})")


@dataclass
class DataConfig(BaseConfig):
    """Training and validation data.

    Batch sizes count *prompts*: one step samples `train_batch_size` prompts and generates
    `actor_rollout_ref.rollout.n` responses for each (see docs/batch_sizes.md).

    - `train_files` / `val_files`: a parquet or jsonl path or a list of them in the upstream RL
      schema (`data_source`, `prompt` as chat messages, `ability`, `reward_model.ground_truth`,
      `extra_info`); null selects the embedded toy task.
    - `max_prompt_length`: prompts longer than this (in tokens, after the chat template) are
      dropped when `filter_overlong_prompts`, else handled by `truncation`.
    - `val_batch_size`: null puts the whole validation set into one generation call.
    - `seed`: seed of the shuffling sampler (the order is a function of seed and epoch, so a
      resumed run sees the same samples as an uninterrupted one).
    - `prompt_key`: column holding the prompt (a list of chat messages).
    - `reward_fn_key`: column naming the data source; it selects the scorer and groups the
      validation metrics.
    - `max_response_length`: tokens generated per response at most (the rollout's limit).
    - `return_raw_chat`: keep the chat messages of each prompt in the batch (`raw_prompt`).
    - `return_full_prompt`: keep the prompt text after the chat template (`full_prompts`).
    - `shuffle`: shuffle the training prompts (seeded, see `seed`).
    - `validation_shuffle`: shuffle the validation prompts.
    - `filter_overlong_prompts`: drop prompts longer than `max_prompt_length` when loading.
    - `dataloader_num_workers`: background processes of the dataloader (0: in the driver).
    - `custom_cls`: a dataset class of your own (`path` to a .py file or module, class `name`)
      used instead of `RLHFDataset`.
    """

    tokenizer: str | None = None
    train_files: Any = None
    val_files: Any = None
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    max_prompt_length: int = 16
    max_response_length: int = 8
    train_batch_size: int = 32
    val_batch_size: int | None = None
    return_raw_chat: bool = False
    return_full_prompt: bool = False
    shuffle: bool = True
    validation_shuffle: bool = False
    seed: int | None = 1  # null (upstream's yaml default) = 1
    filter_overlong_prompts: bool = True
    truncation: str = "error"
    dataloader_num_workers: int = 0
    custom_cls: CustomClassConfig = field(default_factory=CustomClassConfig)

    def __post_init__(self):
        owner = "data"
        if self.seed is None:
            self.seed = 1
        check_choice(owner, "truncation", self.truncation, TRUNCATION_MODES)
        check_range(owner, "max_prompt_length", self.max_prompt_length, low=1)
        check_range(owner, "max_response_length", self.max_response_length, low=1)
        check_range(owner, "train_batch_size", self.train_batch_size, low=1)
        check_range(owner, "val_batch_size", self.val_batch_size, low=1, allow_none=True)
        check_range(owner, "dataloader_num_workers", self.dataloader_num_workers, low=0)
        for key in ("train_files", "val_files"):
            value = getattr(self, key)
            if value is None or isinstance(value, str):
                continue
            if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
                setattr(self, key, list(value))
                continue
            raise ValueError(f"data.{key}={value!r} must be null, a path, or a non-empty list of paths")
