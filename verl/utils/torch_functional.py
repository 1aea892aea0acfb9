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
from contextlib import contextmanager

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
    "get_wsd_schedule_with_warmup",
    "gather_from_labels",
    "logprobs_from_logits_v2",
    "logprobs_from_logits_flash_attn",
    "logprobs_from_logits_torch_npu",
    "compute_grad_norm",
    "broadcast_dict_tensor",
    "allgather_dict_tensors",
    "allgather_dict_into_dict",
    "split_dict_tensor_into_batches",
    "pad_and_stack",
    "pad_along_dim",
    "remove_pad_token",
    "log_probs_from_logits_response",
    "log_probs_from_logits_response_rmpad",
    "log_probs_from_logits_all_rmpad",
    "post_process_logits",
    "calculate_sum_pi_squared_from_logits",
    "prepare_decoder_attention_mask",
    "get_unpad_data",
    "check_device_is_available",
    "distributed_mean_max_min_std",
    "distributed_masked_mean",
    "expand_as_nested",
    "use_original_torch_compile",
    "FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE",
    "NPU_CROSS_ENTROPY_LOSS_AVAILABLE",
]

# Optional fused cross-entropy kernels (upstream's flag names, spelling included). We never pick
# them implicitly: `logprobs_from_logits` always uses the chunked torch path so results do not
# depend on which optional packages happen to be installed.
try:  # pragma: no cover - flash-attn is not a dependency
    from flash_attn.ops.triton.cross_entropy import cross_entropy_loss as _flash_cross_entropy_loss

    FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE = True
except Exception:
    _flash_cross_entropy_loss = None
    FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE = False

try:  # pragma: no cover - Ascend only
    import torch_npu as _torch_npu

    NPU_CROSS_ENTROPY_LOSS_AVAILABLE = hasattr(_torch_npu, "npu_cross_entropy_loss")
except Exception:
    _torch_npu = None
    NPU_CROSS_ENTROPY_LOSS_AVAILABLE = False

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
    """Sum of ``values * mask`` over the positions where `mask` is non-zero; over all elements
    (`axis=None`) or along `axis` (an int or a tuple of ints).

    A 0/1 or bool mask selects; a float mask also weights (as upstream). Values under a zero
    mask never leak, even NaN or inf.
    """
    weighted = _select(values, mask) * mask.to(values.dtype)
    return weighted.sum() if axis is None else weighted.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """``masked_sum(values, mask) / mask.sum()``: the (weighted) mean over the masked positions.

    Args:
        values: any shape.
        mask: same shape as `values` (broadcastable), 0/1, bool or non-negative weights.
        axis: None for one scalar over everything, or the dimension(s) to reduce.
    Returns:
        0-d tensor (axis None) or the reduced tensor. Rows/batches with no selected element give 0.
    """
    weights = mask.to(values.dtype)
    count = weights.sum() if axis is None else weights.sum(dim=axis)
    return masked_sum(values, mask, axis) / torch.where(count > 0, count, torch.ones_like(count))


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


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
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


def gather_from_labels(data: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """``data[..., label]`` per position: data [..., V], label [...] int ids -> [...]."""
    return torch.gather(data, -1, label.long().unsqueeze(-1)).squeeze(-1)


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True, chunk_rows: int | None = None
) -> torch.Tensor:
    """Log-probability of `labels` under softmax(`logits`), memory-aware.

    Computed as `logits[label] - logsumexp(logits)`, which never materialises the full
    log-softmax tensor. Inputs larger than 64 Mi logits are processed in row chunks so that the
    temporaries stay bounded. bf16/fp16 logits are upcast to fp32 per chunk for the arithmetic and
    the result is cast back, so the output dtype is the logits dtype (as upstream: bf16 in, bf16
    out); pass fp32 logits to get fp32 log-probs.

    Args:
        logits: [..., V] float.
        labels: [...] int64 token ids (same leading shape as logits).
        inplace_backward: accepted for upstream compatibility (flash-attn kernel switch); unused.
        chunk_rows: rows per chunk override (for tests); default from the element budget.
    Returns:
        [...] log-probabilities in the dtype of `logits`.
    """
    del inplace_backward
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logprobs_from_logits: logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree"
        )
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
    return out.reshape(lead_shape).to(logits.dtype)


