"""`DataProto.repeat` builds its tensors with repeat_interleave / repeat instead of TensorDict
indexing: the result must equal row selection (`select_idxs`) for both modes, every tensor rank
and dtype, own its storage, and keep non-tensor rows and meta_info aligned."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from verl.protocol import DataProto


def _data(n=4):
    tensors = {
        "ids": torch.arange(n * 3).view(n, 3),
        "mask": torch.ones(n, 3, dtype=torch.bool),
        "emb": torch.randn(n, 2, 5),
        "score": torch.arange(n, dtype=torch.float32),
    }
    non_tensors = {
        "uid": np.array([f"u{i}" for i in range(n)], dtype=object),
        "obj": np.array([{"i": i} for i in range(n)], dtype=object),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info={"k": 1})


@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("times", [1, 3])
def test_repeat_equals_row_selection(interleave, times):
    d = _data()
    rows = np.repeat(np.arange(4), times) if interleave else np.tile(np.arange(4), times)
    got, want = d.repeat(times, interleave=interleave), d.select_idxs(rows)
    assert len(got) == 4 * times and got.batch.batch_size == want.batch.batch_size
    for k in want.batch.keys():
        assert got.batch[k].dtype == want.batch[k].dtype
        assert torch.equal(got.batch[k], want.batch[k]), k
    for k in want.non_tensor_batch:
        assert list(got.non_tensor_batch[k]) == list(want.non_tensor_batch[k]), k
    assert got.meta_info == {"k": 1} and got.meta_info is not d.meta_info
    # fresh storage: writing into the repeat leaves the source alone
    got.batch["ids"][0, 0] = -5
    assert d.batch["ids"][0, 0] == 0


def test_repeat_zero_and_nested_tensordict_fall_back_to_selection():
    d = _data()
    assert len(d.repeat(0)) == 0
    nested = DataProto(
        batch=TensorDict(
            {"a": torch.arange(3), "sub": TensorDict({"b": torch.arange(3) * 2}, batch_size=[3])}, batch_size=[3]
        )
    )
    r = nested.repeat(2, interleave=True)
    assert r.batch["sub", "b"].tolist() == [0, 0, 2, 2, 4, 4] and r.batch["a"].tolist() == [0, 0, 1, 1, 2, 2]
