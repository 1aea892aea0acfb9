"""DataProto: construction, row operations, merging, padding, iteration, serialisation."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from verl import DataProto
from verl.protocol import (
    DataProtoConfig,
    DataProtoItem,
    collate_fn,
    fold_batch_dim,
    list_of_dict_to_dict_of_list,
    pad_dataproto_to_divisor,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
)


def make(n: int = 6, meta=None) -> DataProto:
    """n rows: ids (n, 3) int64, mask (n, 3) bool, score (n,) float; uid str, info dict, tags list."""
    ids = torch.arange(n * 3, dtype=torch.int64).reshape(n, 3)
    return DataProto.from_dict(
        tensors={"ids": ids, "mask": ids % 2 == 0, "score": torch.arange(n, dtype=torch.float32) / 2},
        non_tensors={
            "uid": [f"u{i}" for i in range(n)],
            "info": [{"i": i, "even": i % 2 == 0} for i in range(n)],
            "tags": [[i, i + 1] for i in range(n)],
        },
        meta_info=dict(meta or {"temperature": 1.0}),
    )


def rows(data: DataProto) -> list[int]:
    """Original row numbers, recovered from `score` (= row / 2)."""
    return (data.batch["score"] * 2).round().long().tolist()


def assert_same(a: DataProto, b: DataProto) -> None:
    assert len(a) == len(b)
    assert set(a.batch.keys()) == set(b.batch.keys())
    for k in a.batch.keys():
        assert a.batch[k].dtype == b.batch[k].dtype and torch.equal(a.batch[k], b.batch[k]), k
    assert a.non_tensor_batch.keys() == b.non_tensor_batch.keys()
    for k in a.non_tensor_batch:
        assert a.non_tensor_batch[k].tolist() == b.non_tensor_batch[k].tolist(), k
    assert a.meta_info == b.meta_info


# ----------------------------------------------------------------------------- construction


def test_from_dict_keeps_lists_of_lists_one_dimensional():
    d = make(4)
    assert len(d) == 4
    tags = d.non_tensor_batch["tags"]
    assert tags.dtype == object and tags.shape == (4,) and tags[2] == [2, 3]
    assert d.non_tensor_batch["info"][1] == {"i": 1, "even": False}
    assert d.meta_info == {"temperature": 1.0}


def test_from_single_dict_sorts_tensors_from_objects():
    d = DataProto.from_single_dict(
        {"x": torch.zeros(3, 2), "s": np.array(["a", "b", "c"], dtype=object), "l": ["p", "q", "r"]}, meta_info={"k": 1}
    )
    assert list(d.batch.keys()) == ["x"]
    assert sorted(d.non_tensor_batch) == ["l", "s"]
    assert d.non_tensor_batch["l"].tolist() == ["p", "q", "r"]
    with pytest.raises(TypeError, match="'bad'"):
        DataProto.from_single_dict({"bad": 3})


def test_row_count_mismatch_names_the_key():
    with pytest.raises(ValueError, match="'b'.*3 rows.*'a'.*2"):
        DataProto.from_dict({"a": torch.zeros(2), "b": torch.zeros(3)})
    with pytest.raises(ValueError, match="'s'.*3 rows"):
        DataProto.from_dict({"a": torch.zeros(2)}, {"s": ["x", "y", "z"]})
    with pytest.raises(TypeError, match="'s'.*np.ndarray"):
        DataProto(batch=TensorDict({"a": torch.zeros(2)}, batch_size=[2]), non_tensor_batch={"s": ["x", "y"]})
    with pytest.raises(ValueError, match="0-d"):
        DataProto.from_dict({"a": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="one batch dimension"):
        DataProto(batch=TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3]))


def test_without_tensors_or_without_objects():
    only_objects = DataProto.from_dict(non_tensors={"s": ["a", "b", "c"]})
    assert only_objects.batch is None and len(only_objects) == 3
    assert only_objects[1:].non_tensor_batch["s"].tolist() == ["b", "c"]
    assert [len(c) for c in only_objects.chunk(3)] == [1, 1, 1]
    assert len(DataProto.concat([only_objects, only_objects])) == 6
    only_tensors = DataProto.from_dict({"x": torch.arange(4)})
    assert only_tensors.non_tensor_batch == {}
    again = pickle.loads(pickle.dumps(only_tensors))
    assert torch.equal(again.batch["x"], torch.arange(4)) and again.non_tensor_batch == {}
    assert len(DataProto()) == 0


# ----------------------------------------------------------------------------- indexing


def test_int_index_gives_item_and_supports_negative():
    d = make(5)
    item = d[-1]
    assert isinstance(item, DataProtoItem)
    assert item.batch["ids"].tolist() == [12, 13, 14]
    assert item.non_tensor_batch["uid"] == "u4"
    assert item.meta_info == d.meta_info
    with pytest.raises(IndexError, match="row 5"):
        d[5]


def test_slice_is_a_view():
    d = make(6)
    part = d[1:5:2]
    assert rows(part) == [1, 3]
    assert part.non_tensor_batch["uid"].tolist() == ["u1", "u3"]
    view = d[2:4]
    view.batch["ids"][0, 0] = -7
    assert d.batch["ids"][2, 0] == -7
    assert rows(d.slice(None, None, -2)) == [5, 3, 1]


@pytest.mark.parametrize("index", [[4, 0, 4], np.array([4, 0, 4]), torch.tensor([4, 0, 4]), [-2, 0, -2]])
def test_index_lists_arrays_tensors(index):
    d = make(6)
    picked = d[index]
    expected = [4, 0, 4]
    assert rows(picked) == expected
    assert picked.non_tensor_batch["uid"].tolist() == [f"u{i}" for i in expected]
    assert picked.non_tensor_batch["tags"][1] == [0, 1]


@pytest.mark.parametrize("kind", ["list", "numpy", "torch"])
def test_bool_mask_index(kind):
    d = make(5)
    mask = [True, False, False, True, True]
    mask = {"list": mask, "numpy": np.array(mask), "torch": torch.tensor(mask)}[kind]
    picked = d[mask]
    assert rows(picked) == [0, 3, 4]
    assert picked.non_tensor_batch["info"][1]["i"] == 3
    with pytest.raises(IndexError, match="4 entries.*5 rows"):
        d[[True, False, True, True]]


def test_index_errors_and_empty_selection():
    d = make(3)
    with pytest.raises(IndexError, match="row index 3"):
        d[[0, 3]]
    with pytest.raises(TypeError, match="integers or bools"):
        d[np.array([0.5])]
    with pytest.raises(TypeError):
        d["ids"]
    empty = d[[]]
    assert len(empty) == 0 and empty.batch["ids"].shape == (0, 3) and empty.non_tensor_batch["uid"].shape == (0,)


def test_iteration_yields_items():
    d = make(3)
    assert [item.non_tensor_batch["uid"] for item in d] == ["u0", "u1", "u2"]


# ----------------------------------------------------------------------------- select / pop / rename / union


def test_select_and_deepcopy():
    d = make(4, meta={"a": 1, "b": [1]})
    s = d.select(batch_keys=["ids"], non_tensor_batch_keys=["uid"], meta_info_keys=["a"])
    assert list(s.batch.keys()) == ["ids"] and list(s.non_tensor_batch) == ["uid"] and s.meta_info == {"a": 1}
    assert s.batch["ids"].data_ptr() == d.batch["ids"].data_ptr()
    s.batch["new"] = torch.zeros(4)
    assert "new" not in d.batch.keys()
    deep = d.select(deepcopy=True)
    deep.batch["ids"][0, 0] = 99
    deep.meta_info["b"].append(2)
    deep.non_tensor_batch["info"][0]["i"] = 42
    assert d.batch["ids"][0, 0] == 0 and d.meta_info["b"] == [1] and d.non_tensor_batch["info"][0]["i"] == 0
    with pytest.raises(KeyError, match="'nope'"):
        d.select(batch_keys=["nope"])
    with pytest.raises(KeyError, match="'nope'"):
        d.select(non_tensor_batch_keys=["nope"])


def test_pop_removes_and_returns():
    d = make(3, meta={"a": 1, "b": 2})
    popped = d.pop(batch_keys=["mask"], non_tensor_batch_keys=["tags"], meta_info_keys=["b"])
    assert (
        list(popped.batch.keys()) == ["mask"]
        and list(popped.non_tensor_batch) == ["tags"]
        and popped.meta_info == {"b": 2}
    )
    assert "mask" not in d.batch.keys() and "tags" not in d.non_tensor_batch and d.meta_info == {"a": 1}
    with pytest.raises(KeyError, match="'ghost'"):
        d.pop(batch_keys=["ids", "ghost"])
    assert "ids" in d.batch.keys()  # nothing removed when a key is missing


def test_rename():
    d = make(2)
    d.rename(old_keys=["ids", "uid"], new_keys=["input_ids", "id"])
    assert "input_ids" in d.batch.keys() and "ids" not in d.batch.keys()
    assert "id" in d.non_tensor_batch and "uid" not in d.non_tensor_batch
    with pytest.raises(ValueError, match="as many new keys"):
        d.rename(["a", "b"], ["c"])
    with pytest.raises(KeyError, match="'zzz'"):
        d.rename("zzz", "y")


def test_union_merges_and_refuses_conflicts():
    d = make(3)
    other = DataProto.from_dict(
        {"ids": d.batch["ids"].clone(), "extra": torch.ones(3)},
        {"uid": d.non_tensor_batch["uid"].copy(), "more": [1, 2, 3]},
        meta_info={"temperature": 1.0, "step": 4},
    )
    d.union(other)
    assert {"ids", "extra"} <= set(d.batch.keys()) and "more" in d.non_tensor_batch and d.meta_info["step"] == 4
    clash = DataProto.from_dict({"ids": torch.zeros(3, 3, dtype=torch.int64)})
    with pytest.raises(ValueError, match="'ids'"):
        make(3).union(clash)
    with pytest.raises(ValueError, match="'uid'"):
        make(3).union(DataProto.from_dict(non_tensors={"uid": ["x", "y", "z"]}))
    with pytest.raises(ValueError, match="'temperature'"):
        make(3).union(DataProto.from_dict({"z": torch.zeros(3)}, meta_info={"temperature": 0.5}))
    with pytest.raises(ValueError, match="3 and 2 rows"):
        make(3).union(make(2))


def test_union_helpers_compare_objects_and_nan():
    a = {"x": np.array([{"k": [1, 2]}, float("nan")], dtype=object)}
    b = {"x": np.array([{"k": [1, 2]}, float("nan")], dtype=object), "y": np.array([1, 2])}
    assert sorted(union_numpy_dict(a, b)) == ["x", "y"]
    with pytest.raises(ValueError, match="'x'"):
        union_numpy_dict({"x": np.array([1, 2])}, {"x": np.array([1, 3])})
    t1 = TensorDict({"a": torch.ones(2)}, batch_size=[2])
    union_tensor_dict(t1, TensorDict({"a": torch.ones(2), "b": torch.zeros(2)}, batch_size=[2]))
    assert set(t1.keys()) == {"a", "b"}


# ----------------------------------------------------------------------------- concat / chunk / split


def test_concat_rows_and_meta_info():
    a = make(2, meta={"temperature": 1.0, "metrics": {"loss": [0.5, 0.25], "lr": 1e-3}})
    b = make(3, meta={"temperature": 1.0, "metrics": {"loss": 0.75, "lr": 1e-3}, "only_b": "x"})
    c = DataProto.concat([a, b])
    assert len(c) == 5 and rows(c) == [0, 1, 0, 1, 2]
    assert c.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u0", "u1", "u2"]
    assert c.meta_info["temperature"] == 1.0 and c.meta_info["only_b"] == "x"
    # one entry per part, as upstream: part 0's list stays a list
    assert c.meta_info["metrics"] == {"loss": [[0.5, 0.25], 0.75], "lr": [1e-3, 1e-3]}
    listed = DataProto.concat([make(1, meta={"metrics": [{"m": 1}, {"m": 2}]}), make(1, meta={"metrics": {"m": 3}})])
    assert listed.meta_info["metrics"] == {"m": [1, 2, 3]}  # a list of dicts gives one entry per dict
    skipped = DataProto.concat([make(1, meta={"metrics": None}), make(1)])
    assert "metrics" not in skipped.meta_info


def test_concat_conflicting_meta_names_key():
    with pytest.raises(ValueError, match=r"meta_info\['temperature'\].*part 0.*part 1"):
        DataProto.concat([make(2, meta={"temperature": 1.0}), make(2, meta={"temperature": 0.7})])


def test_concat_key_mismatch_and_empty_parts():
    with pytest.raises(ValueError, match="keys"):
        DataProto.concat([make(2), make(2).select(batch_keys=["ids"])])
    with pytest.raises(ValueError, match="non_tensor_batch keys"):
        DataProto.concat([make(2), make(2).select(non_tensor_batch_keys=["uid"])])
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])
    joined = DataProto.concat([DataProto(meta_info={"temperature": 1.0}), make(2)])
    assert len(joined) == 2


def test_chunk_even_and_uneven():
    d = make(6)
    parts = d.chunk(3)
    assert [rows(p) for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert parts[1].non_tensor_batch["uid"].tolist() == ["u2", "u3"]
    assert_same(DataProto.concat(parts), d)
    with pytest.raises(ValueError, match="5 rows cannot be split into 2 equal chunks"):
        make(5).chunk(2)
    padded = make(5)
    padded.meta_info[DataProtoConfig.auto_padding_key] = True
    assert [rows(p) for p in padded.chunk(2)] == [[0, 1, 2], [3, 4]]
    assert [len(p) for p in padded.chunk(7)] == [1, 1, 1, 1, 1, 0, 0]
    # upstream's sizes: TensorDict.chunk with a tensor batch (ceil(10 / 4) = 3 per piece) ...
    ten = make(10, meta={DataProtoConfig.auto_padding_key: True})
    assert [len(p) for p in ten.chunk(4)] == [3, 3, 3, 1]
    # ... where torch would return only 3 pieces for 5 rows in 4, the 4th is empty
    assert [len(p) for p in padded.chunk(4)] == [2, 2, 1, 0]
    # ... and np.array_split without one
    no_batch = DataProto.from_dict(non_tensors={"s": list("abcdefghij")}, auto_padding=True)
    assert [p.non_tensor_batch["s"].tolist() for p in no_batch.chunk(4)] == [
        list("abc"),
        list("def"),
        list("gh"),
        list("ij"),
    ]
    with pytest.raises(ValueError, match="positive int"):
        d.chunk(0)


def test_auto_padding_process_switch():
    assert not DataProtoConfig.auto_padding
    DataProtoConfig.auto_padding = True
    try:
        assert make(5).is_padding_enabled()
        assert [len(p) for p in make(5).chunk(2)] == [3, 2]
    finally:
        DataProtoConfig.auto_padding = False
    assert not make(5).is_padding_enabled()
    assert DataProto.from_dict({"x": torch.zeros(3)}, auto_padding=True).is_padding_enabled()


def test_split():
    assert [rows(p) for p in make(5).split(2)] == [[0, 1], [2, 3], [4]]
    assert make(0).split(2) == []


# ----------------------------------------------------------------------------- padding


def test_pad_and_unpad():
    d = make(5)
    padded, pad = pad_dataproto_to_divisor(d, 4)
    assert pad == 3 and len(padded) == 8 and rows(padded) == [0, 1, 2, 3, 4, 0, 1, 2]
    assert len(d) == 5  # input untouched
    assert_same(unpad_dataproto(padded, pad), d)
    small, pad = pad_dataproto_to_divisor(make(2), 7)
    assert pad == 5 and rows(small) == [0, 1, 0, 1, 0, 1, 0]
    same, pad = pad_dataproto_to_divisor(d, 5)
    assert pad == 0 and same is d
    empty, pad = pad_dataproto_to_divisor(make(0), 2)
    assert pad == 0 and len(empty) == 0


def test_padding_in_place_repeats_last_or_first():
    d = make(3)
    d.padding(2)
    assert rows(d) == [0, 1, 2, 2, 2]
    e = make(3)
    e.padding(1, padding_candidate="first")
    assert rows(e) == [0, 1, 2, 0]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), world=st.integers(1, 8))
def test_pad_chunk_concat_unpad_round_trip(n, world):
    d = make(n)
    padded, pad = pad_dataproto_to_divisor(d, world)
    parts = padded.chunk(world)
    assert len({len(p) for p in parts}) == 1
    assert_same(unpad_dataproto(DataProto.concat(parts), pad), d)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_select_idxs_matches_numpy(data):
    n = data.draw(st.integers(1, 20))
    idx = data.draw(st.lists(st.integers(-n, n - 1), max_size=30))
    d = make(n)
    expected = (np.arange(n)[np.array(idx, dtype=np.int64)]).tolist() if idx else []
    picked = d.select_idxs(idx)
    assert rows(picked) == expected
    assert picked.non_tensor_batch["uid"].tolist() == [f"u{i}" for i in expected]


# ----------------------------------------------------------------------------- repeat / reorder / fold


def test_repeat_interleave_and_tile():
    d = make(3)
    assert rows(d.repeat(2, interleave=True)) == [0, 0, 1, 1, 2, 2]
    tiled = d.repeat(2, interleave=False)
    assert rows(tiled) == [0, 1, 2, 0, 1, 2]
    assert tiled.non_tensor_batch["tags"][4] == [1, 2]
    assert len(d.repeat(0)) == 0


def test_sample_level_repeat():
    d = make(3)
    assert rows(d.sample_level_repeat([2, 0, 3])) == [0, 0, 2, 2, 2]
    assert rows(d.sample_level_repeat(torch.tensor([1, 1, 2]))) == [0, 1, 2, 2]
    assert rows(d.sample_level_repeat(2)) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="one count per row"):
        d.sample_level_repeat([1, 2])
    with pytest.raises(ValueError, match="non-negative"):
        d.sample_level_repeat([1, -1, 1])


def test_reorder_in_place():
    d = make(4)
    d.reorder(torch.tensor([3, 1, 0, 2]))
    assert rows(d) == [3, 1, 0, 2]
    assert d.non_tensor_batch["uid"].tolist() == ["u3", "u1", "u0", "u2"]


def test_fold_and_unfold_batch_dim():
    d = make(6)
    folded = fold_batch_dim(d, 2)
    assert len(folded) == 2 and folded.batch["ids"].shape == (2, 3, 3)
    assert folded.non_tensor_batch["uid"].tolist() == [["u0", "u1", "u2"], ["u3", "u4", "u5"]]
    assert_same(unfold_batch_dim(folded, batch_dims=2), d)
    with pytest.raises(ValueError, match="fold 6 rows into batch size 4"):
        fold_batch_dim(d, 4)


def test_unfold_column_chunks():
    d = DataProto.from_dict({"pair": torch.arange(8).reshape(2, 4), "w": torch.tensor([10, 20])}, {"s": ["a", "b"]})
    out = d.unfold_column_chunks(2, split_keys=["pair"])
    assert out.batch["pair"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert out.batch["w"].tolist() == [10, 10, 20, 20]
    assert out.non_tensor_batch["s"].tolist() == ["a", "a", "b", "b"]


def test_collate_fn_rebuilds_batch():
    d = make(4)
    rebuilt = collate_fn([d[i] for i in range(4)])
    assert_same(rebuilt, d.select(meta_info_keys=[]))
    assert rebuilt.non_tensor_batch["tags"].shape == (4,)


def test_list_of_dict_to_dict_of_list():
    assert list_of_dict_to_dict_of_list([{"a": 1, "b": 2}, {"a": 3, "b": 4}]) == {"a": [1, 3], "b": [2, 4]}
    with pytest.raises(ValueError, match="dict 1"):
        list_of_dict_to_dict_of_list([{"a": 1}, {"b": 2}])


# ----------------------------------------------------------------------------- iteration


def test_make_iterator_in_order_and_shuffled():
    d = make(6, meta={"epoch_info": "x"})
    plain = [rows(mb) for mb in d.make_iterator(mini_batch_size=2, epochs=2)]
    assert plain == [[0, 1], [2, 3], [4, 5]] * 2
    first = [rows(mb) for mb in d.make_iterator(2, 2, seed=7, dataloader_kwargs={"shuffle": True})]
    again = [rows(mb) for mb in d.make_iterator(2, 2, seed=7, dataloader_kwargs={"shuffle": True})]
    assert first == again
    epoch1, epoch2 = sum(first[:3], []), sum(first[3:], [])
    assert sorted(epoch1) == sorted(epoch2) == list(range(6))
    assert epoch1 != epoch2 or epoch1 != list(range(6))  # shuffled at least once (seeded, deterministic)
    mb = next(d.make_iterator(2, 1, seed=7, dataloader_kwargs={"shuffle": True}))
    assert mb.meta_info == {"epoch_info": "x"}
    for mb in d.make_iterator(2, 1, seed=3, dataloader_kwargs={"shuffle": True}):
        assert [u for u in mb.non_tensor_batch["uid"]] == [f"u{r}" for r in rows(mb)]


def test_make_iterator_validation():
    d = make(5)
    with pytest.raises(ValueError, match="5 rows do not divide into mini-batches of 2"):
        list(d.make_iterator(2, 1))
    assert [len(mb) for mb in d.make_iterator(2, 1, dataloader_kwargs={"drop_last": True})] == [2, 2]
    with pytest.raises(ValueError, match="batch_size"):
        list(d.make_iterator(1, 1, dataloader_kwargs={"batch_size": 2}))


def test_make_iterator_matches_upstream_dataloader_order_and_object_dtype():
    # upstream iterates DataLoader(dataset=self, batch_size=mini_batch_size, generator=Generator
    # seeded once, **dataloader_kwargs) once per epoch; the same seed must give the same rows
    n, mbs, epochs, seed = 8, 2, 3, 11
    d = DataProto.from_dict(tensors={"ids": torch.arange(n)}, non_tensors={"k": np.arange(n)})
    got = [
        mb.batch["ids"].tolist() for mb in d.make_iterator(mbs, epochs, seed=seed, dataloader_kwargs={"shuffle": True})
    ]
    g = torch.Generator()
    g.manual_seed(seed)
    loader = torch.utils.data.DataLoader(list(range(n)), batch_size=mbs, shuffle=True, generator=g)
    expected = [b.tolist() for _ in range(epochs) for b in loader]
    assert got == expected and len(got) == 12
    # by hand for the first epoch: the loader's iterator draws one int64 from the generator
    # (its base seed), then the sampler takes randperm(n) from the same generator
    g2 = torch.Generator()
    g2.manual_seed(seed)
    torch.empty((), dtype=torch.int64).random_(generator=g2)
    perm = torch.randperm(n, generator=g2).tolist()
    assert got[:4] == [perm[i : i + mbs] for i in range(0, n, mbs)]
    mb = next(d.make_iterator(mbs, 1))
    assert mb.non_tensor_batch["k"].dtype == object and mb.non_tensor_batch["k"].tolist() == [0, 1]


# ----------------------------------------------------------------------------- devices, info, files


def test_to_device_in_place():
    d = make(2)
    assert d.to("cpu") is d
    assert d.to(torch.device("cpu")).batch["ids"].device.type == "cpu"


def test_info_and_size(capsys):
    d = make(2)
    info = d.get_data_info()
    assert "ids: shape=(2, 3)" in info and "uid" in info and "temperature" in info
    d.print_size(prefix="[x] ")
    printed = capsys.readouterr().out
    assert printed.startswith("[x] size of tensordict:") and "non_tensor_batch" in printed
    assert "len=2" in repr(d)


def test_save_and_load(tmp_path):
    d = make(4, meta={"metrics": {"a": [1.0]}, "step": 3})
    d.batch["half"] = torch.randn(4, 2).to(torch.bfloat16)
    path = tmp_path / "sub" / "batch.pkl"
    d.save_to_disk(str(path))
    loaded = DataProto.load_from_disk(str(path))
    assert_same(loaded, d)
    assert loaded.batch["half"].dtype == torch.bfloat16
    assert list(path.parent.iterdir()) == [path]  # no temp files left behind


def test_tensordict_round_trip():
    d = make(3, meta={"step": 2})
    td = d.to_tensordict()
    back = DataProto.from_tensordict(td)
    assert_same(back, d)
    with pytest.raises(ValueError, match="'uid'"):
        DataProto(
            batch=TensorDict({"uid": torch.zeros(1)}, batch_size=[1]),
            non_tensor_batch={"uid": np.array(["x"], dtype=object)},
        ).to_tensordict()


# ----------------------------------------------------------------------------- pickling


def test_pickle_round_trip_all_dtypes_and_views():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    d = DataProto.from_dict(
        {
            "f32": base,
            "bf16": base.to(torch.bfloat16),
            "bool": base > 5,
            "i8": base.to(torch.int8),
            "strided": base[:, ::2],  # non-contiguous view
            "empty": torch.zeros(4, 0),
        },
        {"obj": [{"a": [1]}, None, "s", 3.5]},
        meta_info={"k": [1, 2]},
    )
    back = pickle.loads(pickle.dumps(d))
    for k in d.batch.keys():
        assert back.batch[k].dtype == d.batch[k].dtype and torch.equal(back.batch[k], d.batch[k]), k
    assert back.non_tensor_batch["obj"].tolist() == [{"a": [1]}, None, "s", 3.5]
    assert back.meta_info == {"k": [1, 2]}


def test_pickle_has_no_per_row_objects_for_tensors():
    d = DataProto.from_dict({"tokens": torch.zeros(256, 1024, dtype=torch.int64)})
    buffers = []
    payload = pickle.dumps(d, protocol=5, buffer_callback=buffers.append)
    assert len(payload) < 4096  # the 2 MiB of tokens travel out of band, as one buffer
    assert sum(b.raw().nbytes for b in buffers) == 256 * 1024 * 8
    back = pickle.loads(payload, buffers=[memoryview(bytes(b.raw())) for b in buffers])  # read-only buffers
    back.batch["tokens"][0, 0] = 5  # must be writable (copied out of the read-only buffer)
    assert back.batch["tokens"][0, 0] == 5


def test_pickle_falls_back_for_non_tensor_entries_in_batch():
    from tensordict.tensorclass import NonTensorData

    td = TensorDict({"x": torch.ones(2)}, batch_size=[2])
    td["note"] = NonTensorData("hello", batch_size=[2])
    back = pickle.loads(pickle.dumps(DataProto(batch=td)))
    assert back.batch.get("note").data == "hello"


def test_round_trip_through_ray(ray_session):
    ray = ray_session
    d = make(5, meta={"metrics": {"x": [1]}})
    d.batch["half"] = torch.ones(5, 2, dtype=torch.bfloat16)
    back = ray.get(ray.put(d))
    assert_same(back, d)
    back.batch["ids"][0, 0] = -1  # writable although it came from Ray's shared memory
    assert d.batch["ids"][0, 0] == 0
    # transport into worker processes is exercised by tests/test_single_controller.py


def test_state_is_plain_buffers():
    d = make(2)
    state = d.__getstate__()
    assert state["batch"]["format"] == "buffers"
    buf = io.BytesIO()
    pickle.dump(d, buf)
    assert len(buf.getvalue()) < 2048


# ----------------------------------------------------------------------------- upstream helpers


def test_serialize_single_tensor_and_tensordict_round_trip():
    from verl.protocol import (
        deserialize_single_tensor,
        deserialize_tensordict,
        serialize_single_tensor,
        serialize_tensordict,
    )

    t = torch.tensor([[1.5, -2.0], [0.25, 4.0]], dtype=torch.bfloat16)
    dtype, shape, data = serialize_single_tensor(t)
    assert dtype == "bfloat16" and shape == (2, 2) and data.dtype == np.uint8 and data.size == 8  # 4 x 2 bytes
    back = deserialize_single_tensor((dtype, shape, data))
    assert back.dtype == torch.bfloat16 and torch.equal(back, t)
    back[0, 0] = 0  # writable, and the source is untouched
    assert t[0, 0].item() == 1.5
    assert deserialize_single_tensor(serialize_single_tensor(torch.zeros(0, 3))).shape == (0, 3)
    with pytest.raises(ValueError, match="unknown tensor dtype 'nope'"):
        deserialize_single_tensor(("nope", (1,), np.zeros(1, dtype=np.uint8)))

    nested = torch.nested.as_nested_tensor([torch.arange(2), torch.arange(3)], layout=torch.jagged)
    td = TensorDict({"x": torch.arange(4).reshape(2, 2), "n": nested}, batch_size=[2])
    bs, device, items = serialize_tensordict(td)
    assert (
        bs == (2,) and device is None and len(items["x"]) == 3 and items["n"][0] == "jagged" and len(items["n"][1]) == 2
    )
    td2 = deserialize_tensordict(pickle.loads(pickle.dumps((bs, device, items))))
    assert torch.equal(td2["x"], td["x"]) and [r.tolist() for r in td2["n"].unbind()] == [[0, 1], [0, 1, 2]]
    with pytest.raises(ValueError, match="expected length 2 or 3, got 1"):
        deserialize_tensordict(((1,), None, {"bad": ("x",)}))


def test_batch_data_chunk_and_concat():
    from verl.protocol import BatchData

    d = make(4)
    assert BatchData(d).is_chunkable() and not BatchData([d]).is_chunkable()
    parts = BatchData(d).chunk(2)
    assert [rows(p) for p in parts] == [[0, 1], [2, 3]]
    assert BatchData(parts).is_concatable()
    assert_same(BatchData(parts).concat(), d)
    td = TensorDict({"x": torch.arange(4)}, batch_size=[4])
    tparts = BatchData(td).chunk(2)
    assert [p["x"].tolist() for p in tparts] == [[0, 1], [2, 3]]
    assert BatchData(tparts).concat()["x"].tolist() == [0, 1, 2, 3]
    assert not BatchData([]).is_concatable() and not BatchData([d, td]).is_concatable()
    with pytest.raises(TypeError, match="non-empty list of DataProto"):
        BatchData([d, td]).concat()
    with pytest.raises(TypeError, match="not chunkable"):
        BatchData(3).chunk(2)


def test_print_summary(capsys):
    make(2, meta={"temperature": 0.5, "hist": [1, 2, 3]}).print_summary("rollout")
    out = capsys.readouterr().out
    assert out.startswith("--- start of rollout ---") and out.rstrip().endswith("--- end of rollout ---")
    assert "meta_info: temperature: 0.5" in out and "len=3" in out and "ids" in out and "uid" in out


def test_conflicts_are_value_and_assertion_errors_as_upstream_asserts():
    a, b = make(2, meta={"temperature": 1.0}), make(2, meta={"temperature": 0.5})
    for call in (lambda: DataProto.concat([a, b]), lambda: make(2).union(b), lambda: make(2).union(make(3))):
        with pytest.raises(AssertionError):
            call()
        with pytest.raises(ValueError):
            call()
    other = make(2)
    other.non_tensor_batch["uid"] = np.array(["x", "y"], dtype=object)
    with pytest.raises(AssertionError, match="'uid'"):
        make(2).union(other)


def test_upstream_error_words_and_assertion_compatibility():
    d = make(6)
    with pytest.raises(AssertionError, match="only support equal chunk. Got size of DataProto 6 and chunk 5"):
        d.chunk(5)
    with pytest.raises(AssertionError, match="Conflicting values for meta_info key 'config'"):
        DataProto.concat([make(1, meta={"config": "A"}), make(1, meta={"config": "B"})])
    with pytest.raises(AssertionError, match="`nd` in tensor_dict1 and tensor_dict2 are not the same object."):
        union_numpy_dict({"nd": np.arange(3)}, {"nd": np.arange(3) + 1})
    with pytest.raises(AssertionError, match="only support num_batch_dims=1"):
        DataProto.from_dict(tensors={"x": torch.ones(2, 2)}, num_batch_dims=2)
    with pytest.raises(AssertionError, match="5 % 2 != 0"):
        list(make(5).make_iterator(2, 1))


def test_unfold_column_chunks_splits_per_row_sequences():
    data = DataProto.from_dict(
        tensors={"obs1": torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]), "obs2": torch.tensor([[1], [5]])},
        non_tensors={"labels": [["a1", "a2"], ["b1", "b2"]]},
        meta_info={"name": "abc"},
    )
    ret = data.unfold_column_chunks(2, split_keys=["obs1", "labels"])
    assert ret.batch["obs1"].tolist() == [[1, 2], [3, 4], [5, 6], [7, 8]]
    assert ret.batch["obs2"].tolist() == [[1], [1], [5], [5]]
    assert ret.non_tensor_batch["labels"].tolist() == [["a1"], ["a2"], ["b1"], ["b2"]]
    # each new row holds its k items as columns (upstream's layout), so elementwise comparison labels
    # the rows right
    assert ret.non_tensor_batch["labels"].shape == (4, 1)
    assert (ret.non_tensor_batch["labels"] == [["a1"], ["a2"], ["b1"], ["b2"]]).all()
    assert ret.meta_info == {"name": "abc"}


def test_unfold_column_chunks_needs_rows_of_one_length():
    data = DataProto.from_dict(tensors={"x": torch.zeros(2, 2)}, non_tensors={"labels": [["a1", "a2"], ["b1"] * 4]})
    with pytest.raises(ValueError, match="'labels'.*row 1 has 4 items, row 0 has 2"):
        data.unfold_column_chunks(2, split_keys=["labels"])


# ----------------------------------------------------------------------------- futures without Ray


class _FakeRef:
    """Stands in for a backend's object ref: holds the value it resolves to."""

    def __init__(self, value):
        self.value = value


