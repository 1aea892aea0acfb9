"""Small tensor helpers shared by the algorithms, the actor/critic engines and the datasets.

Conventions: `mask` tensors are 0/1 (any dtype, bool included) with the shape of the values they
select; a masked-out value never influences a result, even when it is NaN or inf (selection uses
`torch.where`, not multiplication). Every division by a count is guarded so that an all-zero mask
gives a finite result (0 for sums and means) instead of NaN.

Public names follow upstream verl (`verl.utils.torch_functional`, imported as `verl_F`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "clip_by_value",
    "logprobs_from_logits",
    "logprobs_from_logits_naive",
    "entropy_from_logits",
    "entropy_from_logits_with_chunking",
    "get_response_mask",
    "get_eos_mask",
    "explained_variance",
    "pad_sequence_to_length",
    "pad_2d_list_to_length",
    "postprocess_data",
    "tokenize_and_postprocess_data",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
]

# Largest number of logits elements processed at once by the memory-aware log-prob / entropy
# functions (64 Mi elements = 256 MiB in fp32). Larger inputs are processed in row chunks so the
# temporary [rows, vocab] buffers of logsumexp / softmax never exceed this.
_MAX_CHUNK_ELEMENTS = 1 << 26


# ---------------------------------------------------------------------------------------------
# masked statistics
# ---------------------------------------------------------------------------------------------


def _select(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`values` where mask is set, else 0 (NaN/inf under the mask never leak)."""
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is set; over all elements (`axis=None`) or along `axis`."""
    selected = _select(values, mask)
    return selected.sum() if axis is None else selected.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is set.

    Args:
        values: any shape.
        mask: same shape as `values` (broadcastable), 0/1 or bool.
        axis: None for one scalar over everything, or the dimension to reduce.
    Returns:
        0-d tensor (axis None) or the reduced tensor. Rows/batches with no selected element give 0.
    """
    weights = mask.to(values.dtype)
    count = weights.sum() if axis is None else weights.sum(dim=axis)
    return masked_sum(values, mask, axis) / count.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the selected elements (one scalar over all selected positions).

    `unbiased=True` applies Bessel's correction n/(n-1). With fewer than two selected elements the
    variance is defined as 0 (no spread can be measured) rather than NaN.
    """
    mean = masked_mean(values, mask)
    centered = values - mean
    n = mask.to(values.dtype).sum()
    var = masked_sum(centered * centered, mask) / n.clamp(min=1)
    if unbiased:
        # n/(n-1) for n >= 2; for n < 2 the sum above is 0 anyway, keep the factor finite
        var = var * (n / (n - 1).clamp(min=1))
    return var


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Standardise `values` with the mean and (unbiased) variance of the selected elements.

    `(values - mean) / sqrt(var + eps)`; with `shift_mean=False` the mean is added back
    (only the scale changes). Positions outside the mask are transformed too (same affine map) but
    never contribute to the statistics; callers multiply by the mask when they need zeros there.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(returns - values) / Var(returns) over the selected tokens (critic quality metric).

    Returns 0-d tensor; 0 when the returns have no variance (nothing to explain).
    """
    var_returns = masked_var(returns, mask, unbiased=False)
    var_resid = masked_var(returns - values, mask, unbiased=False)
    # no host sync: select 0 where the returns are constant
    safe = torch.where(var_returns > 0, var_returns, torch.ones_like(var_returns))
    return torch.where(var_returns > 0, 1.0 - var_resid / safe, torch.zeros_like(var_returns))


def clip_by_value(x: torch.Tensor, tensor_min, tensor_max) -> torch.Tensor:
    """Elementwise clamp with tensor (or scalar) bounds: `min(max(x, tensor_min), tensor_max)`."""
    if not torch.is_tensor(tensor_min):
        tensor_min = torch.as_tensor(tensor_min, dtype=x.dtype, device=x.device)
    if not torch.is_tensor(tensor_max):
        tensor_max = torch.as_tensor(tensor_max, dtype=x.dtype, device=x.device)
    return torch.minimum(torch.maximum(x, tensor_min), tensor_max)


# ---------------------------------------------------------------------------------------------
# log-probabilities and entropy from logits
# ---------------------------------------------------------------------------------------------


