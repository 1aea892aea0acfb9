"""Forming micro-batches by length, and balancing sequence lengths across data-parallel ranks.

Cost model. The engines pad each micro-batch only to the longest sequence *in that micro-batch*
(after removing every row's own padding, see `DataParallelPPOActor`), so a micro-batch of `m` rows
whose longest row has `L` valid tokens costs `m * L` token slots. Micro-batches are built from rows
sorted by length, which keeps rows of similar length together and the waste
(`1 - valid tokens / token slots`) small.

- `plan_micro_batches(lengths, ...)`: the index lists of the micro-batches, for a fixed number of
  rows per micro-batch or for a token budget per micro-batch (dynamic batch size). With a token
  budget every data-parallel rank must run the same number of forward/backward passes (FSDP
  collectives run inside them), so the count is agreed on with an all-reduce(max).
- `plan_micro_batches_for_mask(attention_mask, ...)`: the engines' entry point (actor, critic,
  reward model): per-row cost lengths from the attention mask, fixed size or token budget.
- `rearrange_micro_batches(batch, max_token_len, ...)`: upstream-named wrapper over a TensorDict.
- `get_reverse_idx(idx_map)`: the permutation that restores the original order.
- `get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size)`: split rows across DP
  ranks so that every rank gets a similar total length (trainer's `balance_batch`).
- `compact_rows(...)`: remove every row's padding (left-padded prompt, right-padded response,
  any masked hole) and re-pad the rows on the right to the longest row of the micro-batch; the
  `CompactRows.column_index` map finds the original columns (e.g. the response tokens) again.
- `response_outputs(forward, ...)`: run a model on one micro-batch (compacted or padded) and read
  its per-position output (logits, values) at the positions that predict the response tokens.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from verl.utils.fsdp_utils import all_reduce_scalar

__all__ = [
    "plan_micro_batches",
    "plan_micro_batches_for_mask",
    "micro_batch_cost",
    "padding_stats",
    "rearrange_micro_batches",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "karmarkar_karp",
    "greedy_partition",
    "log_seqlen_unbalance",
    "CompactRows",
    "compact_rows",
    "response_outputs",
]


# ---------------------------------------------------------------------------------------------
# micro-batches
# ---------------------------------------------------------------------------------------------


def micro_batch_cost(lengths: Sequence[int], group: Sequence[int]) -> int:
    """Token slots of one micro-batch padded to its longest row: `len(group) * max(lengths[group])`."""
    return len(group) * max(lengths[i] for i in group) if group else 0


def padding_stats(lengths: Sequence[int], groups: Sequence[Sequence[int]]) -> dict[str, float]:
    """`{"valid_tokens", "token_slots", "padding_waste"}` of a micro-batch plan."""
    valid = sum(int(lengths[i]) for g in groups for i in g)
    slots = sum(micro_batch_cost(lengths, g) for g in groups)
    return {
        "valid_tokens": float(valid),
        "token_slots": float(slots),
        "padding_waste": 1.0 - valid / slots if slots else 0.0,
    }


def _greedy_budget_groups(order: list[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Fill contiguous groups of the length-descending `order` while `rows * longest <= budget`."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for idx in order:
        if current and (len(current) + 1) * longest > budget:
            groups.append(current)
            current = []
        if not current:
            longest = lengths[idx]
        current.append(idx)
    if current:
        groups.append(current)
    return groups


def _split_to_count(groups: list[list[int]], count: int) -> list[list[int]]:
    """Split the largest groups in halves until there are `count` groups (rows stay sorted)."""
    groups = [list(g) for g in groups]
    while len(groups) < count:
        j = max(range(len(groups)), key=lambda k: len(groups[k]))
        g = groups[j]
        if len(g) < 2:
            raise ValueError(f"cannot form {count} non-empty micro-batches from {sum(len(x) for x in groups)} rows")
        half = len(g) // 2
        groups[j : j + 1] = [g[:half], g[half:]]
    return groups


def _groups_for_count(order: list[int], lengths: Sequence[int], count: int) -> list[list[int]]:
    """Exactly `count` contiguous groups of the sorted rows with the smallest possible largest cost
    (binary search on the budget of the greedy fill, then splitting when it made fewer groups)."""
    if count > len(order):
        raise ValueError(f"cannot form {count} non-empty micro-batches from {len(order)} rows")
    lo = max(lengths[i] for i in order)
    hi = len(order) * lo
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_greedy_budget_groups(order, lengths, mid)) <= count:
            hi = mid
        else:
            lo = mid + 1
    return _split_to_count(_greedy_budget_groups(order, lengths, lo), count)


def _all_reduce_max(value: int, group=None) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return value
    return int(all_reduce_scalar(int(value), dist.ReduceOp.MAX, group, dtype=torch.int64))


def plan_micro_batches(
    lengths: Sequence[int] | torch.Tensor,
    micro_batch_size: int | None = None,
    max_token_len: int | None = None,
    sort_by_length: bool = True,
    dp_group=None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
) -> list[list[int]]:
    """Index lists of the micro-batches of one batch.

    Args:
        lengths: per-row cost length (valid tokens when rows are compacted, the padded width
            otherwise), [n] ints.
        micro_batch_size: rows per micro-batch (fixed mode); exclusive with `max_token_len`.
        max_token_len: token-slot budget per micro-batch (dynamic mode): `rows * longest <= budget`.
            A single row longer than the budget is an error (the budget cannot hold it).
        sort_by_length: group rows of similar length (less padding). Off = consecutive rows.
        dp_group: process group whose ranks must agree on the number of micro-batches (dynamic mode).
        same_micro_num_in_dp: agree on the count across `dp_group` (all-reduce max).
        min_num_micro_batch: lower bound on the count (dynamic mode).
    Returns:
        A list of non-empty index lists that together hold every row exactly once.
    """
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.tolist()
    lengths = [int(x) for x in lengths]
    n = len(lengths)
    if n == 0:
        return []
    if (micro_batch_size is None) == (max_token_len is None):
        raise ValueError("plan_micro_batches: give exactly one of micro_batch_size and max_token_len")
    # longest first; ties keep the original order so plans are deterministic
    order = sorted(range(n), key=lambda i: (-lengths[i], i)) if sort_by_length else list(range(n))
    if micro_batch_size is not None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size={micro_batch_size} must be >= 1")
        return [order[i : i + micro_batch_size] for i in range(0, n, micro_batch_size)]

    longest = max(lengths)
    if longest > max_token_len:
        raise ValueError(
            f"a sequence of {longest} tokens does not fit the token budget max_token_len={max_token_len} "
            "(ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu); raise it to at least the "
            "longest prompt + response"
        )
    if sort_by_length:
        count = len(_greedy_budget_groups(order, lengths, max_token_len))
    else:
        count = len(_greedy_budget_groups(list(range(n)), lengths, max_token_len))
    if min_num_micro_batch is not None:
        count = max(count, min_num_micro_batch)
    if same_micro_num_in_dp:
        count = _all_reduce_max(count, dp_group)
    count = min(count, n)
    if not sort_by_length:
        # contiguous chunks of (almost) equal row counts
        bounds = [round(k * n / count) for k in range(count + 1)]
        return [list(range(bounds[k], bounds[k + 1])) for k in range(count)]
    return _groups_for_count(order, lengths, count)


def plan_micro_batches_for_mask(
    attention_mask: torch.Tensor,
    micro_batch_size: int | None = None,
    use_dynamic_bsz: bool = False,
    max_token_len: int | None = None,
    remove_padding: bool = True,
    dp_group=None,
) -> list[list[int]]:
    """Micro-batches of the rows of one batch from its attention mask [n, W] (used by the engines).

    The cost length of a row is its number of valid tokens when the engine compacts rows
    (`remove_padding`), else the padded width W. With `use_dynamic_bsz` the micro-batches hold at
    most `max_token_len` token slots and every rank of `dp_group` gets the same count; otherwise
    they hold `micro_batch_size` rows (None: all rows at once), sorted by length when compacting.
    """
    if remove_padding:
        lengths = attention_mask.sum(-1).tolist()
    else:
        lengths = [attention_mask.shape[-1]] * attention_mask.shape[0]
    if use_dynamic_bsz:
        if not max_token_len:
            raise ValueError(
                "use_dynamic_bsz=True needs a token budget per micro-batch "
                "(ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu / forward_max_token_len_per_gpu)"
            )
        return plan_micro_batches(lengths, max_token_len=int(max_token_len), dp_group=dp_group)
    size = int(micro_batch_size) if micro_batch_size else len(lengths)
    return plan_micro_batches(lengths, micro_batch_size=max(size, 1), sort_by_length=remove_padding)


def rearrange_micro_batches(
    batch,
    max_token_len: int,
    dp_group=None,
    num_batches_divided_by=None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_remove_padding: bool = True,
):
    """Split a TensorDict (with `attention_mask`) into micro-batches within a token budget.

    Returns `(micro_batches, micro_bsz_idx)`: a list of TensorDicts and, for each, the original
    row indices it holds (feed the concatenated indices to `get_reverse_idx` to restore order).
    `num_batches_divided_by`, when given, rounds the count up to a multiple of it.
    """
    mask = batch["attention_mask"]
    lengths = mask.sum(-1) if use_remove_padding else torch.full((mask.shape[0],), mask.shape[-1])
    lengths = lengths.tolist()
    n = len(lengths)
    groups = plan_micro_batches(
        lengths,
        max_token_len=max_token_len,
        dp_group=dp_group,
        same_micro_num_in_dp=same_micro_num_in_dp,
        min_num_micro_batch=min_num_micro_batch,
    )
    if num_batches_divided_by and len(groups) % num_batches_divided_by:
        target = min(n, -(-len(groups) // num_batches_divided_by) * num_batches_divided_by)
        order = sorted(range(n), key=lambda i: (-lengths[i], i))
        groups = _groups_for_count(order, lengths, target)
    micro_batches = [batch[torch.tensor(g, dtype=torch.long)] for g in groups]
    return micro_batches, groups


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """Inverse permutation: `out[idx_map[i]] = i`. Concatenating the micro-batch results and
    indexing them with `get_reverse_idx(concat(micro_bsz_idx))` restores the original order."""
    idx_map = list(idx_map)
    reverse = [0] * len(idx_map)
    for pos, original in enumerate(idx_map):
        reverse[original] = pos
    return reverse


# ---------------------------------------------------------------------------------------------
# balancing across ranks
# ---------------------------------------------------------------------------------------------


def greedy_partition(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Longest-processing-time-first: each row (longest first) goes to the partition with the
    smallest total so far (among partitions that still have room when `equal_size`)."""
    n = len(seqlen_list)
    if k_partitions < 1:
        raise ValueError(f"k_partitions={k_partitions} must be >= 1")
    if equal_size and n % k_partitions:
        raise ValueError(f"equal_size partitions need len(seqlen_list)={n} divisible by k_partitions={k_partitions}")
    if n < k_partitions:
        raise ValueError(f"cannot split {n} rows into {k_partitions} non-empty partitions")
    cap = n // k_partitions if equal_size else n
    heap = [(0, p) for p in range(k_partitions)]
    parts: list[list[int]] = [[] for _ in range(k_partitions)]
    order = sorted(range(n), key=lambda i: (-seqlen_list[i], i))
    for idx in order:
        popped = []
        while True:
            total, p = heapq.heappop(heap)
            if len(parts[p]) < cap:
                break
            popped.append((total, p))
        parts[p].append(idx)
        heapq.heappush(heap, (total + seqlen_list[idx], p))
        for item in popped:
            heapq.heappush(heap, item)
    if any(not p for p in parts):
        # only possible without equal_size; move single rows from the largest partitions
        for p in parts:
            if not p:
                donor = max(parts, key=len)
                p.append(donor.pop())
    return [sorted(p) for p in parts]


