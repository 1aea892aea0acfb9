"""Small helpers around `tensordict.TensorDict`, the container behind `DataProto.batch`.

Names follow upstream verl's `verl.utils.tensordict_utils` where it has them. A TensorDict built by
`get_tensordict` holds three kinds of entries, all sharing batch dimension 0 of size ``bs``:

- plain tensors ``(bs, ...)``;
- per-row Python objects (strings, lists, dicts) as a `NonTensorStack` of length ``bs``;
- batch-wide values (a config dict, a step number) as `NonTensorData`.

`serialize_tensordict` / `deserialize_tensordict` (upstream's, re-exported by `verl.protocol`) turn a
TensorDict of tensors into plain tuples of dtype names, shapes and byte arrays. The serialisation pair
`tensordict_to_state` / `tensordict_from_state` turns a TensorDict of plain
tensors into flat byte buffers (numpy uint8 views of the tensor storage) so pickling and Ray
transport never create per-row Python objects and Ray can ship the buffers out of band.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorData, NonTensorStack

from verl.utils.protocol_utils import ProtocolError, mini_batch_indices, values_equal

logger = logging.getLogger(__name__)


__all__ = [
    "ProtocolError",
    "assign_non_tensor",
    "assign_non_tensor_data",
    "assign_non_tensor_stack",
    "assert_tensordict_eq",
    "chunk_tensordict",
    "concat_nested_tensors",
    "concat_tensordict",
    "concat_tensordict_with_none_bsz",
    "contiguous",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "get",
    "get_keys",
    "get_non_tensor_data",
    "get_tensordict",
    "index_select_tensor_dict",
    "list_of_dict_to_tensordict",
    "make_iterator",
    "maybe_fix_3d_position_ids",
    "nested_tensor_from_tensor_list",
    "pad_to_divisor",
    "pop",
    "pop_keys",
    "serialize_single_tensor",
    "serialize_tensordict",
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
        elif isinstance(val, (list, np.ndarray)):
            if any(isinstance(v, torch.Tensor) for v in val):
                raise ValueError(
                    f"list {key!r} holds torch.Tensor items; a per-row list must hold plain Python/numpy objects"
                )
            rows = len(val)
            val = NonTensorStack.from_list([NonTensorData(item) for item in val])
        else:
            raise ValueError(
                f"entry {key!r} has type {type(val).__name__}; expected torch.Tensor, list, "
                "np.ndarray or NonTensorStack"
            )
        if isinstance(val, torch.Tensor) and val.is_nested and val.layout != torch.jagged:
            raise ValueError(f"nested tensor {key!r} must have layout=torch.jagged, got {val.layout}")
        if batch_size is None:
            batch_size, first_key = rows, key
        elif rows != batch_size:
            raise ProtocolError(f"entry {key!r} has {rows} rows but {first_key!r} has {batch_size}")
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


def _ragged_idx(t: torch.Tensor) -> int:
    return int(getattr(t, "_ragged_idx", t.dim() - 1))


def nested_tensor_from_tensor_list(tensors: list[torch.Tensor], ragged_idx: int | None = None) -> torch.Tensor:
    """A jagged nested tensor whose rows are `tensors` (each of the same ndim ``k``).

    `ragged_idx` is the nested tensor's ragged dimension (1-based over the nested shape, i.e. row
    dimension ``ragged_idx - 1`` varies between rows); default ``k``, the last one. Rows [4, L_i]
    (mRoPE position ids) give shape ``[B, 4, j]`` with ragged_idx 2; rows [L_i, 64] with
    ragged_idx 1 give ``[B, j, 64]``.
    """
    if not tensors:
        raise ValueError("nested_tensor_from_tensor_list needs at least one tensor")
    k = tensors[0].dim()
    ragged_idx = k if ragged_idx is None else ragged_idx
    if not 1 <= ragged_idx <= k:
        raise ValueError(f"ragged_idx must be in [1, {k}], got {ragged_idx}")
    if k == 1:
        return torch.nested.as_nested_tensor(list(tensors), layout=torch.jagged)
    dim = ragged_idx - 1
    values = torch.cat(list(tensors), dim=dim)
    lengths = torch.tensor([t.shape[dim] for t in tensors], dtype=torch.long, device=values.device)
    offsets = torch.zeros(len(tensors) + 1, dtype=torch.long, device=values.device)
    torch.cumsum(lengths, dim=0, out=offsets[1:])
    return torch.nested.nested_tensor_from_jagged(values=values, offsets=offsets, jagged_dim=ragged_idx)


def _nested_rows(t: torch.Tensor) -> list[torch.Tensor]:
    """The rows of a jagged nested tensor (via its offsets: unbind is unreliable for 3-D+)."""
    offsets = t.offsets()
    dim = _ragged_idx(t) - 1
    values = t.values()  # the ragged dimension is values' dimension ragged_idx - 1
    rows = []
    for i in range(offsets.numel() - 1):
        start, stop = int(offsets[i]), int(offsets[i + 1])
        rows.append(values.narrow(dim, start, stop - start))
    return rows


def concat_nested_tensors(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate jagged nested tensors (2-D or more, contiguous) along the batch dimension;
    the result keeps the first tensor's ragged dimension."""
    rows: list[torch.Tensor] = []
    for i, t in enumerate(tensors):
        if not (t.is_nested and t.is_contiguous()):
            raise ValueError(f"tensor {i} must be a contiguous jagged nested tensor, got nested={t.is_nested}")
        if t.dim() < 2:
            raise ValueError(f"nested tensor must have 2 or more dimensions. Got {tuple(t.shape)}")
        rows.extend(_nested_rows(t))
    return nested_tensor_from_tensor_list(rows, ragged_idx=_ragged_idx(tensors[0]))


