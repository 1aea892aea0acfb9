"""Model forwards without padding: the helpers every data-parallel engine runs a micro-batch through.

Rows are a left-padded prompt followed by a right-padded response (`input_ids`,
`attention_mask`, `position_ids` [m, P + R]). Two ways to avoid computing padding:

- `compact_rows` removes each row's padding and re-pads the rows on the right to the longest row of
  the micro-batch (original position ids kept, so the model computes the same function of the
  valid tokens); `response_outputs` runs a forward on those rows and reads its per-position output
  (logits, values) at the positions that predict the response tokens.
- The prefix grouper: `group_shared_prompts` finds rows repeating the same prompt (GRPO's `n`
  samples) and `shared_prefix_outputs` runs each distinct prompt once, its KV cache shared by the
  rows that repeat it. `prefix_grouper_applies` says when it is exact and available.

The micro-batch planning (which rows go together) is in `verl.utils.seqlen_balancing`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

__all__ = [
    "CompactRows",
    "compact_rows",
    "response_outputs",
    "PromptGroups",
    "group_shared_prompts",
    "shared_prefix_outputs",
    "prefix_cache_kwarg",
    "activation_checkpointing",
    "row_chunks",
]


@dataclass
class CompactRows:
    """A micro-batch with every row's padding removed and rows re-padded on the right.

    input_ids / position_ids: [m, T] (T = most valid tokens in one row); attention_mask: [m, T]
    (1 on the first `lengths[i]` columns of row i), or None when every row is full (then models
    use the cheaper pure-causal attention). `column_index`: [m, W] position of each original
    column in the compact row (meaningful where the original attention mask is 1). Position ids
    are the original ones, so the model computes exactly the same function of the valid tokens.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor
    lengths: torch.Tensor
    column_index: torch.Tensor
    valid: torch.Tensor

    @property
    def token_slots(self) -> int:
        return int(self.input_ids.numel())

    @property
    def valid_tokens(self) -> int:
        return int(self.lengths.sum())


def compact_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, pad_token_id: int = 0
) -> CompactRows:
    """Remove the padding of each row (see `CompactRows`).

    Args:
        input_ids: [m, W] token ids (left-padded prompt + right-padded response, or any layout).
        attention_mask: [m, W] 1 on tokens, 0 on padding (holes are allowed and dropped).
        position_ids: [m, W] position ids of the padded layout.
        pad_token_id: id written in the compact padding (masked out, so any id works).
    """
    if position_ids.dim() != 2:
        raise NotImplementedError(
            f"compact_rows: position_ids of shape {tuple(position_ids.shape)} (multi-axis rope) are not supported; set "
            "model.use_remove_padding=False"
        )
    valid = attention_mask.bool()
    lengths = valid.sum(dim=-1)
    width = max(int(lengths.max()) if lengths.numel() else 0, 1)
    column_index = valid.long().cumsum(dim=-1) - 1
    rows, cols = valid.nonzero(as_tuple=True)
    dest = column_index[rows, cols]
    m = input_ids.shape[0]
    ids = torch.full((m, width), pad_token_id, dtype=input_ids.dtype, device=input_ids.device)
    ids[rows, dest] = input_ids[rows, cols]
    pos = torch.zeros((m, width), dtype=position_ids.dtype, device=position_ids.device)
    pos[rows, dest] = position_ids[rows, cols]
    if bool((lengths == width).all()):
        mask = None
    else:
        mask = (torch.arange(width, device=input_ids.device).unsqueeze(0) < lengths.unsqueeze(1)).to(
            attention_mask.dtype
        )
    return CompactRows(ids, mask, pos, lengths, column_index.clamp(min=0), valid)