def _resolve_fake(refs, labels, timeout):
    return [r.value for r in refs]


def _ray_imports(path) -> list[str]:
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "ray"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ray":
            found.append(node.module)
    return found


def test_data_layer_imports_nothing_from_ray():
    from pathlib import Path

    import verl.protocol

    root = Path(verl.protocol.__file__).parent
    files = [root / "protocol.py", *sorted((root / "dataproto").glob("*.py")), root / "utils" / "protocol_utils.py"]
    assert {str(f.relative_to(root)): _ray_imports(f) for f in files} == {str(f.relative_to(root)): [] for f in files}


def test_future_resolves_through_the_registered_backend(monkeypatch):
    from verl.dataproto import futures
    from verl.protocol import BatchData, DataProtoFuture, WorkerCallError
    from verl.single_controller.ray import WorkerCallError as ray_worker_call_error

    assert DataProtoFuture is futures.DataProtoFuture and WorkerCallError is ray_worker_call_error  # one object
    monkeypatch.setattr(futures, "_ref_types", (_FakeRef,))
    monkeypatch.setattr(futures, "_default_resolve", _resolve_fake)
    parts = make(6).chunk(3)
    future = BatchData([_FakeRef(p) for p in parts]).concat()
    assert isinstance(future, DataProtoFuture) and future.resolve_fn is _resolve_fake
    halves = pickle.loads(pickle.dumps(future)).chunk(2)  # the resolver travels with the future
    assert [h.get().non_tensor_batch["uid"].tolist() for h in halves] == [["u0", "u1", "u2"], ["u3", "u4", "u5"]]
    assert not BatchData([_FakeRef(1), 2]).is_concatable()


def test_future_without_a_backend_says_what_to_import(monkeypatch):
    from verl.dataproto import futures
    from verl.protocol import DataProtoFuture

    monkeypatch.setattr(futures, "_ref_types", ())
    monkeypatch.setattr(futures, "_default_resolve", None)
    future = DataProtoFuture.concat([_FakeRef(make(2))])
    assert future.resolve_fn is None
    with pytest.raises(RuntimeError, match="no object-ref backend.*verl.single_controller.ray"):
        future.get()
    monkeypatch.setattr(futures, "_default_resolve", _resolve_fake)  # registered after the future was built
    assert len(future.get()) == 2