def logprobs_from_logits_v2(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Upstream's row-looping variant; here the same chunked computation as
    `logprobs_from_logits` (identical values and output dtype)."""
    return logprobs_from_logits(logits, labels)


def logprobs_from_logits_flash_attn(
    logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True
) -> torch.Tensor:
    """Log-probs with flash-attn's Triton cross-entropy kernel: logits [N, V], labels [N] -> [N].

    Raises ImportError when flash-attn (>= 2.4.3) is not installed."""
    if _flash_cross_entropy_loss is None:
        raise ImportError(
            "logprobs_from_logits_flash_attn needs flash-attn>=2.4.3 (flash_attn.ops.triton.cross_entropy); use "
            "logprobs_from_logits"
        )
    out = _flash_cross_entropy_loss(logits, labels, inplace_backward=inplace_backward)
    if not isinstance(out, tuple):
        raise RuntimeError(
            "flash-attn cross_entropy_loss did not return (losses, z_losses); flash-attn>=2.4.3 is required"
        )
    return -out[0]


def logprobs_from_logits_torch_npu(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probs with Ascend's fused cross-entropy: logits [..., V], labels [...] -> [...].

    Raises ImportError when torch_npu is not installed."""
    if not NPU_CROSS_ENTROPY_LOSS_AVAILABLE:
        raise ImportError(
            "logprobs_from_logits_torch_npu needs torch_npu with npu_cross_entropy_loss; use logprobs_from_logits"
        )
    lead = logits.shape[:-1]
    loss, *_ = _torch_npu.npu_cross_entropy_loss(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none"
    )
    return -loss.view(*lead)


def logprobs_from_logits_naive(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Reference implementation (full log_softmax then gather); for tests and small inputs.
    Half-precision logits are upcast for the arithmetic; the output has the logits dtype."""
    logp = F.log_softmax(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits, dim=-1)
    return gather_from_labels(logp, labels).to(logits.dtype)


def _entropy_chunk(logits: torch.Tensor) -> torch.Tensor:
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Categorical entropy `H = logsumexp(z) - sum softmax(z) * z` per position: [..., V] -> [...].

    Half-precision logits are upcast for the arithmetic; the output has the logits dtype (as
    upstream)."""
    return _entropy_chunk(logits).to(logits.dtype)


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


def pad_sequence_to_length(
    tensors: torch.Tensor, max_seq_len: int, pad_token_id, left_pad: bool = False
) -> torch.Tensor:
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
            input_ids = (
                torch.cat([input_ids[..., :head], input_ids[..., -tail:]], dim=-1) if tail else input_ids[..., :head]
            )
            attention_mask = (
                torch.cat([attention_mask[..., :head], attention_mask[..., -tail:]], dim=-1)
                if tail
                else attention_mask[..., :head]
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
    init_lr_ratio: float | None = None,
    zero_indexed_step: bool = True,
):
    """Linear warm-up, then cosine decay from the base lr towards `min_lr_ratio * lr`.

    Multiplier at scheduler step ``s`` (``s = step`` when `zero_indexed_step`, else ``step + 1``,
    i.e. the first optimizer step already uses the second point of the curve):

    - warm-up (``s < num_warmup_steps``): ``r0 + (1 - r0) * s / num_warmup_steps`` with
      ``r0 = init_lr_ratio`` (None = 0);
    - then ``m + (1 - m) * 0.5 * (1 + cos(2 pi num_cycles p))`` with ``m = min_lr_ratio`` (None
      = 0) and ``p = (s - warmup) / (num_training_steps - warmup)``, never below ``m``.

    `num_cycles=0.5` is one half cosine period (lr reaches the floor at `num_training_steps`).
    """
    min_lr_ratio = 0.0 if min_lr_ratio is None else min_lr_ratio
    init_lr_ratio = 0.0 if init_lr_ratio is None else init_lr_ratio
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio={min_lr_ratio} must be in [0, 1]")
    if not 0.0 <= init_lr_ratio <= 1.0:
        raise ValueError(f"init_lr_ratio={init_lr_ratio} must be in [0, 1]")
    offset = 0 if zero_indexed_step else 1

    def lr_lambda(step: int) -> float:
        s = step + offset
        if s < num_warmup_steps:
            return init_lr_ratio + (1.0 - init_lr_ratio) * float(s) / float(max(1, num_warmup_steps))
        progress = float(s - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_cycles * progress))
        return max(min_lr_ratio, min_lr_ratio + (1.0 - min_lr_ratio) * cosine)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda, last_epoch)