def response_outputs(
    forward,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    pad_token_id: int = 0,
    remove_padding: bool = True,
):
    """A model's per-position output at the positions that predict the response tokens.

    Rows are a left-padded prompt followed by `response_length` right-padded response columns.
    The output read for response token j is the one at the position *before* it (the logits that
    predict it, the value of the state in which it is chosen).

    Args:
        forward: `forward(keep, input_ids=, attention_mask=, position_ids=)` returning a
            per-position tensor [m, T, ...] (T = input width) or only its last `keep` positions
            [m, keep, ...] (e.g. through transformers' `logits_to_keep`); `keep` covers every
            position read here, so models may skip the others.
        input_ids, attention_mask, position_ids: [m, P + R] padded micro-batch.
        remove_padding: run on the compacted rows (`compact_rows`), else on the padded rows.
    Returns:
        outputs [m, R, ...]; valid [m, R] bool (a real response token with a predecessor: read
        outputs only there); (valid tokens, token slots) of the forward.
    """
    prompt_width = input_ids.shape[-1] - response_length
    valid = attention_mask[:, prompt_width:].bool()
    if remove_padding:
        packed = compact_rows(input_ids, attention_mask, position_ids, pad_token_id)
        inputs = {
            "input_ids": packed.input_ids,
            "attention_mask": packed.attention_mask,
            "position_ids": packed.position_ids,
        }
        target = packed.column_index[:, prompt_width:] - 1
        valid = valid & (target >= 0)
        stats = (packed.valid_tokens, packed.token_slots)
    else:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        target = torch.arange(prompt_width - 1, input_ids.shape[-1] - 1, device=input_ids.device).expand(
            input_ids.shape[0], -1
        )
        stats = (int(attention_mask.sum()), input_ids.numel())
    width = inputs["input_ids"].shape[-1]
    first = int(target[valid].min()) if bool(valid.any()) else width - 1
    out = forward(width - first, **inputs)
    offset = width - out.shape[1]  # 0 when the forward returned every position
    index = (target - offset).clamp(min=0, max=out.shape[1] - 1)
    rows = torch.arange(index.shape[0], device=index.device).unsqueeze(1)
    return out[rows, index], valid, stats


# ---------------------------------------------------------------------------------------------
# shared prompts (the prefix grouper)
# ---------------------------------------------------------------------------------------------


def _left_padded(mask: torch.Tensor) -> bool:
    """True when every row of `mask` [m, W] is 0...0 1...1 (at least one 1)."""
    lengths = mask.sum(dim=-1)
    cols = torch.arange(mask.shape[-1], device=mask.device).unsqueeze(0)
    expected = cols >= (mask.shape[-1] - lengths).unsqueeze(1)
    return bool((lengths > 0).all()) and bool((mask.bool() == expected).all())


def _right_padded(mask: torch.Tensor) -> bool:
    """True when every row of `mask` [m, W] is 1...1 0...0 (possibly all 0)."""
    lengths = mask.sum(dim=-1)
    cols = torch.arange(mask.shape[-1], device=mask.device).unsqueeze(0)
    return bool((mask.bool() == (cols < lengths.unsqueeze(1))).all())


@dataclass
class PromptGroups:
    """Rows of a micro-batch grouped by identical prompt.

    first: [u] one row index per distinct prompt; inverse: [m] the group (0..u-1) of every row;
    prompt_len: longest valid prompt of the micro-batch (columns kept in the prefix forward).
    """

    first: torch.Tensor
    inverse: torch.Tensor
    prompt_len: int

    @property
    def num_groups(self) -> int:
        return int(self.first.numel())


