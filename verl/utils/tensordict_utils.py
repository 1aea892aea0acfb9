"""Small helpers around `tensordict.TensorDict`, the container behind `DataProto.batch`.

Names follow upstream verl's `verl.utils.tensordict_utils` where it has them. A TensorDict built by
`get_tensordict` holds three kinds of entries, all sharing batch dimension 0 of size ``bs``:

- plain tensors ``(bs, ...)``;
- per-row Python objects (strings, lists, dicts) as a `NonTensorStack` of length ``bs``;
- batch-wide values (a config dict, a step number) as `NonTensorData`.

The serialisation pair `tensordict_to_state` / `tensordict_from_state` turns a TensorDict of plain
tensors into flat byte buffers (numpy uint8 views of the tensor storage) so pickling and Ray
transport never create per-row Python objects and Ray can ship the buffers out of band.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Iterator

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorData, NonTensorStack

logger = logging.getLogger(__name__)

__all__ = [
    "assign_non_tensor",
    "assign_non_tensor_data",
    "assign_non_tensor_stack",
    "assert_tensordict_eq",
    "chunk_tensordict",
    "concat_tensordict",
    "get",
    "get_keys",
    "get_non_tensor_data",
    "get_tensordict",
    "index_select_tensor_dict",
    "make_iterator",
    "pad_to_divisor",
    "pop",
    "pop_keys",
    "tensordict_from_state",
    "tensordict_to_state",
    "union_tensor_dict",
    "unpad",
    "unwrap_non_tensor_data",
]


# ----------------------------------------------------------------------------- non-tensor entries


def assign_non_tensor_data(tensor_dict: TensorDict, key: str, val: Any) -> None:
    """Store one batch-wide Python value under `key` (readable back with `get`)."""
    _require_tensordict(tensor_dict)
    tensor_dict[key] = NonTensorData(val)


def assign_non_tensor_stack(tensor_dict: TensorDict, key: str, val: list) -> None:
    """Store a list with one Python object per row (nested lists/dicts allowed) under `key`."""
    _require_tensordict(tensor_dict)
    tensor_dict[key] = NonTensorStack.from_list([NonTensorData(item) for item in val])


def assign_non_tensor(tensor_dict: TensorDict, **kwargs) -> TensorDict:
    """Assign each keyword: lists become per-row stacks, anything else a batch-wide value."""
    _require_tensordict(tensor_dict)
    for key, val in kwargs.items():
        if isinstance(val, (NonTensorData, NonTensorStack)):
            tensor_dict[key] = val
        elif isinstance(val, list):
            assign_non_tensor_stack(tensor_dict, key, val)
        else:
            assign_non_tensor_data(tensor_dict, key, val)
    return tensor_dict


def unwrap_non_tensor_data(data: Any) -> Any:
    """`NonTensorData(x)` -> x; anything else is returned unchanged."""
    return data.data if isinstance(data, NonTensorData) else data


def get_non_tensor_data(data: TensorDict, key: str, default: Any) -> Any:
    """Read a batch-wide value stored with `assign_non_tensor_data`, or `default`."""
    return unwrap_non_tensor_data(data.get(key, default))


def get_tensordict(tensor_dict: dict[str, torch.Tensor | list], non_tensor_dict: dict | None = None) -> TensorDict:
    """Build a TensorDict with batch dimension ``bs`` from tensors and per-row lists.

    Args:
        tensor_dict: name -> tensor ``(bs, ...)`` or list of ``bs`` Python objects (stored as a
            `NonTensorStack`; lists must not hold tensors: convert them to numpy first).
        non_tensor_dict: name -> batch-wide value, stored as `NonTensorData`.

    Raises:
        ValueError: the entries disagree on ``bs`` (the message names the key), a list holds a
            tensor, a value has an unsupported type, or a key appears in both dicts.
    """
    non_tensor_dict = non_tensor_dict or {}
    source: dict[str, Any] = {}
    batch_size: int | None = None
    first_key = None
    for key, val in tensor_dict.items():
        if isinstance(val, NonTensorStack):
            rows = len(val)
        elif isinstance(val, torch.Tensor):
            if val.is_nested and not val.is_contiguous():
                raise ValueError(f"nested tensor {key!r} must be contiguous (build it with layout=torch.jagged)")
            rows = val.size(0)
        elif isinstance(val, list):
            if any(isinstance(v, torch.Tensor) for v in val):
                raise ValueError(f"list {key!r} holds torch.Tensor items; a per-row list must hold plain Python/numpy objects")
            rows = len(val)
            val = NonTensorStack.from_list([NonTensorData(item) for item in val])
        else:
            raise ValueError(f"entry {key!r} has type {type(val).__name__}; expected torch.Tensor, list or NonTensorStack")
        if batch_size is None:
            batch_size, first_key = rows, key
        elif rows != batch_size:
            raise ValueError(f"entry {key!r} has {rows} rows but {first_key!r} has {batch_size}")
        source[key] = val
    for key, val in non_tensor_dict.items():
        if key in source:
            raise ValueError(f"key {key!r} is given both as a per-row entry and as a batch-wide value")
        source[key] = val if isinstance(val, NonTensorData) else NonTensorData(val)
    return TensorDict(source=source, batch_size=[] if batch_size is None else [batch_size])


def get(tensordict: TensorDict, key: str, default: Any = None) -> Any:
    """Read `key` as a tensor, a list (per-row objects) or the batch-wide value; `default` if absent."""
    if key not in tensordict.keys():
        return default
    return _plain(tensordict.get(key))


def get_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """A new TensorDict with only `keys` (KeyError naming the first missing key)."""
    tensors, non_tensors = {}, {}
    for key in keys:
        if key not in tensordict.keys():
            raise KeyError(f"key {key!r} not in tensordict (keys: {sorted(tensordict.keys())})")
        _sort_entry(key, tensordict.get(key), tensors, non_tensors)
    return get_tensordict(tensors, non_tensors)


def pop(tensordict: TensorDict, key: str, default: Any = None) -> Any:
    """Remove `key` and return it as `get` would; `default` if absent."""
    if key not in tensordict.keys():
        return default
    return _plain(tensordict.pop(key))


def pop_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """Remove `keys` and return them as a new TensorDict (KeyError naming the first missing key)."""
    keys = list(keys)
    missing = [k for k in keys if k not in tensordict.keys()]
    if missing:
        raise KeyError(f"keys {missing} not in tensordict (keys: {sorted(tensordict.keys())})")
    tensors, non_tensors = {}, {}
    for key in keys:
        _sort_entry(key, tensordict.pop(key), tensors, non_tensors)
    return get_tensordict(tensors, non_tensors)


def _plain(value: Any) -> Any:
    if isinstance(value, NonTensorStack):
        return value.tolist()
    if isinstance(value, NonTensorData):
        return value.data
    return value


def _sort_entry(key: str, value: Any, tensors: dict, non_tensors: dict) -> None:
    if isinstance(value, NonTensorStack):
        tensors[key] = value.tolist()
    elif isinstance(value, NonTensorData):
        non_tensors[key] = value.data
    else:
        tensors[key] = value


# ----------------------------------------------------------------------------- batch operations


def concat_nested_tensors(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate 2-D jagged nested tensors along the batch dimension."""
    rows: list[torch.Tensor] = []
    for i, t in enumerate(tensors):
        if not (t.is_nested and t.is_contiguous() and t.dim() == 2):
            raise ValueError(f"tensor {i} must be a contiguous 2-D nested tensor, got nested={t.is_nested} dim={t.dim()}")
        rows.extend(t.unbind(0))
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def concat_tensordict(data: list[TensorDict]) -> TensorDict:
    """Concatenate TensorDicts along dim 0; jagged nested tensors are concatenated row-wise.

    Raises ValueError when the list is empty or the TensorDicts do not have the same keys.
    """
    if not data:
        raise ValueError("concat_tensordict needs at least one TensorDict")
    keys0 = set(data[0].keys())
    for i, td in enumerate(data[1:], start=1):
        if set(td.keys()) != keys0:
            raise ValueError(f"TensorDict {i} has keys {sorted(td.keys())} but TensorDict 0 has {sorted(keys0)}")
    nested = {k for k, v in data[0].items() if isinstance(v, torch.Tensor) and v.is_nested}
    if not nested:
        return torch.cat(data, dim=0)
    regular = [TensorDict({k: v for k, v in td.items() if k not in nested}, batch_size=td.batch_size, device=td.device) for td in data]
    out = torch.cat(regular, dim=0)
    for key in nested:
        out[key] = concat_nested_tensors([td[key] for td in data])
    return out


