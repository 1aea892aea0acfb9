"""The dataset of `verl.trainer.sft_trainer`: chat conversations (upstream's `MultiTurnSFTDataset`).

A row is a conversation in the `messages_key` column (default `messages`): a list of
`{"role", "content"}` dicts (roles system, user, assistant, tool; an assistant message may carry
`tool_calls` and an empty content). Optional columns: `tools_key` (default `tools`; the tool
schemas given to the chat template) and `enable_thinking_key` (default `enable_thinking`; passed to
the template, `enable_thinking_default` when the column is absent; `none` passes nothing).

Single-turn rows are accepted too: a row without the messages column but with `prompt_key`
(default `prompt`: a string, sent as one user message, or a list of messages) and `response_key`
(default `response`: the assistant's answer) is the conversation prompt + one assistant message.

Masking (upstream's): the loss covers the tokens of every assistant message (its content, tool
calls and end-of-turn tokens) and nothing else: not the system/user/tool turns, not the
generation prompt (`<|im_start|>assistant\\n`) that opens an assistant turn. The tokens of message
i are what rendering the first i + 1 messages adds to rendering the first i (for an assistant
message: with the generation prompt, which is then not trained on). The concatenation must equal
the template applied to the whole conversation; a template for which it does not (Qwen3's thinking
templates rewrite earlier turns) fails naming the row, unless `ignore_input_ids_mismatch=True`
(then the concatenated tokens are used, as upstream does).

Each item: `input_ids` [n] (long), `loss_mask` [n] (float; `loss_mask[t] = 1` iff token t is
trained, upstream's convention for this dataset: the logits at t - 1 predict it), `position_ids`
[n]. `pad_mode=no_padding` (default) gives the n tokens of the row; `pad_mode=right` pads every
row to `max_length` (pad token, mask 0) and adds `attention_mask`. Rows longer than `max_length`
fail at construction naming the row (`truncation=error`), or are cut on the left or right.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import torch
from torch.utils.data import Dataset

from verl.utils.dataset.files import RowSource, read_rows, to_plain
from verl.utils.py_functional import config_get

logger = logging.getLogger(__name__)

__all__ = ["MultiTurnSFTDataset", "collate_sft_rows"]

TRUNCATION_CHOICES = ("error", "left", "right")
PAD_MODES = ("no_padding", "right")
ROLES = ("system", "user", "assistant", "tool")


def _thinking_default(value):
    """`enable_thinking_default`: none/null -> None (nothing passed), else a bool."""
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
        return None
    if isinstance(value, str):
        if value.lower() not in ("true", "false"):
            raise ValueError(f"data.enable_thinking_default={value!r} must be none, true or false")
        return value.lower() == "true"
    return bool(value)


class MultiTurnSFTDataset(Dataset):
    """See the module docstring.

    Args:
        parquet_files: parquet or jsonl path(s).
        tokenizer: a Hugging Face tokenizer with a chat template, a pad and an eos token.
        config: the `data` section (keys: `messages_key`, `tools_key`, `enable_thinking_key`,
            `enable_thinking_default`, `prompt_key`, `response_key`, `pad_mode`, `max_length`,
            `truncation`, `apply_chat_template_kwargs`, `ignore_input_ids_mismatch`).
        processor: multimodal processor; not supported (must be None).
        max_samples: keep the first `max_samples` rows (-1: all).
    """

    def __init__(self, parquet_files, tokenizer, config=None, processor=None, max_samples: int = -1):
        if processor is not None:
            raise NotImplementedError("MultiTurnSFTDataset: multimodal (image/video) SFT is not available here")
        self.tokenizer = tokenizer
        self.max_length = int(config_get(config, "max_length", 1024))
        self.truncation = config_get(config, "truncation", "error")
        if self.truncation not in TRUNCATION_CHOICES:
            raise ValueError(f"data.truncation={self.truncation!r} is not allowed; choose one of {TRUNCATION_CHOICES}")
        self.pad_mode = config_get(config, "pad_mode", "no_padding")
        if self.pad_mode not in PAD_MODES:
            raise ValueError(f"data.pad_mode={self.pad_mode!r} is not allowed; choose one of {PAD_MODES}")
        self.messages_key = config_get(config, "messages_key", "messages")
        self.tools_key = config_get(config, "tools_key", "tools")
        self.thinking_key = config_get(config, "enable_thinking_key", "enable_thinking")
        self.thinking_default = _thinking_default(config_get(config, "enable_thinking_default", None))
        self.prompt_key = config_get(config, "prompt_key", "prompt")
        self.response_key = config_get(config, "response_key", "response")
        self.ignore_mismatch = bool(config_get(config, "ignore_input_ids_mismatch", False))
        self.template_kwargs = dict(to_plain(config_get(config, "apply_chat_template_kwargs", {}) or {}))
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token before building the dataset")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("MultiTurnSFTDataset needs a tokenizer with a chat template (model.custom_chat_template)")
        rows, sources = read_rows(parquet_files)
        if max_samples is not None and 0 < int(max_samples) < len(rows):
            rows, sources = rows[: int(max_samples)], sources[: int(max_samples)]
        self.sources = sources
        self._mismatch_warned = False
        # tokenised up front (stored as int32 / int8): a bad row fails now, naming its file and row
        self._items = [self._tokenize(row, src) for row, src in zip(rows, sources, strict=True)]
        if self.truncation == "error":
            for (ids, _), src in zip(self._items, sources, strict=True):
                if len(ids) > self.max_length:
                    raise ValueError(
                        f"{src}: {len(ids)} tokens exceed data.max_length={self.max_length}; raise max_length "
                        "or set data.truncation to 'left' or 'right'"
                    )

    def __len__(self) -> int:
        return len(self._items)

    def num_tokens(self, index: int) -> int:
        return min(len(self._items[index][0]), self.max_length)

    # ------------------------------------------------------------------------------------------------
    def _conversation(self, row: dict, src: RowSource) -> list[dict]:
        if self.messages_key in row:
            messages = to_plain(row[self.messages_key])
            where = self.messages_key
        elif self.prompt_key in row and self.response_key in row:
            prompt, response = to_plain(row[self.prompt_key]), to_plain(row[self.response_key])
            if not isinstance(response, str):
                raise TypeError(f"{src}: column {self.response_key!r} must be a string, got {type(response).__name__}")
            prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            messages = list(prompt or []) + [{"role": "assistant", "content": response}]
            where = f"{self.prompt_key}+{self.response_key}"
        else:
            raise KeyError(
                f"{src}: no column {self.messages_key!r} (data.messages_key) and no {self.prompt_key!r} + "
                f"{self.response_key!r} pair (data.prompt_key / data.response_key); columns present: {sorted(row)}"
            )
        return _checked_messages(messages, src, where)

    def _row_kwargs(self, row: dict, src: RowSource) -> dict:
        kwargs = dict(self.template_kwargs)
        tools = to_plain(row.get(self.tools_key)) if self.tools_key in row else None
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except ValueError as exc:
                raise ValueError(f"{src}: column {self.tools_key!r} is a string but not JSON ({exc})") from exc
        if tools:
            kwargs["tools"] = tools
        thinking = row.get(self.thinking_key, self.thinking_default) if self.thinking_key else self.thinking_default
        if thinking is not None:
            kwargs["enable_thinking"] = bool(thinking)
        return kwargs

    def _render(self, messages: list[dict], add_generation_prompt: bool, kwargs: dict) -> list[int]:
        if not messages:
            return []
        out = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, **kwargs
        )
        # transformers 5 returns a BatchEncoding for tokenize=True; older versions a list of ids
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    def _tokenize(self, row: dict, src: RowSource) -> tuple[np.ndarray, np.ndarray]:
        """(token ids [n] int32, trained flags [n] int8) of one row, before truncation."""
        messages = self._conversation(row, src)
        kwargs = self._row_kwargs(row, src)
        ids: list[int] = []
        flags: list[int] = []
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                self._append(ids, flags, self._render(messages[:i], True, kwargs), 0, src)
                self._append(ids, flags, self._render(messages[: i + 1], False, kwargs), 1, src)
            else:
                self._append(ids, flags, self._render(messages[: i + 1], False, kwargs), 0, src)
        if not any(flags):
            raise ValueError(f"{src}: the conversation has no assistant tokens to train on")
        return np.asarray(ids, dtype=np.int32), np.asarray(flags, dtype=np.int8)

    def _append(self, ids: list[int], flags: list[int], rendered: list[int], flag: int, src: RowSource) -> None:
        """Append what `rendered` adds to `ids` (it must start with `ids`: a prefix-stable template)."""
        if rendered[: len(ids)] != ids:
            if not self.ignore_mismatch:
                raise ValueError(
                    f"{src}: the chat template renders earlier turns differently once later turns are added, so "
                    "the per-turn tokens differ from the whole conversation's; set data.ignore_input_ids_mismatch="
                    "True to train on the concatenated per-turn tokens"
                )
            if not self._mismatch_warned:
                logger.warning("%s: chat template is not prefix-stable; using the concatenated per-turn tokens", src)
                self._mismatch_warned = True
            rendered = ids + rendered[_common_prefix(ids, rendered) :]
        new = rendered[len(ids) :]
        ids.extend(new)
        flags.extend([flag] * len(new))

    # ------------------------------------------------------------------------------------------------
    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids, flags = self._items[index]
        if len(ids) > self.max_length:
            keep = slice(-self.max_length, None) if self.truncation == "left" else slice(0, self.max_length)
            ids, flags = ids[keep], flags[keep]
        n = len(ids)
        item = {
            "input_ids": torch.from_numpy(ids.astype(np.int64)),
            "loss_mask": torch.from_numpy(flags.astype(np.float32)),
            "position_ids": torch.arange(n),
        }
        if self.pad_mode == "right":
            pad = self.max_length - n
            item = {
                "input_ids": torch.nn.functional.pad(item["input_ids"], (0, pad), value=self.tokenizer.pad_token_id),
                "loss_mask": torch.nn.functional.pad(item["loss_mask"], (0, pad)),
                "position_ids": torch.nn.functional.pad(item["position_ids"], (0, pad)),
                "attention_mask": torch.cat([torch.ones(n, dtype=torch.long), torch.zeros(pad, dtype=torch.long)]),
            }
        return item


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _checked_messages(messages, src: RowSource, key: str) -> list[dict]:
    """A list of messages with known roles; content a string (None or absent is allowed for an
    assistant message with `tool_calls`, and becomes "")."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"{src}: column {key!r} must be a non-empty list of chat messages, got {messages!r:.120}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"{src}: column {key!r} message {i} must be a dict with role in {ROLES}, got {m!r:.120}")
        m = {k: v for k, v in m.items() if v is not None}
        if m["role"] == "assistant" and m.get("tool_calls") and not m.get("content"):
            m["content"] = ""
        if not isinstance(m.get("content"), str):
            raise ValueError(f"{src}: column {key!r} message {i} has no string 'content', got {m!r:.120}")
        out.append(m)
    return out


def collate_sft_rows(items: list[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of dataset items to the longest one: `input_ids`, `position_ids`,
    `attention_mask` (1 on tokens), `loss_mask` [b, T] with T = the longest row of the batch
    (padding is removed again inside the forward; see `verl.workers.engine.padding_free`)."""
    lengths = [int(it["attention_mask"].sum()) if "attention_mask" in it else len(it["input_ids"]) for it in items]
    width = max(max(lengths), 1)
    out = {
        "input_ids": torch.full((len(items), width), int(pad_token_id), dtype=torch.long),
        "position_ids": torch.zeros((len(items), width), dtype=torch.long),
        "attention_mask": torch.zeros((len(items), width), dtype=torch.long),
        "loss_mask": torch.zeros((len(items), width), dtype=torch.float32),
    }
    for row, (item, n) in enumerate(zip(items, lengths, strict=True)):
        out["input_ids"][row, :n] = item["input_ids"][:n]
        out["position_ids"][row, :n] = item["position_ids"][:n]
        out["attention_mask"][row, :n] = 1
        out["loss_mask"][row, :n] = item["loss_mask"][:n]
    return out