def get_wsd_schedule_with_warmup(
    optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    stable_ratio: float = 0.9,
    zero_indexed_step: bool = True,
):
    """Warmup-Stable-Decay: linear warm-up from 0, constant for
    ``int((num_training_steps - num_warmup_steps) * stable_ratio)`` steps, then a cosine decay to
    `min_lr_ratio` over the remaining steps; `min_lr_ratio` from `num_training_steps` on."""
    min_lr_ratio = 0.0 if min_lr_ratio is None else min_lr_ratio
    remaining = max(0, num_training_steps - num_warmup_steps)
    stable = int(remaining * stable_ratio)
    decay = remaining - stable
    offset = 0 if zero_indexed_step else 1

    def lr_lambda(step: int) -> float:
        s = step + offset
        if s < num_warmup_steps:
            return float(s) / float(max(1, num_warmup_steps))
        if s < num_warmup_steps + stable:
            return 1.0
        if s < num_training_steps:
            progress = float(s - num_warmup_steps - stable) / float(max(1, decay))
            cosine = max(0.0, 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_cycles * progress)))
            return min_lr_ratio + (1.0 - min_lr_ratio) * cosine
        return min_lr_ratio

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda, last_epoch)


# ---------------------------------------------------------------------------------------------
# response log-probs, padding removal, attention masks
# ---------------------------------------------------------------------------------------------