def _rows_per_chunk(vocab: int, max_elements: int = _MAX_CHUNK_ELEMENTS) -> int:
    return max(1, max_elements // max(1, vocab))


def _logprobs_chunk(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # compute in at least fp32: bf16 logsumexp over a large vocabulary loses several digits
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True, chunk_rows: int | None = None
) -> torch.Tensor:
    """Log-probability of `labels` under softmax(`logits`), memory-aware.

    Computed as `logits[label] - logsumexp(logits)`, which never materialises the full
    log-softmax tensor. Inputs larger than 64 Mi logits are processed in row chunks so that the
    temporaries stay bounded; bf16/fp16 logits are upcast to fp32 per chunk (the result is fp32).

    Args:
        logits: [..., V] float.
        labels: [...] int64 token ids (same leading shape as logits).
        inplace_backward: accepted for upstream compatibility (flash-attn kernel switch); unused.
        chunk_rows: rows per chunk override (for tests); default from the element budget.
    Returns:
        [...] log-probabilities (fp32 for half-precision inputs, else the logits dtype).
    """
    del inplace_backward
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logprobs_from_logits: logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree")
    lead_shape = labels.shape
    vocab = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)
    flat_labels = labels.reshape(-1).long()
    rows = flat_logits.shape[0]
    step = chunk_rows or _rows_per_chunk(vocab)
    if rows <= step:
        out = _logprobs_chunk(flat_logits, flat_labels)
    else:
        out = torch.cat(
            [_logprobs_chunk(flat_logits[i : i + step], flat_labels[i : i + step]) for i in range(0, rows, step)]
        )
    return out.reshape(lead_shape)