def concat_tensordict_with_none_bsz(data: list[TensorDict]) -> TensorDict:
    """Concatenation of TensorDicts without a batch dimension (batch-wide values only): the
    first one, as upstream (its values win)."""
    for i, d in enumerate(data):
        if len(d.batch_size) != 0:
            raise ProtocolError(f"TensorDict {i} has batch_size {tuple(d.batch_size)}; expected [] for every part")
    return data[0]


def concat_tensordict(data: list[TensorDict]) -> TensorDict:
    """Concatenate TensorDicts along dim 0 (the inputs are not modified).

    Tensors are concatenated, jagged nested tensors row-wise (`concat_nested_tensors`), per-row
    `NonTensorStack`s joined; a batch-wide `NonTensorData` keeps the first part's value (as
    upstream). TensorDicts without a batch dimension give the first one.

    Raises ValueError (also an AssertionError, as upstream's asserts) when the list is empty or
    the TensorDicts do not have the same keys.
    """
    if not data:
        raise ProtocolError("concat_tensordict needs at least one TensorDict")
    keys0 = set(data[0].keys())
    for i, td in enumerate(data[1:], start=1):
        if set(td.keys()) != keys0:
            raise ProtocolError(f"TensorDict {i} has keys {sorted(td.keys())} but TensorDict 0 has {sorted(keys0)}")
    if len(data[0].batch_size) == 0:
        return concat_tensordict_with_none_bsz(data)
    # batch-wide values keep part 0's value (upstream's contract); recent tensordict versions
    # would otherwise turn differing values into a per-row stack
    batch_wide = {k: data[0].get(k) for k in data[0].keys() if isinstance(data[0].get(k), NonTensorData)}
    if batch_wide:
        data = [
            TensorDict(
                {k: td.get(k) for k in td.keys() if k not in batch_wide}, batch_size=td.batch_size, device=td.device
            )
            for td in data
        ]
        out = concat_tensordict(data)
        for key, value in batch_wide.items():
            out[key] = NonTensorData(value.data)
        return out
    nested = {k for k, v in data[0].items() if isinstance(v, torch.Tensor) and v.is_nested}
    if not nested:
        return torch.cat(data, dim=0)
    for i, td in enumerate(data[1:], start=1):
        mine = {k for k, v in td.items() if isinstance(v, torch.Tensor) and v.is_nested}
        if mine != nested:
            raise ProtocolError(
                f"TensorDict {i} has nested tensors {sorted(mine)} but TensorDict 0 has {sorted(nested)}"
            )
    regular = [
        TensorDict({k: td.get(k) for k in td.keys() if k not in nested}, batch_size=td.batch_size, device=td.device)
        for td in data
    ]
    out = torch.cat(regular, dim=0)
    for key in sorted(nested):
        out[key] = concat_nested_tensors([td.get(key) for td in data])
    return out