def remove_pad_token(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """Token ids of each left-padded row without its padding: [B, S] -> B lists (the last
    ``attention_mask[i].sum()`` ids of row i)."""
    out = []
    for ids, mask in zip(input_ids, attention_mask, strict=False):
        keep = int(mask.sum().item())
        out.append(ids[ids.shape[0] - keep :].cpu().tolist())
    return out


def log_probs_from_logits_response(input_ids: torch.Tensor, logits: torch.Tensor, response_length: int) -> torch.Tensor:
    """Log-probs of the last `response_length` tokens of each row from the full-sequence logits.

    Args:
        input_ids: [B, S] ids (prompt + response); logits: [B, S, V] = model(input_ids).
    Returns:
        [B, response_length]: position t of the response is scored by the logits one step earlier.
    """
    response_logits = logits[:, -response_length - 1 : -1]
    return logprobs_from_logits(response_logits, input_ids[:, -response_length:])


def _pad_rows(values: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Scatter [nnz, ...] values back to [batch, seqlen, ...] at flat positions `indices` (zeros elsewhere)."""
    out = values.new_zeros(batch * seqlen, *values.shape[1:])
    out[indices] = values
    return out.reshape(batch, seqlen, *values.shape[1:])


def log_probs_from_logits_response_rmpad(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_rmpad: torch.Tensor, response_length: int
) -> torch.Tensor:
    """Response log-probs when the model ran on the unpadded tokens.

    Args:
        input_ids, attention_mask: [B, S] padded batch.
        logits_rmpad: [nnz, V] logits of the valid tokens (in row-major order of the mask).
    Returns:
        [B, response_length]; each token is scored by the logits of the previous valid token.
    """
    batch, seqlen = input_ids.shape
    indices = torch.nonzero(attention_mask.reshape(-1), as_tuple=False).flatten()
    ids_rmpad = input_ids.reshape(-1)[indices]
    next_ids = torch.roll(ids_rmpad, shifts=-1, dims=0)
    logp = logprobs_from_logits(logits_rmpad, next_ids)
    full = _pad_rows(logp, indices, batch, seqlen)
    return full[:, -response_length - 1 : -1]


def log_probs_from_logits_all_rmpad(
    input_ids_rmpad: torch.Tensor,
    logits_rmpad: torch.Tensor,
    indices: torch.Tensor,
    batch_size: int,
    seqlen: int,
    response_length: int,
) -> torch.Tensor:
    """As `log_probs_from_logits_response_rmpad`, given the unpadded ids ([1, nnz]) and their flat
    positions `indices` ([nnz]) directly. Returns [batch_size, response_length]."""
    ids = input_ids_rmpad.transpose(0, 1).squeeze(-1)
    next_ids = torch.roll(ids, shifts=-1, dims=0)
    logp = logprobs_from_logits(logits_rmpad, next_ids)
    full = _pad_rows(logp, indices, batch_size, seqlen)
    return full[:, -response_length - 1 : -1]


def post_process_logits(input_ids, logits: torch.Tensor, temperature: float, top_k, top_p) -> torch.Tensor:
    """Divide `logits` by `temperature` in place (top_k / top_p are accepted and not applied, as upstream)."""
    if temperature != 1.0:
        logits = logits.div_(temperature)
    return logits


def calculate_sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """``sum_v softmax(z)_v ** 2`` per position, as ``exp(lse(2z) - 2 lse(z))``: [..., V] -> [...]."""
    return torch.exp(torch.logsumexp(2.0 * logits, dim=-1) - 2.0 * torch.logsumexp(logits, dim=-1))


def prepare_decoder_attention_mask(
    attention_mask: torch.Tensor | None, input_shape, inputs_embeds: torch.Tensor
) -> torch.Tensor | None:
    """Additive 4-D attention mask [B, 1, S, S]: 0 where attention is allowed, the dtype's
    minimum where it is not (future positions, and padded keys from the [B, S] `attention_mask`)."""
    bsz, tgt = input_shape[0], input_shape[-1]
    dtype, device = inputs_embeds.dtype, inputs_embeds.device
    neg = torch.finfo(dtype).min
    combined = None
    if tgt > 1:
        causal = torch.full((tgt, tgt), neg, device=device).triu(1).to(dtype)
        combined = causal[None, None].expand(bsz, 1, tgt, tgt)
    if attention_mask is not None:
        keys = attention_mask[:, None, None, :].to(dtype).expand(bsz, 1, tgt, attention_mask.shape[-1])
        padded = (1.0 - keys).masked_fill((1.0 - keys).bool(), neg).to(device)
        combined = padded if combined is None else padded + combined
    return combined


def get_unpad_data(attention_mask: torch.Tensor):
    """Varlen-attention inputs from a [B, S] mask: (indices [nnz] of valid flat positions,
    cu_seqlens [B + 1] int32, max_seqlen_in_batch int)."""
    seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    return indices, cu_seqlens, int(seqlens.max().item()) if seqlens.numel() else 0


def expand_as_nested(tensor: torch.Tensor, nested_tensor: torch.Tensor) -> torch.Tensor:
    """Broadcast one value per row ([B]) over a 2-D jagged nested tensor's rows: the result is a
    nested tensor with the same offsets whose row i is filled with ``tensor[i]``."""
    if not nested_tensor.is_nested:
        raise ValueError("expand_as_nested: nested_tensor must be a nested (jagged) tensor")
    if tensor.dim() != 1 or tensor.shape[0] != nested_tensor.shape[0]:
        raise ValueError(
            f"expand_as_nested: tensor must be 1-D with {nested_tensor.shape[0]} rows, got shape {tuple(tensor.shape)}"
        )
    if nested_tensor.dim() != 2:
        raise ValueError(f"expand_as_nested: nested_tensor must be 2-D, got {nested_tensor.dim()}-D")
    offsets = nested_tensor.offsets()
    values = torch.repeat_interleave(tensor, offsets.diff(), dim=0)
    return torch.nested.nested_tensor_from_jagged(values=values, offsets=offsets)


# ---------------------------------------------------------------------------------------------
# gradients, batches and collectives
# ---------------------------------------------------------------------------------------------


def compute_grad_norm(model: torch.nn.Module) -> float:
    """Sum of squared gradient entries over all parameters (the squared L2 norm, as upstream)."""
    total = 0.0
    for param in model.parameters():
        if param.grad is not None:
            total += float(torch.sum(torch.square(param.grad.detach().float())).item())
    return total


def split_dict_tensor_into_batches(tensors, batch_size: int) -> list:
    """Split a TensorDict into consecutive pieces of `batch_size` rows (must divide evenly)."""
    n = tensors.batch_size[0]
    if batch_size <= 0 or n % batch_size != 0:
        raise ValueError(f"input data batch size: {n}, split batch size: {batch_size} (must divide it)")
    return list(tensors.split(batch_size))


def pad_and_stack(tensors: list[torch.Tensor], pad_value: float = 0) -> torch.Tensor:
    """Stack tensors of equal ndim but different sizes, right-padding every dim to the maximum:
    ``[t_i (d0_i, d1_i, ...)] -> [N, max d0, max d1, ...]``."""
    if not tensors:
        raise ValueError("tensors list cannot be empty")
    ndim = tensors[0].ndim
    if any(t.ndim != ndim for t in tensors):
        raise ValueError(f"All tensors must have the same number of dimensions. Got: {[t.ndim for t in tensors]}")
    sizes = [max(t.shape[d] for t in tensors) for d in range(ndim)]
    out = tensors[0].new_full((len(tensors), *sizes), pad_value)
    for i, t in enumerate(tensors):
        out[(i, *[slice(0, n) for n in t.shape])] = t
    return out


def pad_along_dim(tensor: torch.Tensor, target_length: int, pad_value: float = 0, dim: int = -1) -> torch.Tensor:
    """Right-pad `tensor` along `dim` to `target_length` (ValueError if it is already longer)."""
    current = tensor.shape[dim]
    if current > target_length:
        raise ValueError(
            f"Cannot pad dimension {dim} from length {current} to {target_length}. Current length "
            "exceeds target length."
        )
    if current == target_length:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = target_length - current
    return torch.cat([tensor, tensor.new_full(shape, pad_value)], dim=dim)


def broadcast_dict_tensor(tensors, src: int, group) -> None:
    """Broadcast every tensor of a dict / TensorDict from rank `src` in place (sorted key order)."""
    import torch.distributed as dist

    keys = tensors.sorted_keys if hasattr(tensors, "sorted_keys") else sorted(tensors.keys())
    for key in keys:
        dist.broadcast(tensors[key], src=src, group=group, async_op=False)


def allgather_dict_tensors(tensors, size: int, group, dim: int = 0):
    """All-gather every tensor of a dict / TensorDict (equal shapes on all ranks) and concatenate
    along `dim` in rank order; returns the same container type (a TensorDict of ``bs * size`` rows)."""
    import torch.distributed as dist
    from tensordict import TensorDict

    is_td = isinstance(tensors, TensorDict)
    source = tensors.to_dict() if is_td else tensors
    out = {}
    for key in sorted(source.keys()):
        val = source[key]
        parts = [torch.empty_like(val) for _ in range(size)]
        dist.all_gather(parts, val, group=group, async_op=False)
        out[key] = torch.cat(parts, dim=dim)
    if is_td:
        return TensorDict(source=out, batch_size=tensors.batch_size[0] * size)
    return out


def allgather_dict_into_dict(data: dict, group=None) -> dict:
    """All-gather a dict from every rank into ``key -> [value of rank 0, rank 1, ...]``."""
    import torch.distributed as dist

    if not isinstance(data, dict):
        raise TypeError(f"Expect data to be a dictionary, Got {type(data)}")
    gathered: list = [None] * dist.get_world_size(group=group)
    dist.all_gather_object(gathered, data, group=group)
    out: dict = {}
    for item in gathered:
        for key, val in item.items():
            out.setdefault(key, []).append(val)
    return out


def distributed_mean_max_min_std(
    local_tensor: torch.Tensor, compute_max: bool = True, compute_min: bool = True, compute_std: bool = True
):
    """Global (mean, max, min, std) of the elements of `local_tensor` over all ranks (None for a
    statistic that is switched off). std uses the n - 1 denominator over all elements."""
    import torch.distributed as dist

    local_sum = torch.sum(local_tensor)
    count = torch.tensor(local_tensor.numel(), device=local_tensor.device, dtype=local_sum.dtype)
    dist.all_reduce(local_sum, op=dist.ReduceOp.SUM)
    dist.all_reduce(count, op=dist.ReduceOp.SUM)
    mean = local_sum / count
    vmax = vmin = std = None
    if compute_max:
        vmax = torch.max(local_tensor)
        dist.all_reduce(vmax, op=dist.ReduceOp.MAX)
    if compute_min:
        vmin = torch.min(local_tensor)
        dist.all_reduce(vmin, op=dist.ReduceOp.MIN)
    if compute_std:
        sq = torch.sum((local_tensor - mean) ** 2)
        dist.all_reduce(sq, op=dist.ReduceOp.SUM)
        std = torch.sqrt(sq / (count - 1))
    return mean, vmax, vmin, std


def distributed_masked_mean(local_tensor: torch.Tensor, local_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the masked elements over all ranks (sums and counts all-reduced)."""
    import torch.distributed as dist

    local_sum = torch.sum(local_tensor * local_mask)
    local_num = torch.sum(local_mask).to(local_sum.dtype)
    dist.all_reduce(local_sum, op=dist.ReduceOp.SUM)
    dist.all_reduce(local_num, op=dist.ReduceOp.SUM)
    return local_sum / local_num


@contextmanager
def check_device_is_available():
    """Raise RuntimeError unless an accelerator is available (guards imports that need one)."""
    from verl.utils.device import get_device_name, get_torch_device

    if not get_torch_device().is_available():
        raise RuntimeError(f"Device {get_device_name()} must be initialized before importing this module.")
    yield


@contextmanager
def use_original_torch_compile():
    """Upstream undoes an NPU patch of torch.compile here; this tree never patches it, so the
    context only yields."""
    yield


def response_span(response_mask: torch.Tensor) -> torch.Tensor:
    """[B, R] mask -> [B] long: 1 + the index of the last 1 in each row (0 for an all-zero row).

    Equals `mask.sum(-1)` for left-aligned masks (single-turn responses); for multi-turn responses,
    whose observation tokens (mask 0) sit between generated turns, it is the length of the
    response up to its last generated token.
    """
    r = response_mask.shape[-1]
    idx = torch.arange(1, r + 1, device=response_mask.device).expand_as(response_mask)
    return torch.where(response_mask.bool(), idx, torch.zeros_like(idx)).max(dim=-1).values.long()
