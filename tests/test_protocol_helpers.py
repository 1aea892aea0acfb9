"""Helpers under the data layer: tensordict_utils, device selection, DynamicEnum."""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict

from verl.utils import device as device_utils
from verl.utils import tensordict_utils as tu
from verl.utils.py_functional import DynamicEnum, append_to_dict, config_get, union_two_dict

# ----------------------------------------------------------------------------- tensordict_utils


def test_get_tensordict_with_rows_and_batch_wide_values():
    td = tu.get_tensordict({"x": torch.arange(3), "turns": [[], [0.5], {"a": 1}]}, {"run": "exp1"})
    assert td.batch_size == torch.Size([3])
    assert tu.get(td, "turns") == [[], [0.5], {"a": 1}]
    assert tu.get(td, "run") == "exp1"
    assert torch.equal(tu.get(td, "x"), torch.arange(3))
    assert tu.get(td, "missing", default=7) == 7
    assert tu.get_non_tensor_data(td, "run", None) == "exp1"
    with pytest.raises(ValueError, match="'y'.*2 rows.*'x' has 3"):
        tu.get_tensordict({"x": torch.arange(3), "y": [1, 2]})
    with pytest.raises(ValueError, match="torch.Tensor items"):
        tu.get_tensordict({"x": [torch.zeros(1)]})
    with pytest.raises(ValueError, match="both"):
        tu.get_tensordict({"x": torch.arange(2)}, {"x": 1})


def test_get_keys_pop_keys_and_assign():
    td = tu.get_tensordict({"x": torch.arange(2), "s": ["a", "b"]}, {"m": 1})
    sub = tu.get_keys(td, ["s", "m"])
    assert tu.get(sub, "s") == ["a", "b"] and tu.get(sub, "m") == 1
    with pytest.raises(KeyError, match="'zz'"):
        tu.get_keys(td, ["zz"])
    popped = tu.pop_keys(td, ["x"])
    assert "x" not in td.keys() and torch.equal(tu.get(popped, "x"), torch.arange(2))
    assert tu.pop(td, "m") == 1 and tu.pop(td, "m", default="gone") == "gone"
    tu.assign_non_tensor(td, cfg={"lr": 1}, rows=[1, 2])
    assert tu.get(td, "cfg") == {"lr": 1} and tu.get(td, "rows") == [1, 2]
    with pytest.raises(KeyError, match="'nope'"):
        tu.pop_keys(td, ["nope"])