def chunk_tensordict(td: TensorDict, chunks: int) -> list[TensorDict]:
    """Split along dim 0 into exactly `chunks` pieces whose sizes differ by at most one (larger
    first; trailing pieces may be empty), so the i-th piece can be sent to worker i.

    Nested (jagged) tensors are rebuilt per piece from their rows, keeping their ragged
    dimension (upstream works around the same torch bug: ``unbind`` of 3-D jagged tensors).
    Upstream requires ``len(td) % chunks == 0``; for such sizes both give the same pieces.
    """
    if not isinstance(chunks, int) or chunks <= 0:
        raise ValueError(f"chunks must be a positive int, got {chunks!r}")
    n = td.batch_size[0]
    bounds = _even_bounds(n, chunks)
    nested = {k for k, v in td.items() if isinstance(v, torch.Tensor) and v.is_nested}
    if not nested:
        return [td[int(bounds[i]) : int(bounds[i + 1])] for i in range(chunks)]
    regular = TensorDict(
        {k: td.get(k) for k in td.keys() if k not in nested}, batch_size=td.batch_size, device=td.device
    )
    pieces = [regular[int(bounds[i]) : int(bounds[i + 1])] for i in range(chunks)]
    for key in sorted(nested):
        nt = td.get(key)
        rows = _nested_rows(nt)
        for i, piece in enumerate(pieces):
            part = rows[int(bounds[i]) : int(bounds[i + 1])]
            if part:
                piece[key] = nested_tensor_from_tensor_list(part, ragged_idx=_ragged_idx(nt))
    return pieces


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
            rows = _nested_rows(value)
            picked = [rows[int(i)] for i in indices]
            out[key] = nested_tensor_from_tensor_list(picked, ragged_idx=_ragged_idx(value)) if picked else value[0:0]
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
        raise ProtocolError(
            f"Two tensor dict must have identical batch size. Got {tensor_dict1.batch_size} and "
            f"{tensor_dict2.batch_size}: "
            f"cannot union TensorDicts with batch sizes {tuple(tensor_dict1.batch_size)} and "
            f"{tuple(tensor_dict2.batch_size)}"
        )
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
            raise ProtocolError(
                f"{key} in tensor_dict1 and tensor_dict2 are not the same object: key {key!r} is in both TensorDicts "
                "with different values; union refuses to overwrite it"
            )
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


def make_iterator(
    tensordict: TensorDict,
    mini_batch_size: int,
    epochs: int,
    seed: int | None = None,
    dataloader_kwargs: dict | None = None,
) -> Iterator[TensorDict]:
    """Yield mini-batches of `mini_batch_size` rows for `epochs` passes (see `DataProto.make_iterator`)."""
    n = tensordict.batch_size[0]
    for idx in mini_batch_indices(n, mini_batch_size, epochs, seed, dataloader_kwargs):
        yield index_select_tensor_dict(tensordict, torch.from_numpy(idx))


def assert_tensordict_eq(tensordict1: TensorDict, tensordict2: TensorDict) -> None:
    """Assert same keys and equal values (nested tensors compared row by row)."""
    keys1, keys2 = set(tensordict1.keys()), set(tensordict2.keys())
    assert keys1 == keys2, (
        f"key sets differ: only in first {sorted(keys1 - keys2)}, only in second {sorted(keys2 - keys1)}"
    )
    for key in keys1:
        v1, v2 = tensordict1.get(key), tensordict2.get(key)
        assert type(v1) is type(v2), f"{key!r}: types differ ({type(v1).__name__} vs {type(v2).__name__})"
        if isinstance(v1, torch.Tensor):
            if v1.is_nested:
                r1, r2 = v1.unbind(), v2.unbind()
                assert len(r1) == len(r2), f"{key!r}: {len(r1)} vs {len(r2)} rows"
                for j, (a, b) in enumerate(zip(r1, r2, strict=False)):
                    assert torch.equal(a, b), f"{key!r}: row {j} differs"
            else:
                assert v1.shape == v2.shape and torch.equal(v1, v2), f"{key!r}: tensors differ"
        else:
            assert values_equal(_plain(v1), _plain(v2)), f"{key!r}: values differ"


def contiguous(data: TensorDict) -> TensorDict:
    """A new TensorDict with every tensor made contiguous (so `consolidate` works); per-row
    stacks and batch-wide values are carried over unchanged (tensordict's own `contiguous`
    would turn batch-wide values into per-row stacks)."""
    tensors: dict[str, Any] = {}
    non_tensors: dict[str, Any] = {}
    for key in data.keys():
        val = data.get(key)
        if isinstance(val, NonTensorData):
            non_tensors[key] = val
        elif isinstance(val, NonTensorStack):
            tensors[key] = val
        elif isinstance(val, torch.Tensor):
            tensors[key] = val.contiguous()
        else:
            raise TypeError(
                f"contiguous: entry {key!r} is a {type(val).__name__}; expected a tensor, "
                "NonTensorStack or NonTensorData"
            )
    return get_tensordict(tensors, non_tensors)


