"""Prompt dataset for RL (`RLHFDataset`) and the collate function that feeds `DataProto.from_single_dict`.

Rows follow the upstream verl schema::

    {"data_source": "openai/gsm8k",                       # selects the reward function
     "prompt": [{"role": "user", "content": "..."}],      # chat messages (column: data.prompt_key)
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, ...}}

Only the prompt column is required by the dataset itself; the other columns are passed through to the
batch untouched (the reward manager needs ``data_source`` and ``reward_model``).

Config keys read from the ``data`` section (dict or DictConfig; defaults in brackets):
``prompt_key`` ["prompt"], ``max_prompt_length`` [512], ``filter_overlong_prompts`` [False],
``truncation`` ["error": "left" | "right" | "middle" | "error"], ``return_raw_chat`` [False],
``return_full_prompt`` [False], ``apply_chat_template_kwargs`` [{}]. Shuffling and seeds belong to the
sampler (`create_rl_sampler`), not to the dataset.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import numpy as np
import torch
from torch.utils.data import Dataset

from verl.utils.dataset.dataloader import create_sampler
from verl.utils.dataset.files import RowSource, read_rows, to_plain, validate_messages
from verl.utils.py_functional import config_get

logger = logging.getLogger(__name__)

__all__ = ["RLHFDataset", "collate_fn", "create_rl_sampler", "create_rl_dataset"]

TRUNCATION_CHOICES = ("left", "right", "middle", "error")


def collate_fn(data_list: list[dict]) -> dict:
    """Stack tensors (same shape in every item) and put every other field into a 1-D numpy object array.

    The result is exactly what `DataProto.from_single_dict` takes: tensors -> ``batch``, arrays ->
    ``non_tensor_batch``. Every item must have the same keys.
    """
    if not data_list:
        raise ValueError("collate_fn got an empty list of items")
    keys = set(data_list[0])
    tensors: dict[str, list] = defaultdict(list)
    non_tensors: dict[str, list] = defaultdict(list)
    for i, item in enumerate(data_list):
        if set(item) != keys:
            raise ValueError(
                f"collate_fn: item {i} has keys {sorted(item)} but item 0 has {sorted(keys)}; all rows "
                "need the same columns"
            )
        for k, v in item.items():
            (tensors if isinstance(v, torch.Tensor) else non_tensors)[k].append(v)
    out: dict = {k: torch.stack(v, dim=0) for k, v in tensors.items()}
    for k, values in non_tensors.items():
        # Element-wise fill: np.array(values) would build a 2-D array when all values are equal-length lists.
        arr = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):
            arr[i] = v
        out[k] = arr
    return out


class RLHFDataset(Dataset):
    """Chat prompts tokenised with the tokenizer's chat template and left padded.

    ``__getitem__(i)`` returns:

    * ``input_ids`` (max_prompt_length,) long: pad ... pad, prompt tokens (generation prompt included).
    * ``attention_mask`` (max_prompt_length,) long: 0 on padding, 1 on prompt tokens.
    * ``position_ids`` (max_prompt_length,) long: 0 on padding, then 0, 1, 2, ... over prompt tokens.
    * ``raw_prompt_ids``: list[int], the prompt tokens without padding (after truncation).
    * ``raw_prompt`` (if ``return_raw_chat``): the chat messages; ``full_prompts`` (if
      ``return_full_prompt``): the prompt text after the chat template.
    * ``index``: ``extra_info["index"]`` when present, else the row's position in this dataset.
    * every other column of the row (``data_source``, ``reward_model``, ``extra_info``, ``ability``, ...).

    Rows are validated and tokenised when the dataset is built, so a bad row fails before training with
    its file and row number. With ``filter_overlong_prompts`` rows longer than ``max_prompt_length``
    are dropped (the number dropped is logged and kept in ``num_filtered``).
    """

    def __init__(self, data_files, tokenizer, config=None, processor=None):
        self.tokenizer = tokenizer
        self.processor = processor
        self.config = config
        self.prompt_key = config_get(config, "prompt_key", "prompt")
        self.max_prompt_length = int(config_get(config, "max_prompt_length", 512))
        self.filter_overlong_prompts = bool(config_get(config, "filter_overlong_prompts", False))
        self.truncation = config_get(config, "truncation", "error")
        self.return_raw_chat = bool(config_get(config, "return_raw_chat", False))
        self.return_full_prompt = bool(config_get(config, "return_full_prompt", False))
        self.chat_template_kwargs = dict(config_get(config, "apply_chat_template_kwargs", {}) or {})
        if self.truncation not in TRUNCATION_CHOICES:
            raise ValueError(f"data.truncation={self.truncation!r} is not allowed; choose one of {TRUNCATION_CHOICES}")
        if self.max_prompt_length < 1:
            raise ValueError(f"data.max_prompt_length must be >= 1, got {self.max_prompt_length}")
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token (e.g. to the eos token) first")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template; RL prompts are chat messages and need one")

        rows, sources = read_rows(data_files)
        self.data_files = data_files
        self.rows: list[dict] = []
        self.sources: list[RowSource] = []
        # token ids as int32 arrays: a Python list costs ~36 bytes per token (one int object each),
        # which for a large prompt set is gigabytes; the template text is kept only when returned
        self._prompt_ids: list[np.ndarray] = []
        self._prompt_text: list[str] = []
        self.num_filtered = 0
        filtered_examples: list[str] = []
        for row, src in zip(rows, sources, strict=False):
            messages = self._validate_row(row, src)
            text, ids = self._render(messages)
            if len(ids) > self.max_prompt_length:
                if self.filter_overlong_prompts:
                    self.num_filtered += 1
                    if len(filtered_examples) < 3:
                        filtered_examples.append(f"{src}: {len(ids)} tokens")
                    continue
                if self.truncation == "error":
                    raise ValueError(
                        f"{src}: prompt has {len(ids)} tokens after the chat template, more than "
                        f"data.max_prompt_length={self.max_prompt_length}; raise max_prompt_length, set "
                        "data.filter_overlong_prompts=True, or choose data.truncation left/right/middle"
                    )
            self.rows.append(row)
            self.sources.append(src)
            self._prompt_ids.append(np.asarray(ids, dtype=np.int32))
            if self.return_full_prompt:
                self._prompt_text.append(text)
        if self.num_filtered:
            logger.warning(
                "RLHFDataset: dropped %d of %d prompts longer than max_prompt_length=%d (e.g. %s)",
                self.num_filtered,
                len(rows),
                self.max_prompt_length,
                "; ".join(filtered_examples),
            )
        if not self.rows:
            raise ValueError(
                f"RLHFDataset: no rows left from {data_files} ({len(rows)} read, {self.num_filtered} longer than "
                f"max_prompt_length={self.max_prompt_length})"
            )

    # ------------------------------------------------------------------------------------------------
    def _validate_row(self, row: dict, src: RowSource) -> list[dict]:
        if self.prompt_key not in row or row[self.prompt_key] is None:
            raise KeyError(f"{src}: missing prompt column {self.prompt_key!r}; columns present: {sorted(row)}")
        for key in ("image", "images", "video", "videos"):
            if row.get(key) is not None:
                raise NotImplementedError(f"{src}: column {key!r} holds media; multimodal prompts are not supported")
        if "data_source" in row and not isinstance(row["data_source"], str):
            raise TypeError(f"{src}: column 'data_source' must be a string, got {type(row['data_source']).__name__}")
        for key in ("reward_model", "extra_info"):
            if row.get(key) is not None and not isinstance(to_plain(row[key]), dict):
                raise TypeError(f"{src}: column {key!r} must be a dict (struct), got {type(row[key]).__name__}")
        if "reward_model" in row:
            self._check_ground_truth(to_plain(row["reward_model"]), src)
        return validate_messages(row[self.prompt_key], src, self.prompt_key)

    @staticmethod
    def _check_ground_truth(rm, src: RowSource) -> None:
        """A rule-scored row needs `reward_model.ground_truth`: missing or null fails here, naming the
        file and row, not at the first scoring of that row (after the workers started). Rows scored
        by a reward model (`style: model`) may leave it null."""
        if not isinstance(rm, dict):
            raise TypeError(
                f"{src}: column 'reward_model' must be a dict (struct) with 'ground_truth', got {rm!r:.100}"
            )
        if rm.get("style") == "model":
            return
        if "ground_truth" not in rm:
            raise KeyError(
                f"{src}: reward_model has no 'ground_truth' (keys: {sorted(rm)}); every rule-scored row "
                "needs one (use style: model for rows scored by a reward model)"
            )
        if rm["ground_truth"] is None:
            raise ValueError(
                f"{src}: reward_model.ground_truth is null; give every row a ground truth (an empty "
                "string if your scoring function ignores it), or drop the row"
            )

    def _render(self, messages: list[dict]) -> tuple[str, list[int]]:
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
        )
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return text, list(ids)

    def _truncate(self, ids: np.ndarray, src: RowSource) -> np.ndarray:
        m = self.max_prompt_length
        if len(ids) <= m:
            return ids
        if self.truncation == "left":
            return ids[-m:]
        if self.truncation == "right":
            return ids[:m]
        if self.truncation == "middle":
            left = m // 2
            return np.concatenate([ids[:left], ids[len(ids) - (m - left) :]])
        raise ValueError(f"{src}: prompt has {len(ids)} tokens, more than data.max_prompt_length={m}")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: int) -> dict:
        row = {k: to_plain(v) for k, v in self.rows[item].items()}
        messages = row.pop(self.prompt_key)
        ids = self._truncate(self._prompt_ids[item], self.sources[item])
        n, m = len(ids), self.max_prompt_length
        input_ids = torch.full((m,), self.tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(m, dtype=torch.long)
        position_ids = torch.zeros(m, dtype=torch.long)
        if n:
            input_ids[m - n :] = torch.from_numpy(ids)
            attention_mask[m - n :] = 1
            position_ids[m - n :] = torch.arange(n, dtype=torch.long)
        out = row
        out["input_ids"] = input_ids
        out["attention_mask"] = attention_mask
        out["position_ids"] = position_ids
        out["raw_prompt_ids"] = ids.tolist()
        if self.return_raw_chat:
            out["raw_prompt"] = messages
        if self.return_full_prompt:
            out["full_prompts"] = self._prompt_text[item]
        extra = row.get("extra_info") or {}
        out["index"] = extra.get("index", item) if isinstance(extra, dict) else item
        return out


def create_rl_sampler(data_config, dataset):
    """Seeded shuffling sampler (`data.shuffle`, `data.seed`; order = f(seed, epoch)) or a sequential one."""
    return create_sampler(
        dataset, shuffle=bool(config_get(data_config, "shuffle", True)), seed=int(config_get(data_config, "seed", 1))
    )


def create_rl_dataset(data_paths, data_config, tokenizer, processor=None, is_train: bool = True):
    """`data.custom_cls` (path + name) when set, else `RLHFDataset` (upstream signature)."""
    custom = config_get(data_config, "custom_cls", {}) or {}
    cls = RLHFDataset
    if config_get(custom, "path"):
        from verl.utils.import_utils import load_extern_type

        cls = load_extern_type(custom["path"], custom.get("name"))
    return cls(data_files=data_paths, tokenizer=tokenizer, config=data_config, processor=processor)