def logprobs_from_logits_naive(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Reference implementation (full log_softmax then gather); for tests and small inputs."""
    logp = F.log_softmax(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits, dim=-1)
    return torch.gather(logp, -1, labels.long().unsqueeze(-1)).squeeze(-1)


def _entropy_chunk(logits: torch.Tensor) -> torch.Tensor:
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Categorical entropy `H = logsumexp(z) - sum softmax(z) * z` per position: [..., V] -> [...]."""
    return _entropy_chunk(logits)


def entropy_from_logits_with_chunking(logits: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """Same as `entropy_from_logits`, processing `chunk_size` rows at a time to bound the
    temporary softmax buffers (used when `actor.entropy_from_logits_with_chunking=True`).
    Differentiable; half-precision logits are upcast per chunk (fp32 result)."""
    if chunk_size < 1:
        raise ValueError(f"entropy_from_logits_with_chunking: chunk_size={chunk_size} must be >= 1")
    lead_shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.shape[0] <= chunk_size:
        return _entropy_chunk(flat).reshape(lead_shape)
    parts = [_entropy_chunk(flat[i : i + chunk_size]) for i in range(0, flat.shape[0], chunk_size)]
    return torch.cat(parts).reshape(lead_shape)


# ---------------------------------------------------------------------------------------------
# masks and padding
# ---------------------------------------------------------------------------------------------


def get_response_mask(response_id: torch.Tensor, eos_token: int | Sequence[int] = 2, dtype=torch.int64) -> torch.Tensor:
    """Mask of the generated tokens that count: 1 up to and including the first EOS, 0 after.

    Args:
        response_id: [B, L] generated token ids (right-padded).
        eos_token: one id or a list of ids that end a response.
        dtype: dtype of the returned mask.
    Returns:
        [B, L] mask. A row without EOS is all ones (truncated response).
    """
    eos = torch.as_tensor(eos_token if isinstance(eos_token, (list, tuple)) else [eos_token], device=response_id.device)
    is_eos = torch.isin(response_id, eos).to(torch.int64)
    # number of EOS strictly before each position; a position counts while none came before it
    eos_before = is_eos.cumsum(dim=1) - is_eos
    return eos_before.eq(0).to(dtype)


def get_eos_mask(response_id: torch.Tensor, eos_token: int | Sequence[int] = 2, dtype=torch.int64) -> torch.Tensor:
    """Older upstream name of `get_response_mask`."""
    return get_response_mask(response_id, eos_token, dtype)


def pad_sequence_to_length(tensors: torch.Tensor, max_seq_len: int, pad_token_id, left_pad: bool = False) -> torch.Tensor:
    """Pad the last dimension of a [B, S] tensor to `max_seq_len` (no-op when already that long)."""
    if tensors.shape[-1] >= max_seq_len:
        return tensors
    pad = (max_seq_len - tensors.shape[-1], 0) if left_pad else (0, max_seq_len - tensors.shape[-1])
    return F.pad(tensors, pad, "constant", pad_token_id)


def pad_2d_list_to_length(response: list[list[int]], pad_token_id, max_length: int | None = None) -> torch.Tensor:
    """Right-pad a list of token-id lists into a [B, max(len, max_length)] tensor."""
    longest = max((len(r) for r in response), default=0)
    target = max(longest, max_length or 0)
    return torch.tensor([list(r) + [pad_token_id] * (target - len(r)) for r in response])


def postprocess_data(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_length: int,
    pad_token_id: int,
    left_pad: bool = True,
    truncation: str = "error",
):
    """Pad or truncate tokenised prompts ([1, S] or [B, S]) to exactly `max_length`.

    `truncation`: `left` keeps the last tokens, `right` the first, `middle` both ends, `error`
    raises naming the lengths.
    """
    if truncation not in ("left", "right", "middle", "error"):
        raise ValueError(f"truncation={truncation!r}; expected one of ['left', 'right', 'middle', 'error']")
    seq_len = input_ids.shape[-1]
    if seq_len < max_length:
        input_ids = pad_sequence_to_length(input_ids, max_length, pad_token_id, left_pad=left_pad)
        attention_mask = pad_sequence_to_length(attention_mask, max_length, 0, left_pad=left_pad)
    elif seq_len > max_length:
        if truncation == "left":
            input_ids, attention_mask = input_ids[..., -max_length:], attention_mask[..., -max_length:]
        elif truncation == "right":
            input_ids, attention_mask = input_ids[..., :max_length], attention_mask[..., :max_length]
        elif truncation == "middle":
            head = max_length // 2
            tail = max_length - head
            input_ids = torch.cat([input_ids[..., :head], input_ids[..., -tail:]], dim=-1) if tail else input_ids[..., :head]
            attention_mask = (
                torch.cat([attention_mask[..., :head], attention_mask[..., -tail:]], dim=-1) if tail else attention_mask[..., :head]
            )
        else:
            raise ValueError(f"prompt length {seq_len} exceeds max_length {max_length} (truncation='error')")
    return input_ids, attention_mask


def tokenize_and_postprocess_data(
    prompt: str, tokenizer, max_length: int, pad_token_id: int, left_pad: bool = True, truncation: str = "error"
):
    """Tokenise one prompt string and pad/truncate it to `max_length`: ([1, max_length] ids, mask)."""
    enc = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    return postprocess_data(enc["input_ids"], enc["attention_mask"], max_length, pad_token_id, left_pad, truncation)


# ---------------------------------------------------------------------------------------------
# learning-rate schedules (LambdaLR factories)
# ---------------------------------------------------------------------------------------------


def get_constant_schedule_with_warmup(optimizer, num_warmup_steps: int, last_epoch: int = -1):
    """Linear warm-up from 0 to the base lr over `num_warmup_steps`, then constant."""

    def lr_lambda(step: int) -> float:
        if num_warmup_steps > 0 and step < num_warmup_steps:
            return float(step) / float(num_warmup_steps)
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda, last_epoch)


def get_cosine_schedule_with_warmup(
    optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
):
    """Linear warm-up, then cosine decay from the base lr towards `min_lr_ratio * lr`.

    `num_cycles=0.5` is one half cosine period (lr reaches the floor at `num_training_steps`).
    """
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio={min_lr_ratio} must be in [0, 1]")

    def lr_lambda(step: int) -> float:
        if num_warmup_steps > 0 and step < num_warmup_steps:
            return float(step) / float(num_warmup_steps)
        progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_cycles * progress))
        return max(0.0, min_lr_ratio + (1.0 - min_lr_ratio) * cosine)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda, last_epoch)