def test_concat_chunk_pad_unpad():
    a = TensorDict({"x": torch.arange(3)}, batch_size=[3])
    b = TensorDict({"x": torch.arange(3, 5)}, batch_size=[2])
    cat = tu.concat_tensordict([a, b])
    assert cat["x"].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="keys"):
        tu.concat_tensordict([a, TensorDict({"y": torch.arange(2)}, batch_size=[2])])
    assert [c["x"].tolist() for c in tu.chunk_tensordict(cat, 3)] == [[0, 1], [2, 3], [4]]
    assert [c.batch_size[0] for c in tu.chunk_tensordict(cat, 7)] == [1, 1, 1, 1, 1, 0, 0]
    padded, pad = tu.pad_to_divisor(cat, 4)
    assert pad == 3 and padded["x"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert tu.unpad(padded, pad)["x"].tolist() == [0, 1, 2, 3, 4]


def test_concat_nested_jagged_tensors():
    def jagged(*lengths):
        return torch.nested.as_nested_tensor(
            [torch.arange(n, dtype=torch.float32) for n in lengths], layout=torch.jagged
        )

    a = TensorDict({"seq": jagged(1, 3), "y": torch.zeros(2)}, batch_size=[2])
    b = TensorDict({"seq": jagged(2), "y": torch.ones(1)}, batch_size=[1])
    out = tu.concat_tensordict([a, b])
    assert [t.shape[0] for t in out["seq"].unbind()] == [1, 3, 2]
    assert out["y"].tolist() == [0, 0, 1]


def test_index_select_and_union():
    td = tu.get_tensordict({"x": torch.arange(4), "s": ["a", "b", "c", "d"]}, {"m": 5})
    picked = tu.index_select_tensor_dict(td, [3, 1])
    assert tu.get(picked, "x").tolist() == [3, 1] and tu.get(picked, "s") == ["d", "b"] and tu.get(picked, "m") == 5
    assert tu.index_select_tensor_dict(None, [0]) is None
    base = TensorDict({"x": torch.arange(2)}, batch_size=[2])
    tu.union_tensor_dict(base, TensorDict({"x": torch.arange(2), "y": torch.ones(2)}, batch_size=[2]))
    assert set(base.keys()) == {"x", "y"}
    with pytest.raises(ValueError, match="'x'"):
        tu.union_tensor_dict(base, TensorDict({"x": torch.ones(2)}, batch_size=[2]))


def test_assert_tensordict_eq_detects_differences():
    a = tu.get_tensordict({"x": torch.arange(2)}, {"m": 1})
    tu.assert_tensordict_eq(a, tu.get_tensordict({"x": torch.arange(2)}, {"m": 1}))
    with pytest.raises(AssertionError, match="'x'"):
        tu.assert_tensordict_eq(a, tu.get_tensordict({"x": torch.ones(2, dtype=torch.int64)}, {"m": 1}))
    with pytest.raises(AssertionError, match="key sets"):
        tu.assert_tensordict_eq(a, tu.get_tensordict({"y": torch.arange(2)}))


def test_state_round_trip_with_nested_keys():
    td = TensorDict(
        {"a": torch.arange(6).reshape(2, 3), "sub": {"b": torch.ones(2, dtype=torch.bfloat16)}}, batch_size=[2]
    )
    state = tu.tensordict_to_state(td)
    assert state["format"] == "buffers" and len(state["leaves"]) == 2
    back = pickle.loads(pickle.dumps(tu.tensordict_from_state(state)))
    assert torch.equal(back["a"], td["a"]) and back["sub", "b"].dtype == torch.bfloat16
    assert tu.tensordict_to_state(None) is None and tu.tensordict_from_state(None) is None


def test_make_iterator_over_tensordict():
    td = TensorDict({"x": torch.arange(4)}, batch_size=[4])
    assert [b["x"].tolist() for b in tu.make_iterator(td, 2, 1)] == [[0, 1], [2, 3]]
    shuffled = [b["x"].tolist() for b in tu.make_iterator(td, 2, 1, seed=0, dataloader_kwargs={"shuffle": True})]
    assert sorted(sum(shuffled, [])) == [0, 1, 2, 3]


# ----------------------------------------------------------------------------- device


def test_forced_cpu(monkeypatch):
    monkeypatch.setenv("VERL_DEVICE", "cpu")
    assert device_utils.get_device_name() == "cpu"
    assert device_utils.get_dist_backend() == "gloo"
    assert device_utils.get_nccl_backend() == "gloo"
    assert device_utils.get_device_id() == 0
    shim = device_utils.get_torch_device()
    assert shim is not torch.cuda
    shim.manual_seed(3)
    first = torch.rand(1)
    shim.set_rng_state(shim.get_rng_state())
    torch.manual_seed(3)
    assert torch.equal(first, torch.rand(1))
    assert shim.memory_allocated() == 0 and shim.device_count() == 1
    shim.synchronize(), shim.empty_cache(), shim.set_device(0)
    free, total = shim.mem_get_info()
    assert 0 <= free <= total


def test_auto_matches_torch(monkeypatch):
    monkeypatch.delenv("VERL_DEVICE", raising=False)
    cuda = torch.cuda.is_available()
    assert device_utils.get_device_name() == ("cuda" if cuda else "cpu")
    assert device_utils.get_dist_backend() == ("nccl" if cuda else "gloo")
    assert (device_utils.get_torch_device() is torch.cuda) == cuda


def test_bad_device_values(monkeypatch):
    monkeypatch.setenv("VERL_DEVICE", "tpu")
    with pytest.raises(ValueError, match="VERL_DEVICE='tpu'.*accepted"):
        device_utils.get_device_name()
    if not torch.cuda.is_available():
        monkeypatch.setenv("VERL_DEVICE", "cuda")
        with pytest.raises(RuntimeError, match="no CUDA device"):
            device_utils.get_device_name()


# ----------------------------------------------------------------------------- py_functional


class Color(DynamicEnum):
    _registry: dict = {}
    _next_value = 0


Color.register("RED")
Color.register("BLUE")


def test_dynamic_enum_members_and_pickling():
    assert Color.RED is Color["RED"] and Color.RED.value == 0 and Color.BLUE.value == 1
    assert pickle.loads(pickle.dumps(Color.BLUE)) is Color.BLUE
    assert "RED" in Color and Color.RED in Color and len(Color) == 2
    green = Color.register("GREEN")
    assert Color.GREEN is green and Color.from_name("GREEN") is green
    Color.remove("GREEN")
    with pytest.raises(AttributeError, match="GREEN"):
        _ = Color.GREEN
    with pytest.raises(ValueError, match="already registered"):
        Color.register("RED")


def test_dict_helpers():
    d = {"a": 1}
    union_two_dict(d, {"b": 2, "a": 1})
    assert d == {"a": 1, "b": 2}
    with pytest.raises(ValueError, match="'a'"):
        union_two_dict(d, {"a": 3})
    acc: dict = {}
    append_to_dict(acc, {"x": 1})
    append_to_dict(acc, {"x": 2, "y": 0})
    assert acc == {"x": [1, 2], "y": [0]}
    append_to_dict(acc, {"x": [3, 4], "p/z": 5}, prefix="p/")  # a list is added element by element
    assert acc == {"x": [1, 2], "y": [0], "p/x": [3, 4], "p/z": [5]}


def test_config_get_reads_dicts_dataclasses_dictconfig_and_objects():
    from dataclasses import dataclass

    from omegaconf import OmegaConf

    from verl.trainer.ppo import core_algos, rollout_corr_helper
    from verl.utils.dataset import rl_dataset, sft_dataset

    @dataclass
    class Cfg:
        a: int = 1
        b: object = None

    class Obj:
        a = 1
        b = None

    for cfg in ({"a": 1, "b": None}, Cfg(), OmegaConf.create({"a": 1, "b": None}), Obj()):
        assert config_get(cfg, "a", 5) == 1
        assert config_get(cfg, "b", 5) == 5  # None counts as unset
        assert config_get(cfg, "missing", 5) == 5
    assert config_get(None, "a", 7) == 7
    # one helper, used by the algorithms and the datasets
    assert (
        core_algos.config_get
        is rollout_corr_helper.config_get
        is rl_dataset.config_get
        is sft_dataset.config_get
        is config_get
    )


# ------------------------------------------------------------------ protocol v2 contracts (upstream's tensordict_utils)


def _rows3d(lengths, base=0):
    """mRoPE-like position ids: row i is [4, lengths[i]] with distinct values."""
    return [(torch.arange(n) + base + 100 * i).expand(4, n) for i, n in enumerate(lengths)]


def test_nested_from_list_ragged_dims_and_select_chunk_keep_them():
    rows = _rows3d([2, 5, 5, 3])
    pos = tu.nested_tensor_from_tensor_list(rows)  # ragged along each row's last dim
    assert pos._ragged_idx == 2 and pos.values().shape == (4, 15) and pos.offsets().tolist() == [0, 2, 7, 12, 15]
    data = tu.get_tensordict({"position_ids": pos, "obs": torch.arange(4)})
    sel = tu.index_select_tensor_dict(data, torch.tensor([1, 2]))
    assert sel["position_ids"]._ragged_idx == 2 and sel["position_ids"].values().shape == (4, 10)
    assert [torch.equal(a, b) for a, b in zip(sel["position_ids"].unbind(0), rows[1:3], strict=False)] == [True, True]
    first, second = tu.chunk_tensordict(data, 2)
    assert second["position_ids"]._ragged_idx == 2 and second["position_ids"].offsets().tolist() == [0, 5, 8]
    assert torch.equal(second["position_ids"].unbind(0)[1], rows[3]) and second["obs"].tolist() == [2, 3]
    # ragged along the first row dim (top-k teacher log-probs [L_i, 64])
    elems = [torch.randn(n, 64) for n in (5, 8, 3, 7)]
    tl = tu.nested_tensor_from_tensor_list(elems, ragged_idx=1)
    assert tl.shape[2] == 64 and tl._ragged_idx == 1
    parts = tu.chunk_tensordict(tu.get_tensordict({"t": tl}), 2)
    assert parts[1]["t"]._ragged_idx == 1 and torch.equal(parts[1]["t"].unbind(0)[1], elems[3])
    with pytest.raises(ValueError, match=r"ragged_idx must be in \[1, 2\]"):
        tu.nested_tensor_from_tensor_list(elems, ragged_idx=3)


def test_concat_nested_tensors_2d_3d_4d():
    for shape_of in (lambda n: (n,), lambda n: (4, n), lambda n: (2, 3, n)):
        rows = [torch.randint(0, 9, shape_of(n)) for n in (4, 5, 3, 6)]
        a = torch.nested.as_nested_tensor(rows[:2], layout=torch.jagged)
        b = torch.nested.as_nested_tensor(rows[2:], layout=torch.jagged)
        out = tu.concat_nested_tensors([a, b])
        assert out.shape[0] == 4 and all(torch.equal(x, y) for x, y in zip(out.unbind(0), rows, strict=False))
    with pytest.raises(ValueError, match="jagged nested tensor"):
        tu.concat_nested_tensors([torch.ones(2, 3)])


def test_concat_tensordict_nested_non_tensor_and_batch_wide_values():
    ab = torch.nested.as_nested_tensor([torch.arange(3), torch.arange(4)], layout=torch.jagged)
    cd = torch.nested.as_nested_tensor([torch.arange(2), torch.arange(1)], layout=torch.jagged)
    t1 = tu.get_tensordict({"input_ids": ab, "labels": ["a", "b"]}, {"temp": 1.0})
    t2 = tu.get_tensordict({"input_ids": cd, "labels": ["c", "d"]}, {"temp": 2.0})
    out = tu.concat_tensordict([t1, t2])
    assert out["input_ids"].values().tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 0]
    assert out["labels"] == ["a", "b", "c", "d"] and out["temp"] == 1.0  # batch-wide: part 0 wins
    assert t1["temp"] == 1.0 and len(t1) == 2  # inputs untouched
    only_rows = tu.concat_tensordict(
        [tu.get_tensordict({"l": ["a"]}, {"temp": 1.0}), tu.get_tensordict({"l": ["b"]}, {"temp": 2.0})]
    )
    assert only_rows.batch_size[0] == 2 and only_rows["temp"] == 1.0
    meta_only = tu.concat_tensordict([tu.get_tensordict({}, {"temp": 1.0}), tu.get_tensordict({}, {"temp": 2.0})])
    assert len(meta_only.batch_size) == 0 and meta_only["temp"] == 1.0


