"""`DataParallelRewardModel`: scores responses with a sequence-classification reward model.

The score of a sequence is the model's head output at the *last valid token* of the sequence
(prompt + response up to and including EOS), read from the per-token head output (a forward hook
on the classification head), never from the model's own pooling, which guesses the last token from
`pad_token_id` and is wrong when pad == eos or with left padding. The score is written at the last
valid response position of `rm_scores` [b, R] (zeros elsewhere), like a rule-based reward.

When the reward model's tokenizer differs from the policy's (`reward_model.model.input_tokenizer`),
each response is decoded with the policy tokenizer, appended to the original chat
(`non_tensor_batch["raw_prompt"]`, from `data.return_raw_chat=True`) as an assistant message,
re-rendered with the reward model's chat template and re-tokenized; a sequence longer than
`reward_model.max_length` (default: the policy batch's width) loses its beginning, never the
response end where the score is read (a warning counts them).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from tensordict import TensorDict

from verl.utils.fsdp_utils import autocast_context
from verl.utils.model import compute_position_id_with_mask
from verl.workers.engine.dp_engine import DataParallelEngine
from verl.workers.engine.padding_free import compact_rows

__all__ = ["DataParallelRewardModel", "find_score_head"]

logger = logging.getLogger(__name__)


def find_score_head(model: torch.nn.Module) -> torch.nn.Module:
    """The classification head of a transformers sequence-classification model."""
    for name in ("score", "classifier", "v_head"):
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Module):
            return head
    raise ValueError(
        f"cannot find the classification head of {type(model).__name__} (looked for .score, .classifier, .v_head)"
    )


class DataParallelRewardModel:
    """Reward-model engine.

    Args:
        config: `RewardModelConfig`.
        reward_module: `AutoModelForSequenceClassification` (num_labels=1), FSDP2 or plain.
        rm_tokenizer: the reward model's tokenizer (used when re-templating).
        input_tokenizer: the policy's tokenizer when it differs from `rm_tokenizer`, else None.
        compute_dtype, use_remove_padding: as the actor's.
    """

    def __init__(
        self,
        config,
        reward_module,
        rm_tokenizer=None,
        input_tokenizer=None,
        compute_dtype=None,
        use_remove_padding: bool = True,
    ):
        self.config = config
        self.reward_module = reward_module
        self.rm_tokenizer = rm_tokenizer
        self.input_tokenizer = input_tokenizer
        self.compute_dtype = compute_dtype
        self.use_remove_padding = use_remove_padding
        self.head = find_score_head(reward_module)
        # the default process group: the reward model is sharded over the whole worker group
        self.engine = DataParallelEngine(reward_module, use_remove_padding=use_remove_padding)

    @property
    def _device(self) -> torch.device:
        return next(self.reward_module.parameters()).device

    def _last_token_scores(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        """[m] head output at each row's last attended token."""
        device = self._device
        input_ids, attention_mask, position_ids = (
            input_ids.to(device),
            attention_mask.to(device),
            position_ids.to(device),
        )
        captured = {}

        def hook(_module, _inputs, output):
            captured["per_token"] = output

        handle = self.head.register_forward_hook(hook)
        device_type = "cuda" if device.type == "cuda" else "cpu"
        pad_id = getattr(self.reward_module.config, "pad_token_id", None) or 0
        try:
            with autocast_context(device_type, self.compute_dtype):
                if self.use_remove_padding:
                    packed = compact_rows(input_ids, attention_mask, position_ids, pad_id)
                    self.reward_module(
                        input_ids=packed.input_ids,
                        attention_mask=packed.attention_mask,
                        position_ids=packed.position_ids,
                    )
                    last = (packed.lengths - 1).clamp(min=0)
                else:
                    self.reward_module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
                    cols = torch.arange(attention_mask.shape[1], device=device)
                    last = (attention_mask.bool() * cols).max(dim=1).values
        finally:
            handle.remove()
        per_token = captured["per_token"][..., 0].float()  # [m, T]
        return per_token.gather(1, last.unsqueeze(1)).squeeze(1)

    def _retemplate(self, data):
        """Inputs re-tokenized for the reward model (see module docstring)."""
        raw = data.non_tensor_batch.get("raw_prompt")
        if raw is None:
            raise KeyError(
                "the reward model's tokenizer differs from the policy's, so responses are re-rendered with the reward "
                "model's chat template; that needs the original chat: set data.return_raw_chat=True "
                "(non_tensor_batch['raw_prompt'])"
            )
        responses = data.batch["responses"]
        resp_mask = (
            data.batch["response_mask"]
            if "response_mask" in data.batch.keys()
            else data.batch["attention_mask"][:, -responses.shape[1] :]
        )
        texts = []
        for i in range(responses.shape[0]):
            ids = responses[i][resp_mask[i].bool()].tolist()
            answer = self.input_tokenizer.decode(ids, skip_special_tokens=True)
            chat = list(raw[i].tolist() if isinstance(raw[i], np.ndarray) else raw[i]) + [
                {"role": "assistant", "content": answer}
            ]
            texts.append(self.rm_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False))
        max_length = int(self.config.max_length or data.batch["input_ids"].shape[1])
        rows = self.rm_tokenizer(texts, add_special_tokens=False)["input_ids"]
        truncated = sum(len(r) > max_length for r in rows)
        if truncated:
            # the score is read at the last token: keep the end of the conversation, drop its start
            logger.warning(
                "reward model: %d of %d re-templated sequences exceed reward_model.max_length=%d tokens; "
                "their beginning is cut",
                truncated,
                len(rows),
                max_length,
            )
        rows = [r[-max_length:] for r in rows]
        width = max(len(r) for r in rows)
        pad_id = self.rm_tokenizer.pad_token_id or 0
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):  # left padding
            if r:
                input_ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
                mask[i, width - len(r) :] = 1
        return input_ids, mask, compute_position_id_with_mask(mask)

    @torch.no_grad()
    def compute_rm_score(self, data) -> torch.Tensor:
        """`rm_scores` [b, R]: the sequence score at the last valid response token, 0 elsewhere."""
        responses = data.batch["responses"]
        resp_len = responses.shape[1]
        if self.input_tokenizer is not None:
            input_ids, attention_mask, position_ids = self._retemplate(data)
        else:
            input_ids, attention_mask, position_ids = (
                data.batch["input_ids"],
                data.batch["attention_mask"],
                data.batch["position_ids"],
            )
        n = attention_mask.shape[0]
        inputs = TensorDict(
            {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}, batch_size=[n]
        )

        def score(micro):
            scores = self._last_token_scores(micro["input_ids"], micro["attention_mask"], micro["position_ids"])
            return {"scores": scores}, (0, 0)

        scores = self.engine.infer(
            inputs,
            score,
            self.config.micro_batch_size_per_gpu,
            self.config.use_dynamic_bsz,
            self.config.forward_max_token_len_per_gpu,
        ).outputs["scores"]
        resp_mask = (
            data.batch["response_mask"]
            if "response_mask" in data.batch.keys()
            else data.batch["attention_mask"][:, -resp_len:]
        )
        last = (resp_mask.bool() * torch.arange(resp_len)).max(dim=1).values
        has_response = resp_mask.bool().any(dim=1)
        rm_scores = torch.zeros((n, resp_len), dtype=torch.float32)
        rows = torch.arange(n)
        rm_scores[rows[has_response], last[has_response]] = scores[has_response]
        return rm_scores