def karmarkar_karp(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Upstream name of the rank-balancing partitioner; implemented by `greedy_partition` (LPT),
    whose largest partition is within 4/3 of optimal."""
    return greedy_partition(seqlen_list, k_partitions, equal_size)


def get_seqlen_balanced_partitions(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Partition row indices into `k_partitions` lists with similar total sequence length.

    Args:
        seqlen_list: per-row lengths (e.g. `attention_mask.sum(-1)`).
        k_partitions: number of partitions (data-parallel size).
        equal_size: every partition gets the same number of rows (required by DP dispatch).
    Returns:
        `k_partitions` sorted index lists covering every row once.
    """
    if isinstance(seqlen_list, torch.Tensor):
        seqlen_list = seqlen_list.tolist()
    return greedy_partition([int(x) for x in seqlen_list], k_partitions, equal_size)


def log_seqlen_unbalance(
    seqlen_list: Sequence[int], partitions: Sequence[Sequence[int]], prefix: str
) -> dict[str, float]:
    """Metrics of how uneven the per-partition total lengths are (min / max / their difference),
    before (`prefix`/min, consecutive equal chunks as dispatched without balancing) and after."""
    if isinstance(seqlen_list, torch.Tensor):
        seqlen_list = seqlen_list.tolist()
    k = len(partitions)
    n = len(seqlen_list)
    chunk = max(1, n // k) if k else n
    before = [sum(seqlen_list[i * chunk : (i + 1) * chunk]) for i in range(k)]
    after = [sum(seqlen_list[i] for i in p) for p in partitions]
    return {
        f"{prefix}/min": float(min(before)),
        f"{prefix}/max": float(max(before)),
        f"{prefix}/minmax_diff": float(max(before) - min(before)),
        f"{prefix}/balanced_min": float(min(after)),
        f"{prefix}/balanced_max": float(max(after)),
    }


# ---------------------------------------------------------------------------------------------
# removing padding inside a micro-batch
# ---------------------------------------------------------------------------------------------


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
    out = module(
        input_ids=p_ids, attention_mask=None if full_prompts else p_mask, position_ids=p_pos, use_cache=True, **extra
    )
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