def chunk_tensordict(td: TensorDict, chunks: int) -> list[TensorDict]:
    """Split along dim 0 into exactly `chunks` views whose sizes differ by at most one.

    Unlike `torch.chunk`, this always returns `chunks` pieces (trailing ones may be empty), so
    the i-th piece can be sent to worker i.
    """
    if not isinstance(chunks, int) or chunks <= 0:
        raise ValueError(f"chunks must be a positive int, got {chunks!r}")
    n = td.batch_size[0]
    bounds = _even_bounds(n, chunks)
    return [td[int(bounds[i]) : int(bounds[i + 1])] for i in range(chunks)]


def _chunk_bounds(n: int, chunks: int) -> np.ndarray:
    """Cut points of `TensorDict.chunk` / `torch.chunk`: pieces of ``ceil(n / chunks)`` rows,
    the last shorter; padded with empty pieces up to `chunks` (torch returns fewer pieces)."""
    size = -(-n // chunks) if n else 0
    cuts = [min(i * size, n) for i in range(chunks + 1)]
    return np.asarray(cuts, dtype=np.int64)


def _even_bounds(n: int, chunks: int) -> np.ndarray:
    """Cut points 0 = b0 <= ... <= b_chunks = n; the first n % chunks pieces get one extra row."""
    base, extra = divmod(n, chunks)
    sizes = np.full(chunks, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate([[0], np.cumsum(sizes)])


def index_select_tensor_dict(batch: TensorDict | None, indices: torch.Tensor | list[int]) -> TensorDict | None:
    """Rows `indices` (1-D int tensor or list) of `batch`, including nested and non-tensor entries."""
    if batch is None:
        return None
    if isinstance(indices, list):
        indices = torch.tensor(indices, dtype=torch.long)
    if indices.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.is_nested:
            out[key] = torch.nested.as_nested_tensor([value[int(i)] for i in indices], layout=torch.jagged)
        elif isinstance(value, NonTensorData):
            out[key] = value.data
        else:
            out[key] = value[indices]
    result = TensorDict(batch_size=[indices.shape[0]], device=batch.device)
    for key, value in out.items():
        if isinstance(value, (torch.Tensor, TensorDict, NonTensorStack)):
            result[key] = value
        else:
            result[key] = NonTensorData(value)
    return result


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add the entries of `tensor_dict2` to `tensor_dict1` (in place) and return it.

    A key present in both must hold equal values, else ValueError naming the key: a union never
    silently overwrites data.
    """
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ValueError(f"cannot union TensorDicts with batch sizes {tuple(tensor_dict1.batch_size)} and {tuple(tensor_dict2.batch_size)}")
    keys1 = set(tensor_dict1.keys())
    for key in tensor_dict2.keys():
        value2 = tensor_dict2.get(key)
        if key not in keys1:
            tensor_dict1.set(key, value2)
            continue
        value1 = tensor_dict1.get(key)
        if isinstance(value1, torch.Tensor) and isinstance(value2, torch.Tensor):
            same = value1.shape == value2.shape and value1.dtype == value2.dtype and torch.equal(value1, value2)
        else:
            same = _plain(value1) == _plain(value2)
        if not same:
            raise ValueError(f"key {key!r} is in both TensorDicts with different values; union refuses to overwrite it")
    return tensor_dict1


def pad_to_divisor(data: TensorDict, size_divisor: int) -> tuple[TensorDict, int]:
    """Append copies of leading rows (cycling) until the size divides `size_divisor`.

    Returns (padded, pad_size); `unpad(padded, pad_size)` restores the original rows.
    """
    if not isinstance(size_divisor, int) or size_divisor <= 0:
        raise ValueError(f"size_divisor must be a positive int, got {size_divisor!r}")
    n = data.batch_size[0]
    pad_size = (-n) % size_divisor
    if pad_size == 0:  # includes the empty TensorDict
        return data, 0
    idx = torch.arange(n + pad_size) % n
    return torch.cat([data, data[idx[n:]]], dim=0), pad_size


def unpad(data: TensorDict, pad_size: int) -> TensorDict:
    """Drop the last `pad_size` rows (the padding added by `pad_to_divisor`)."""
    return data[: data.batch_size[0] - pad_size] if pad_size else data


def make_iterator(tensordict: TensorDict, mini_batch_size: int, epochs: int, seed: int | None = None, dataloader_kwargs: dict | None = None) -> Iterator[TensorDict]:
    """Yield mini-batches of `mini_batch_size` rows for `epochs` passes (see `DataProto.make_iterator`)."""
    from verl.protocol import _mini_batch_indices

    n = tensordict.batch_size[0]
    for idx in _mini_batch_indices(n, mini_batch_size, epochs, seed, dataloader_kwargs):
        yield tensordict[idx] if isinstance(idx, slice) else tensordict[torch.from_numpy(idx)]


def assert_tensordict_eq(tensordict1: TensorDict, tensordict2: TensorDict) -> None:
    """Assert same keys and equal values (nested tensors compared row by row)."""
    keys1, keys2 = set(tensordict1.keys()), set(tensordict2.keys())
    assert keys1 == keys2, f"key sets differ: only in first {sorted(keys1 - keys2)}, only in second {sorted(keys2 - keys1)}"
    for key in keys1:
        v1, v2 = tensordict1.get(key), tensordict2.get(key)
        assert type(v1) is type(v2), f"{key!r}: types differ ({type(v1).__name__} vs {type(v2).__name__})"
        if isinstance(v1, torch.Tensor):
            if v1.is_nested:
                r1, r2 = v1.unbind(), v2.unbind()
                assert len(r1) == len(r2), f"{key!r}: {len(r1)} vs {len(r2)} rows"
                for j, (a, b) in enumerate(zip(r1, r2)):
                    assert torch.equal(a, b), f"{key!r}: row {j} differs"
            else:
                assert v1.shape == v2.shape and torch.equal(v1, v2), f"{key!r}: tensors differ"
        else:
            assert _plain(v1) == _plain(v2), f"{key!r}: values differ"


# ----------------------------------------------------------------------------- serialisation


def tensordict_to_state(td: TensorDict | None) -> dict | None:
    """Describe `td` as plain data for pickling: per leaf tensor a flat uint8 numpy view.

    The state holds no per-row Python objects, so pickling costs one buffer per key; with pickle
    protocol 5 (Ray) the buffers travel out of band without a copy. Tensors on an accelerator are
    copied to host memory first; the device type is recorded and restored by
    `tensordict_from_state` when that device exists in the receiving process.

    Returns None for None. A TensorDict holding anything but plain strided tensors (non-tensor
    entries, nested tensors) is kept as the TensorDict object itself and pickled by tensordict.
    """
    if td is None:
        return None
    leaves = []
    flat = _plain_tensor_leaves(td, ())
    if flat is None:
        return {"format": "tensordict", "td": td}
    for key, tensor in flat:
        t = tensor.detach()
        device_type = t.device.type
        if device_type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        leaves.append((key, str(t.dtype).removeprefix("torch."), tuple(t.shape), device_type, t.reshape(-1).view(torch.uint8).numpy()))
    return {
        "format": "buffers",
        "batch_size": tuple(td.batch_size),
        "device": None if td.device is None else td.device.type,
        "leaves": leaves,
    }


def _plain_tensor_leaves(td: TensorDict, prefix: tuple) -> list[tuple[Any, torch.Tensor]] | None:
    """(key, tensor) for every leaf, or None if any entry is not a plain strided tensor (or a
    nested TensorDict of them). Keys are strings at top level and tuples below."""
    out = []
    for key, value in td.items():
        full = prefix + (key,)
        if type(value) is TensorDict:
            sub = _plain_tensor_leaves(value, full)
            if sub is None or not sub:  # an empty sub-TensorDict would be lost: keep the object
                return None
            out.extend(sub)
        elif isinstance(value, torch.Tensor) and type(value) is torch.Tensor and not value.is_nested and value.layout == torch.strided:
            out.append((full[0] if len(full) == 1 else full, value))
        else:
            return None
    return out


def tensordict_from_state(state: dict | None) -> TensorDict | None:
    """Inverse of `tensordict_to_state`. Buffers that are read-only (Ray's shared memory) are
    copied once so the resulting tensors can be written in place safely."""
    if state is None:
        return None
    if state["format"] == "tensordict":
        return state["td"]
    td_device = state["device"]
    if td_device is not None and not _device_type_available(td_device):
        td_device = None
    td = TensorDict(batch_size=state["batch_size"], device=td_device)
    for key, dtype_name, shape, device_type, buf in state["leaves"]:
        if not buf.flags.writeable:
            buf = buf.copy()
        tensor = torch.from_numpy(buf).view(getattr(torch, dtype_name)).reshape(shape)
        if device_type != "cpu" and _device_type_available(device_type):
            tensor = tensor.to(device_type)
        td.set(key, tensor)
    return td


def _device_type_available(device_type: str) -> bool:
    if device_type == "cpu":
        return True
    module = getattr(torch, device_type, None)
    return bool(module is not None and hasattr(module, "is_available") and module.is_available())


def _require_tensordict(td: Any) -> None:
    if not isinstance(td, TensorDict):
        raise TypeError(f"expected a TensorDict, got {type(td).__name__}")
