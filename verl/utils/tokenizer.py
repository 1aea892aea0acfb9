"""Loading tokenizers and processors (upstream names `hf_tokenizer`, `hf_processor`)."""

from __future__ import annotations

import logging
import warnings

__all__ = ["hf_tokenizer", "hf_processor", "set_pad_token_id"]

logger = logging.getLogger(__name__)


def set_pad_token_id(tokenizer) -> None:
    """Give `tokenizer` a pad token when it has none: the eos token (a common convention).

    Padding positions are always masked out (attention and loss masks), so reusing eos as pad is
    safe; generation finds the first *generated* eos, never a pad. Warns when it changes anything.
    """
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has neither a pad nor an eos token; set one")
        tokenizer.pad_token = tokenizer.eos_token
        warnings.warn(
            f"tokenizer has no pad token; using eos {tokenizer.eos_token!r} (id {tokenizer.eos_token_id})", stacklevel=2
        )


def hf_tokenizer(
    name_or_path: str,
    correct_pad_token: bool = True,
    correct_gemma2: bool = True,
    chat_template: str | None = None,
    **kwargs,
):
    """`AutoTokenizer.from_pretrained(name_or_path, **kwargs)` with a pad token guaranteed.

    Args:
        name_or_path: a local directory or hub name.
        correct_pad_token: set pad = eos when the tokenizer has no pad token.
        correct_gemma2: Gemma-2's eos is `<end_of_turn>` for chat; use it (as upstream does).
        chat_template: a jinja chat template replacing the tokenizer's (`model.custom_chat_template`).
        kwargs: forwarded (e.g. `trust_remote_code`).
    """
    from transformers import AutoTokenizer

    if name_or_path is None:
        raise ValueError("hf_tokenizer: name_or_path is None; give a model directory or hub name")
    if correct_gemma2 and isinstance(name_or_path, str) and "gemma-2-2b-it" in name_or_path:
        kwargs.setdefault("eos_token", "<end_of_turn>")
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    if chat_template:
        tokenizer.chat_template = chat_template
    if correct_pad_token:
        set_pad_token_id(tokenizer)
    return tokenizer


def hf_processor(name_or_path: str, **kwargs):
    """The multimodal processor of `name_or_path`, or None for a text-only model.

    `AutoProcessor` falls back to returning a bare tokenizer for text-only models; that case (and a
    failure to build a processor at all) returns None, so callers can write
    `processor = hf_processor(path)` and branch on `processor is not None`.
    """
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any failure means "no processor"; the reason is logged
        logger.debug("no processor for %s: %s", name_or_path, exc)
        return None
    # a processor wraps a tokenizer; a tokenizer alone is not a processor
    if processor is None or "Processor" not in type(processor).__name__:
        return None
    return processor


def normalize_token_ids(tokenized_output) -> list[int]:
    """A flat `list[int]` from whatever a tokenizer call returned: a list, a tensor or array, a
    `BatchEncoding`/dict with `input_ids`, or a batch of one (transformers 4 and 5 differ in what
    `apply_chat_template(tokenize=True)` returns). Raises TypeError naming the bad element."""
    ids = tokenized_output
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"] if isinstance(ids, dict) else ids.input_ids
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if isinstance(ids, tuple):
        ids = list(ids)
    if isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], (list, tuple)):
        ids = list(ids[0])  # a batch holding one sequence
    if not isinstance(ids, list):
        raise TypeError(f"token ids must be a list of integers, got {type(ids).__name__}: {ids!r}")
    out = []
    for position, token in enumerate(ids):
        token = token.item() if hasattr(token, "item") else token
        if isinstance(token, bool) or not isinstance(token, (int, float)) or int(token) != token:
            raise TypeError(f"token id at position {position} is not an integer: {type(token).__name__} {token!r}")
        out.append(int(token))
    return out