def test_union_conflicts_are_assertion_and_value_errors():
    obs = torch.randn(4, 2)
    d1 = tu.get_tensordict({"obs": obs, "src": ["g"] * 4})
    tu.union_tensor_dict(d1, tu.get_tensordict({"obs": obs, "rew": torch.ones(4), "src": ["g"] * 4}))
    assert set(d1.keys()) == {"obs", "src", "rew"}
    for other in (tu.get_tensordict({"obs": obs + 1}), tu.get_tensordict({"src": ["g", "g", "g", "m"]})):
        with pytest.raises(AssertionError, match="different values"):
            tu.union_tensor_dict(d1, other)
        with pytest.raises(ValueError):
            tu.union_tensor_dict(d1, other)
    tu.assign_non_tensor(d1, top_p=0.8)
    with pytest.raises(AssertionError, match="'top_p'"):
        tu.union_tensor_dict(d1, tu.assign_non_tensor(tu.get_tensordict({"obs": obs}), top_p=0.9))


def test_contiguous_makes_consolidate_safe_and_keeps_entries():
    import copy

    nested = torch.nested.as_nested_tensor([torch.randn(3), torch.randn(4)], layout=torch.jagged)
    data = tu.get_tensordict(
        {
            "a": torch.randn(2, 4),
            "b": torch.randn(2, 4)[:, :-1],
            "c": nested,
            "nt": [{"p": torch.randn(2)}, {"p": torch.randn(3)}],
        },
        non_tensor_dict={"ntd": torch.arange(3)},
    )
    assert not data["b"].is_contiguous()
    cont = tu.contiguous(copy.deepcopy(data))
    assert cont is not data and cont["b"].is_contiguous() and cont.get("ntd").__class__.__name__ == "NonTensorData"
    tu.assert_tensordict_eq(cont, data)
    cont.consolidate()