def maybe_fix_3d_position_ids(data: TensorDict) -> None:
    """Restore ragged dimension 2 of a 3-D nested ``position_ids`` ([B, 4, j], mRoPE), which a
    consolidate + pickle round trip can lose (the same repair as upstream)."""
    if "position_ids" in data.keys():
        pos = data.get("position_ids")
        if isinstance(pos, torch.Tensor) and pos.is_nested and pos.dim() == 3:
            pos._ragged_idx = 2


def list_of_dict_to_tensordict(list_of_dicts: list[dict[str, Any]]) -> TensorDict:
    """One TensorDict of ``len(list_of_dicts)`` rows from per-row dicts (keys of the first).

    Per key: 0-d tensors are stacked into a [B] tensor; other tensors become a jagged nested
    tensor (always, even when the shapes happen to agree, so consumers can rely on `offsets()`);
    anything else a `NonTensorStack`.
    """
    if not list_of_dicts:
        raise ValueError("list_of_dict_to_tensordict needs at least one dict")
    keys = list(list_of_dicts[0].keys())
    for i, d in enumerate(list_of_dicts):
        missing = [k for k in keys if k not in d]
        if missing:
            raise KeyError(f"dict {i} lacks keys {missing} that dict 0 has")

    def pack(values: list):
        if values and all(isinstance(v, torch.Tensor) for v in values):
            if all(v.dim() == 0 for v in values):
                return torch.stack(values)
            return nested_tensor_from_tensor_list(values)
        return NonTensorStack(*values)

    return TensorDict({k: pack([d[k] for d in list_of_dicts]) for k in keys}, batch_size=[len(list_of_dicts)])


# ----------------------------------------------------------------------------- serialisation


def serialize_single_tensor(obj: torch.Tensor) -> tuple[str, tuple[int, ...], np.ndarray]:
    """A tensor as plain data: ``(dtype name without "torch.", shape, flat uint8 numpy view of the
    bytes)``. Tensors off the CPU are copied to host memory first; the device is not recorded."""
    t = obj.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    data = t.contiguous().reshape(-1).view(torch.uint8).numpy()
    return str(t.dtype).removeprefix("torch."), tuple(t.shape), data


def deserialize_single_tensor(arr: Any) -> torch.Tensor:
    """Inverse of `serialize_single_tensor` (the bytes are copied, so the tensor is writable)."""
    dtype_name, shape, data = arr
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {dtype_name!r} in serialized tensor")
    raw = bytearray(memoryview(data).cast("B")) if not isinstance(data, (bytes, bytearray)) else bytearray(data)
    if not raw:
        return torch.empty(tuple(shape), dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(tuple(shape))


def serialize_tensordict(batch: TensorDict) -> tuple[tuple[int, ...], str | None, dict[str, tuple]]:
    """A TensorDict of tensors as plain data: ``(batch_size, device or None, {key: encoding})``.

    A strided tensor is encoded by `serialize_single_tensor` (a 3-tuple); a nested tensor as
    ``(layout name, [3-tuple per row])``. Non-tensor entries are not supported (TypeError naming
    the key): pickle the TensorDict itself for those.
    """
    items: dict[str, tuple] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"serialize_tensordict: entry {key!r} is a {type(value).__name__}; only tensors can "
                "be serialized this way"
            )
        if value.is_nested:
            items[key] = (
                str(value.layout).removeprefix("torch."),
                [serialize_single_tensor(row) for row in value.unbind()],
            )
        else:
            items[key] = serialize_single_tensor(value)
    device = str(batch.device) if batch.device is not None else None
    return tuple(batch.batch_size), device, items


def deserialize_tensordict(arr: Any) -> TensorDict:
    """Inverse of `serialize_tensordict`."""
    batch_size, device, items = arr
    decoded: dict[str, torch.Tensor] = {}
    for key, enc in items.items():
        if len(enc) == 3:
            decoded[key] = deserialize_single_tensor(enc)
        elif len(enc) == 2:
            layout_name, rows = enc
            decoded[key] = torch.nested.as_nested_tensor(
                [deserialize_single_tensor(r) for r in rows], layout=getattr(torch, layout_name)
            )
        else:
            raise ValueError(f"Invalid tensor encoding format for {key!r}, expected length 2 or 3, got {len(enc)}")
    return TensorDict(source=decoded, batch_size=batch_size, device=device)


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
        leaves.append(
            (
                key,
                str(t.dtype).removeprefix("torch."),
                tuple(t.shape),
                device_type,
                t.reshape(-1).view(torch.uint8).numpy(),
            )
        )
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
        elif (
            isinstance(value, torch.Tensor)
            and type(value) is torch.Tensor
            and not value.is_nested
            and value.layout == torch.strided
        ):
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