def group_shared_prompts(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int
) -> PromptGroups | None:
    """Group the rows of a micro-batch whose prompts (token ids and mask) are identical.

    Rows are a left-padded prompt followed by `response_length` right-padded response columns.
    Returns None when nothing is gained or the layout is not the standard one (a prompt with
    holes or no token, a response with holes): the caller then uses the plain forward.
    """
    width = input_ids.shape[-1] - response_length
    if width <= 0 or input_ids.shape[0] < 2:
        return None
    p_mask = attention_mask[:, :width]
    if not _left_padded(p_mask) or not _right_padded(attention_mask[:, width:]):
        return None
    key = torch.cat([input_ids[:, :width] * p_mask, p_mask.to(input_ids.dtype)], dim=-1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    u = int(inverse.max()) + 1
    if u == input_ids.shape[0]:
        return None
    m = input_ids.shape[0]
    first = torch.full((u,), m, dtype=torch.long, device=input_ids.device)
    first = first.scatter_reduce(0, inverse, torch.arange(m, device=input_ids.device), reduce="amin")
    # keep groups in order of first appearance (deterministic, independent of torch.unique's sort)
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(u, device=order.device)
    return PromptGroups(first=first[order], inverse=rank[inverse], prompt_len=int(p_mask.sum(dim=-1).max()))


def shared_prefix_outputs(
    module,
    groups: PromptGroups,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    cache_kwarg: str = "past_key_values",
    logits_to_keep: bool = True,
    pass_cache: bool = False,
):
    """`response_outputs` (logits at the positions that predict the response tokens) computed with
    each distinct prompt run once.

    Two forwards: (1) the distinct prompts [u, L] (L = `groups.prompt_len`, left-padded) with a
    KV cache, keeping only the last position's logits (they predict response token 0); (2) the
    responses [m, R'] (R' = longest valid response) attending to their group's cached prompt, the
    cache rows selected by `groups.inverse`. The selection is an indexing op, so in training the
    gradient of every response flows back into its shared prompt's computation and is summed
    there: the same function and the same gradient as running each row in full (up to float
    summation order). Position ids are the original ones.

    Args:
        module: a causal LM accepting a KV cache (`cache_kwarg`) and `use_cache=True`.
        input_ids, attention_mask, position_ids: [m, P + R] padded micro-batch.
        logits_to_keep: the model accepts transformers' `logits_to_keep`.
        pass_cache: hand the model an empty cache to fill, for models that fill one but do not
            return it (transformers' token-classification value heads); causal LMs return theirs.
    Returns:
        logits [m, R, V] (0 past R'), valid [m, R] bool, (valid tokens, token slots) computed.
    """
    width = input_ids.shape[-1] - response_length
    lp = groups.prompt_len
    first = groups.first
    p_ids = input_ids[first, width - lp : width]
    p_mask = attention_mask[first, width - lp : width]
    p_pos = position_ids[first, width - lp : width]
    full_prompts = bool(p_mask.all())
    extra = {"logits_to_keep": 1} if logits_to_keep else {}
    given = {cache_kwarg: _empty_cache(module)} if pass_cache else {}
    out = module(
        input_ids=p_ids,
        attention_mask=None if full_prompts else p_mask,
        position_ids=p_pos,
        use_cache=True,
        **extra,
        **given,
    )
    if pass_cache:
        cache = given[cache_kwarg]
    else:
        cache = out["cache"] if "cache" in out.keys() and out["cache"] is not None else out["past_key_values"]
    first_logits = out.logits[:, -1:][groups.inverse]  # [m, 1, V]
    resp_mask = attention_mask[:, width:]
    valid = resp_mask.bool()
    r_eff = max(int(resp_mask.sum(dim=-1).max()), 1)
    m = input_ids.shape[0]
    slots = groups.num_groups * lp
    tokens = int(p_mask.sum())
    if r_eff > 1:
        cache.batch_select_indices(groups.inverse)
        r_ids = input_ids[:, width : width + r_eff - 1]
        r_pos = position_ids[:, width : width + r_eff - 1]
        r_mask = resp_mask[:, : r_eff - 1]
        full = torch.cat([p_mask[groups.inverse], r_mask], dim=-1)
        kwargs = {cache_kwarg: cache}
        if full_prompts and bool(r_mask.all()):
            full = None
        out2 = module(input_ids=r_ids, attention_mask=full, position_ids=r_pos, use_cache=True, **kwargs)
        logits = torch.cat([first_logits, out2.logits], dim=1)
        slots += m * (r_eff - 1)
        tokens += int(r_mask.sum())
    else:
        logits = first_logits
    if r_eff < response_length:
        pad = logits.new_zeros((m, response_length - r_eff, *logits.shape[2:]))
        logits = torch.cat([logits, pad], dim=1)
    return logits, valid, (tokens, slots)


def _empty_cache(module):
    from transformers import DynamicCache

    inner = module.get_base_model() if callable(getattr(module, "get_base_model", None)) else module
    return DynamicCache(config=inner.config)


def activation_checkpointing(module) -> bool:
    """Whether `module` recomputes activations in backward (the prefix grouper is then off while
    training: its shared cache would be recomputed per row)."""
    # transformers 5 renamed is_gradient_checkpointing (deprecated) to is_activation_checkpointing
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(module), name) or hasattr(module, name):
            return bool(getattr(module, name))
    return False


