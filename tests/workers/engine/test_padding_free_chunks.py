"""`padding_free.row_chunks`: the row chunks of a training micro-batch (whole prompt groups,
balanced token counts, None under the budget), with hand-counted tokens."""

from __future__ import annotations

import torch

from verl.workers.engine.padding_free import row_chunks

PAD = 0


def _batch(order):
    """Rows of prompt groups A (2 tokens), B (1 token, left-padded), C (2 tokens) with 2 prompt
    columns and 3 response columns; `order` lists each row's (group, response tokens)."""
    prompts = {"A": [5, 6], "B": [PAD, 7], "C": [8, 9]}
    ids, mask = [], []
    for group, n_resp in order:
        p = prompts[group]
        ids.append(p + [11] * n_resp + [PAD] * (3 - n_resp))
        mask.append([int(t != PAD) for t in p] + [1] * n_resp + [0] * (3 - n_resp))
    return torch.tensor(ids), torch.tensor(mask)


def test_groups_stay_whole_and_chunks_balance_tokens():
    # A: prompt 2 + responses 3 + 3 = 8 tokens, B: 1 + 2 + 2 = 5, C: 2 + 3 + 1 = 6; total 19
    ids, mask = _batch([("A", 3), ("A", 3), ("B", 2), ("B", 2), ("C", 3), ("C", 1)])
    assert row_chunks(ids, mask, 3, max_tokens=19) is None
    # 2 chunks of ~9.5 tokens: A's middle token (4) is in the first, B's (8 + 2.5) and C's (13 + 3) in the second
    assert [c.tolist() for c in row_chunks(ids, mask, 3, max_tokens=10)] == [[0, 1], [2, 3, 4, 5]]
    # 3 chunks of ~6.3 tokens: one group each
    assert [c.tolist() for c in row_chunks(ids, mask, 3, max_tokens=7)] == [[0, 1], [2, 3], [4, 5]]
    # a group larger than the budget is still one chunk
    assert [c.tolist() for c in row_chunks(ids, mask, 3, max_tokens=1)] == [[0, 1], [2, 3], [4, 5]]


def test_prompts_counted_per_row_without_the_prefix_grouper():
    # A: 2 * 2 + 6 = 10, B: 1 * 2 + 4 = 6, C: 2 * 2 + 4 = 8; total 24 -> 3 chunks of 8
    ids, mask = _batch([("A", 3), ("A", 3), ("B", 2), ("B", 2), ("C", 3), ("C", 1)])
    assert row_chunks(ids, mask, 3, max_tokens=23, share_prompts=False) is not None
    assert row_chunks(ids, mask, 3, max_tokens=19) is None  # shared prompts: 19 tokens
    chunks = row_chunks(ids, mask, 3, max_tokens=10, share_prompts=False)
    assert [c.tolist() for c in chunks] == [[0, 1], [2, 3], [4, 5]]


def test_scattered_groups_give_ascending_row_indices():
    ids, mask = _batch([("A", 3), ("B", 2), ("C", 3), ("A", 3), ("B", 2), ("C", 1)])
    chunks = row_chunks(ids, mask, 3, max_tokens=10)
    # groups in order of first appearance: A (rows 0, 3), then B (1, 4) and C (2, 5)
    assert [c.tolist() for c in chunks] == [[0, 3], [1, 2, 4, 5]]
    # one row, or one group: nothing to split
    assert row_chunks(ids[:1], mask[:1], 3, max_tokens=1) is None
    assert row_chunks(ids[[0, 3]], mask[[0, 3]], 3, max_tokens=1) is None
