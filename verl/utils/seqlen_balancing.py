"""Forming micro-batches by length, and balancing sequence lengths across data-parallel ranks.

Cost model. The engines pad each micro-batch only to the longest sequence *in that micro-batch*
(after removing every row's own padding, see `verl.workers.engine.padding_free`), so a micro-batch of `m` rows
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

Removing the padding inside a micro-batch (`compact_rows`, `response_outputs`) and sharing repeated
prompts (`group_shared_prompts`, `shared_prefix_outputs`) are model-forward concerns: they live in
`verl.workers.engine.padding_free`.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

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
