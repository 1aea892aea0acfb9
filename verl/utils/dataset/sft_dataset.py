"""Supervised fine-tuning dataset: prompt/response pairs or whole chat conversations.

Two row layouts (chosen by ``config.multiturn.enable``):

* single turn (default): a prompt column (``config.prompt_key``, default ``"prompt"``) holding either a
  string (sent as one user message) or a list of chat messages, and a response column
  (``config.response_key``, default ``"response"``) holding the assistant's answer as a string. Nested
  fields are reached with ``prompt_dict_keys`` / ``response_dict_keys`` (e.g. ``extra_info.question``
  is ``prompt_key=extra_info, prompt_dict_keys=[question]``).
* multi turn: a messages column (``config.multiturn.messages_key``, default ``"messages"``) with the
  whole conversation; every assistant message is trained on.

Each item is a dict of 1-D tensors of length ``max_length`` (right padded with the pad token):

* ``input_ids``: prompt tokens (chat template, generation prompt included), response tokens, eos.
* ``attention_mask``: 1 on real tokens, 0 on padding.
* ``position_ids``: 0, 1, 2, ... over real tokens, 0 on padding.
* ``loss_mask``: float; ``loss_mask[t] = 1`` iff token ``t + 1`` is a response token (so it lines up
  with the logits at position ``t`` that predict token ``t + 1``); the last position is always 0.
  This is the upstream verl convention: loss = CE(logits[:, :-1], input_ids[:, 1:]) * loss_mask[:, :-1].
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch.utils.data import Dataset

from verl.utils.dataset.files import RowSource, read_rows, to_plain, validate_messages
from verl.utils.py_functional import config_get

logger = logging.getLogger(__name__)

TRUNCATION_CHOICES = ("error", "left", "right")


class SFTDataset(Dataset):
    """See the module docstring. ``parquet_files`` may be parquet or jsonl paths (a str or a list).

    Args:
        parquet_files: data file path(s).
        tokenizer: a Hugging Face tokenizer with a chat template (required for message prompts).
        config: the ``data`` config section (dict or DictConfig); keys: ``max_length`` (1024),
            ``truncation`` ("error" | "left" | "right"), ``prompt_key``, ``response_key``,
            ``prompt_dict_keys``, ``response_dict_keys``, ``multiturn.enable``, ``multiturn.messages_key``,
            ``apply_chat_template_kwargs``.
    """

    def __init__(self, parquet_files, tokenizer, config=None):
        self.tokenizer = tokenizer
        self.max_length = int(config_get(config, "max_length", 1024))
        self.truncation = config_get(config, "truncation", "error")
        if self.truncation not in TRUNCATION_CHOICES:
            raise ValueError(
                f"data.truncation={self.truncation!r} is not allowed for SFT; choose one of {TRUNCATION_CHOICES}"
            )
        self.prompt_key = config_get(config, "prompt_key", "prompt")
        self.response_key = config_get(config, "response_key", "response")
        self.prompt_dict_keys = list(config_get(config, "prompt_dict_keys", []) or [])
        self.response_dict_keys = list(config_get(config, "response_dict_keys", []) or [])
        multiturn = config_get(config, "multiturn", {}) or {}
        self.multiturn = bool(config_get(multiturn, "enable", False))
        self.messages_key = config_get(multiturn, "messages_key", "messages")
        self.chat_template_kwargs = dict(config_get(config, "apply_chat_template_kwargs", {}) or {})
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token before building SFTDataset")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token; SFT appends eos after each response")
        self.rows, self.sources = read_rows(parquet_files)
        # Tokenise everything up front: rows are small, errors surface at construction time with their
        # file/row, and __getitem__ stays a cheap pad + tensor conversion.
        # stored as int32 / int8 arrays: Python lists cost ~36 bytes per token (one int object each)
        self._items = [
            (np.asarray(ids, dtype=np.int32), np.asarray(flags, dtype=np.int8))
            for ids, flags in (self._tokenize(row, src) for row, src in zip(self.rows, self.sources, strict=False))
        ]
        if self.truncation == "error":
            # fail now, naming the row, rather than when the loader reaches it mid-training
            for (ids, _), src in zip(self._items, self.sources, strict=False):
                if len(ids) > self.max_length:
                    raise ValueError(self._overlong_message(src, len(ids)))

    def __len__(self) -> int:
        return len(self._items)

    # ------------------------------------------------------------------------------------------------
    def _dig(self, row: dict, key: str, dict_keys: list[str], src: RowSource):
        if key not in row:
            raise KeyError(f"{src}: missing column {key!r}; columns present: {sorted(row)}")
        value = to_plain(row[key])
        path = key
        for k in dict_keys:
            if not isinstance(value, dict) or k not in value:
                raise KeyError(f"{src}: cannot find {k!r} inside {path!r} (got {type(value).__name__})")
            value, path = value[k], f"{path}.{k}"
        return value, path

    def _template(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, **self.chat_template_kwargs
        )
        # transformers 5 returns a BatchEncoding for tokenize=True; older versions a list of ids.
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    def _prompt_ids(self, prompt, src: RowSource, path: str) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer.chat_template is None:
                return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            return self._template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        messages = validate_messages(prompt, src, path)
        if self.tokenizer.chat_template is None:
            raise ValueError(f"{src}: column {path!r} holds chat messages but the tokenizer has no chat template")
        return self._template(messages, add_generation_prompt=True)

    def _tokenize(self, row: dict, src: RowSource) -> tuple[list[int], list[int]]:
        """Returns (token ids, per-token response flag) before padding/truncation."""
        if self.multiturn:
            return self._tokenize_conversation(row, src)
        prompt, ppath = self._dig(row, self.prompt_key, self.prompt_dict_keys, src)
        response, rpath = self._dig(row, self.response_key, self.response_dict_keys, src)
        if not isinstance(response, str):
            raise TypeError(f"{src}: column {rpath!r} must be a string response, got {type(response).__name__}")
        prompt_ids = self._prompt_ids(prompt, src, ppath)
        response_ids = self.tokenizer(response, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids)

    def _tokenize_conversation(self, row: dict, src: RowSource) -> tuple[list[int], list[int]]:
        if self.messages_key not in row:
            raise KeyError(f"{src}: missing column {self.messages_key!r}; columns present: {sorted(row)}")
        messages = validate_messages(row[self.messages_key], src, self.messages_key)
        if not any(m["role"] == "assistant" for m in messages):
            raise ValueError(f"{src}: conversation in {self.messages_key!r} has no assistant message to train on")
        ids: list[int] = []
        flags: list[int] = []
        # Render growing prefixes of the conversation; the tokens an assistant message adds are trained on.
        # This needs a prefix-stable chat template (true for common templates); checked below.
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                before = self._template(messages[:i], add_generation_prompt=True) if i else []
                _extend_checked(ids, flags, before, 0, src)
                _extend_checked(ids, flags, self._template(messages[: i + 1], add_generation_prompt=False), 1, src)
            else:
                _extend_checked(ids, flags, self._template(messages[: i + 1], add_generation_prompt=False), 0, src)
        return ids, flags

    def _overlong_message(self, src: RowSource, n: int) -> str:
        return (
            f"{src}: {n} tokens exceed data.max_length={self.max_length}; raise max_length "
            "or set data.truncation to 'left' or 'right'"
        )

    # ------------------------------------------------------------------------------------------------
    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids, flags = self._items[index]
        n = len(ids)
        if n > self.max_length:
            if self.truncation == "error":  # checked in __init__ already; kept in case truncation is changed later
                raise ValueError(self._overlong_message(self.sources[index], n))
            if self.truncation == "left":
                ids, flags = ids[-self.max_length :], flags[-self.max_length :]
            else:
                ids, flags = ids[: self.max_length], flags[: self.max_length]
            n = self.max_length
        input_ids = torch.full((self.max_length,), self.tokenizer.pad_token_id, dtype=torch.long)
        input_ids[:n] = torch.from_numpy(ids)
        attention_mask = torch.zeros(self.max_length, dtype=torch.long)
        attention_mask[:n] = 1
        position_ids = torch.zeros(self.max_length, dtype=torch.long)
        position_ids[:n] = torch.arange(n)
        response_flag = torch.zeros(self.max_length, dtype=torch.float32)
        response_flag[:n] = torch.from_numpy(flags)
        loss_mask = torch.zeros(self.max_length, dtype=torch.float32)
        loss_mask[:-1] = response_flag[1:]
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "loss_mask": loss_mask,
        }


def _extend_checked(ids: list[int], flags: list[int], rendered: list[int], flag: int, src: RowSource) -> None:
    """Append the part of ``rendered`` that goes beyond ``ids``; ``rendered`` must start with ``ids``."""
    if rendered[: len(ids)] != ids:
        raise ValueError(
            f"{src}: the chat template is not prefix-stable (rendering more messages changed earlier tokens), "
            "so per-message loss masks cannot be derived; use single-turn prompt/response columns instead"
        )
    new = rendered[len(ids) :]
    ids.extend(new)
    flags.extend([flag] * len(new))
