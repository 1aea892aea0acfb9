"""`verl.utils.protocol_utils.values_equal` / `union_numpy_dict` on self-referencing object arrays:
an answer, never a RecursionError."""

import numpy as np
import pytest

from verl.utils.protocol_utils import ProtocolError, union_numpy_dict, values_equal


def _self_containing() -> np.ndarray:
    arr = np.array([None], dtype=object)
    arr[0] = arr
    return arr


def test_structurally_equal_cycles_are_equal():
    a, b = _self_containing(), _self_containing()
    assert values_equal(a, b)
    assert union_numpy_dict({"data": a}, {"data": b})["data"] is a


def test_a_cycle_differs_from_an_acyclic_value():
    a = _self_containing()
    assert not values_equal(a, np.array([None], dtype=object))
    with pytest.raises(ProtocolError, match="`data` in tensor_dict1 and tensor_dict2 are not the same object"):
        union_numpy_dict({"data": a}, {"data": np.array([None], dtype=object)})


def test_cycles_through_containers():
    x, y = [1], [1]
    x.append(x)
    y.append(y)
    assert values_equal(x, y)
    z = [2]
    z.append(z)
    assert not values_equal(x, z)
    d1, d2 = {"k": None}, {"k": None}
    d1["k"], d2["k"] = d1, d2
    assert values_equal(d1, d2)