def test_list_of_dict_to_tensordict_and_position_ids_fix():
    td = tu.list_of_dict_to_tensordict(
        [
            {"s": torch.tensor(1.0), "ids": torch.arange(3), "tag": "a"},
            {"s": torch.tensor(2.0), "ids": torch.arange(3), "tag": "b"},
        ]
    )
    assert td["s"].tolist() == [1.0, 2.0]
    assert td["ids"].is_nested and td["ids"].offsets().tolist() == [0, 3, 6]  # nested even with equal lengths
    assert td["tag"] == ["a", "b"]
    pos = tu.nested_tensor_from_tensor_list(_rows3d([2, 3]))
    pos._ragged_idx = 1
    holder = tu.get_tensordict({"position_ids": pos})
    tu.maybe_fix_3d_position_ids(holder)
    assert holder["position_ids"]._ragged_idx == 2


def test_tensordict_make_iterator_nested_and_seeded_order():
    nt = torch.nested.as_nested_tensor([torch.arange(k + 1) for k in range(6)], layout=torch.jagged)
    ds = tu.get_tensordict({"obs": torch.arange(6), "input_ids": nt, "src": list("abcdef")}, {"kw": {"top_p": 1.0}})
    got = [mb["obs"].tolist() for mb in tu.make_iterator(ds, 3, 2, seed=1, dataloader_kwargs={"shuffle": True})]
    g = torch.Generator()
    g.manual_seed(1)
    loader = torch.utils.data.DataLoader(list(range(6)), batch_size=3, shuffle=True, generator=g)
    assert got == [b.tolist() for _ in range(2) for b in loader]
    mb = next(tu.make_iterator(ds, 2, 1))
    assert (
        [r.tolist() for r in mb["input_ids"].unbind()] == [[0], [0, 1]]
        and mb["src"] == ["a", "b"]
        and mb["kw"] == {"top_p": 1.0}
    )


