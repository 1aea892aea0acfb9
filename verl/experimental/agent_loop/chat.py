"""Chat-template rendering for token-in/token-out trajectories.

A trajectory is never re-encoded as a whole. Its ids are: the prompt render, then for each turn the
ids the policy generated, then the ids of the tool/user messages that follow, obtained as a render
*diff*: render(base + new messages, generation prompt) minus render(base), where `base` is a fixed
two-message conversation ending with an assistant message. The diff starts right after the base's
end-of-turn token, so template text placed after it (Qwen's newline after ``<|im_end|>``) belongs to
the observation segment and the trajectory equals a full render of the conversation.

`sanity_check` compares the trajectory with one full `apply_chat_template` render
(`multi_turn.tokenization_sanity_check_mode`: `strict` = equal ids, `ignore_strippable` = equal text
up to whitespace, `disable`).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

__all__ = ["ChatRenderer", "SANITY_CHECK_MODES"]

SANITY_CHECK_MODES = ("disable", "strict", "ignore_strippable")
MAX_WARNINGS = 3  # distinct mismatches logged per renderer; every mismatch is counted in the metrics
_MARK = "@@verl-assistant@@"
_BASE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}]


class ChatRenderer:
    """Renders with one tokenizer's chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        tools: OpenAI tool schemas passed to the template as `tools=` (None: not passed).
        chat_template_kwargs: extra template kwargs (`data.apply_chat_template_kwargs`).
    """

    def __init__(self, tokenizer, tools: list[dict] | None = None, chat_template_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.kwargs = dict(chat_template_kwargs or {})
        self._warned: set[str] = set()

    def text(self, messages: list[dict], add_generation_prompt: bool) -> str:
        kw = dict(self.kwargs)
        if self.tools:
            kw["tools"] = self.tools
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False, **kw
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.encode(self.text(messages, add_generation_prompt=True))

    def observation_ids(self, messages: list[dict]) -> list[int]:
        """Ids of `messages` (tool / user) appended after an assistant turn, generation prompt of the
        next assistant turn included."""
        base = self.text(_BASE, add_generation_prompt=False)
        full = self.text(_BASE + list(messages), add_generation_prompt=True)
        if not full.startswith(base):
            raise ValueError(
                "the chat template does not render a conversation as a prefix of its continuation, so observation "
                "tokens cannot be appended without re-encoding; use a prefix-stable template "
                "(model.custom_chat_template) or multi_turn.use_inference_chat_template=False"
            )
        cut = len(base)
        eos = getattr(self.tokenizer, "eos_token", None)
        if eos:
            at = base.rfind(eos)
            mark = base.rfind(_MARK)
            if mark >= 0 and at >= mark + len(_MARK):
                cut = at + len(eos)
        return self.encode(full[cut:])

    # ------------------------------------------------------------------ sanity check
    def reference_ids(self, messages: list[dict], ended_with_eos: bool, last_generated: list[int] | None) -> list[int]:
        """Full render of the conversation `messages` (the last one the final assistant turn). A final
        turn cut without its end-of-turn token is the render up to its generation prompt + its ids."""
        if ended_with_eos or not last_generated:
            return self.encode(self.text(messages, add_generation_prompt=False))
        return self.encode(self.text(messages[:-1], add_generation_prompt=True)) + list(last_generated)

    def sanity_check(self, mode: str, ids: list[int], reference: list[int]) -> bool:
        """True when `ids` matches `reference` under `mode` (always True for `disable`); the first
        `MAX_WARNINGS` distinct mismatches are logged. A policy that generates ids which do not
        decode-encode back to themselves (invalid UTF-8 from a byte-level tokenizer, unusual token
        splits) mismatches by nature: the trajectory keeps the generated ids, which is correct."""
        if mode == "disable":
            return True
        if mode == "strict":
            ok = list(ids) == list(reference)
        elif mode == "ignore_strippable":
            a = self.tokenizer.decode(ids, skip_special_tokens=False)
            b = self.tokenizer.decode(reference, skip_special_tokens=False)
            ok = "".join(a.split()) == "".join(b.split())
        else:
            raise ValueError(
                f"multi_turn.tokenization_sanity_check_mode={mode!r}; expected one of {list(SANITY_CHECK_MODES)}"
            )
        if not ok:
            first = next(
                (i for i, (x, y) in enumerate(zip(ids, reference, strict=False)) if x != y),
                min(len(ids), len(reference)),
            )
            key = repr(reference[max(0, first - 2) : first + 2])
            if key not in self._warned and len(self._warned) < MAX_WARNINGS:
                self._warned.add(key)
                logger.warning(
                    "tokenization sanity check (%s) failed: trajectory of %d ids differs from the full "
                    "chat-template render of %d ids "
                    "at position %d (trajectory %r vs render %r)",
                    mode,
                    len(ids),
                    len(reference),
                    first,
                    self.tokenizer.decode(ids[first : first + 8]),
                    self.tokenizer.decode(reference[first : first + 8]),
                )
                if len(self._warned) == MAX_WARNINGS:
                    logger.warning(
                        "further tokenization mismatches are only counted (agent/tokenization_mismatch_rate)"
                    )
        return ok
