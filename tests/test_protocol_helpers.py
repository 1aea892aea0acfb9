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
        return torch.nested.as_nested_tensor([torch.arange(n, dtype=torch.float32) for n in lengths], layout=torch.jagged)

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
    td = TensorDict({"a": torch.arange(6).reshape(2, 3), "sub": {"b": torch.ones(2, dtype=torch.bfloat16)}}, batch_size=[2])
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
    assert core_algos.config_get is rollout_corr_helper.config_get is rl_dataset.config_get is sft_dataset.config_get is config_get