def test_chunk_and_concat_with_3d_nested_tensors_and_per_row_objects():
    from tensordict.tensorclass import NonTensorData

    lengths = (4, 5, 6, 7)
    pos = torch.nested.as_nested_tensor([torch.arange(k).expand(4, k) for k in lengths], layout=torch.jagged)
    ids = torch.nested.as_nested_tensor([torch.arange(k) + 10 * i for i, k in enumerate(lengths)], layout=torch.jagged)
    images = [{"pixel_values": torch.full((3, 2, 2), float(i))} for i in range(4)]
    images[1] = None
    mm = torch.stack([NonTensorData(x) for x in images])
    td = tu.get_tensordict({"input_ids": ids, "position_ids": pos, "multi_modal_inputs": mm})
    first, second = tu.chunk_tensordict(td, 2)
    assert [r.tolist() for r in second["input_ids"].unbind(0)] == [list(range(20, 26)), list(range(30, 37))]
    assert [tuple(r.shape) for r in first["position_ids"].unbind(0)] == [(4, 4), (4, 5)]
    got = tu.get(first, "multi_modal_inputs")
    assert got[1] is None and torch.equal(got[0]["pixel_values"], torch.zeros(3, 2, 2))
    back = tu.concat_tensordict([first, second])
    assert [tuple(r.shape) for r in back["position_ids"].unbind(0)] == [(4, k) for k in lengths]
    assert torch.equal(back["input_ids"].values(), ids.values())