def prefix_cache_kwarg(module) -> str | None:
    """Name of the KV-cache argument of `module`'s forward (`cache` in transformers >= 5.2x,
    `past_key_values` before), or None when it takes neither (the prefix grouper is then off)."""
    # a peft model forwards its keyword arguments to the wrapped model: read that one's signature
    inner = module.get_base_model() if callable(getattr(module, "get_base_model", None)) else module
    try:
        params = inspect.signature(type(inner).forward).parameters
    except (TypeError, ValueError):
        return None
    if "use_cache" not in params:
        return None
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


def row_chunks(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    max_tokens: int,
    share_prompts: bool = True,
) -> list[torch.Tensor] | None:
    """Split the rows of a micro-batch into chunks of whole prompt groups computing about the same
    number of tokens, each at most `max_tokens` unless one group alone computes more.

    Rows are a left-padded prompt followed by `response_length` right-padded response columns;
    rows with the same prompt (token ids and mask) form a group, counted with its prompt once
    (`share_prompts`, the prefix grouper) or once per row, plus every row's response tokens.

    Returns:
        index tensors (rows of the micro-batch, ascending) of 2 or more chunks, or None when the
        micro-batch computes no more than `max_tokens` tokens.
    """
    m = input_ids.shape[0]
    width = input_ids.shape[-1] - response_length
    if m < 2 or width < 0:
        return None
    p_mask = attention_mask[:, :width].long()
    if width == 0:  # no prompt columns (SFT rows are all "response"): every row is its own group
        inverse = torch.arange(m, device=input_ids.device)
    else:
        key = torch.cat([input_ids[:, :width] * p_mask, p_mask.to(input_ids.dtype)], dim=-1)
        _, inverse = torch.unique(key, dim=0, return_inverse=True)
    u = int(inverse.max()) + 1
    rows = torch.arange(m, device=inverse.device)
    first = torch.full((u,), m, dtype=torch.long, device=inverse.device).scatter_reduce(0, inverse, rows, reduce="amin")
    prompt = p_mask.sum(dim=-1)[first]
    if not share_prompts:
        prompt = prompt * torch.bincount(inverse, minlength=u)
    response = torch.zeros(u, dtype=torch.long, device=inverse.device)
    response.index_add_(0, inverse, attention_mask[:, width:].long().sum(dim=-1))
    tokens = (prompt + response).tolist()
    total = sum(tokens)
    if total <= max_tokens:
        return None
    n_chunks = -(-total // max_tokens)
    target = total / n_chunks
    chunk_of_group = torch.empty(u, dtype=torch.long)
    done = 0
    for g in torch.argsort(first).tolist():  # groups in order of first appearance
        # a group goes to the chunk its middle token falls in
        chunk_of_group[g] = min(n_chunks - 1, int((done + tokens[g] / 2) // target))
        done += tokens[g]
    chunk_of_row = chunk_of_group.to(inverse.device)[inverse]
    chunks = [rows[chunk_of_row == c] for c in range(n_chunks)]
    chunks = [c for c in chunks if c.numel()]
    return chunks if len(chunks) > 1 else None
