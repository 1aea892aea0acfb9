"""Row, index and meta-info helpers behind `verl.protocol.DataProto` and `verl.utils.tensordict_utils`.

Plain numpy / torch functions with no knowledge of DataProto itself, so both the data layer and the
TensorDict utilities can share them (one index rule, one equality rule, one mini-batch order).
`verl.protocol` re-exports the upstream public names among them (`list_of_dict_to_dict_of_list`,
`union_numpy_dict`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "ProtocolError",
    "as_slice",
    "index_array",
    "list_of_dict_to_dict_of_list",
    "merge_meta_info",
    "mini_batch_indices",
    "short_repr",
    "to_object_array",
    "union_meta",
    "union_numpy_dict",
    "values_equal",
]


class ProtocolError(ValueError, AssertionError):
    """A data-layer contract is broken: two TensorDicts / DataProtos disagree where they must
    agree (a union or concat conflict, different row counts), or a batch cannot be split as asked.

    Upstream signals these cases with ``assert`` (AssertionError); this error is both a
    ValueError and an AssertionError, so code written against either keeps working. Messages
    start with upstream's words and then say what to do.
    """


def to_object_array(values: Any, key: str) -> np.ndarray:
    """One object per row: a list of lists stays a 1-D array of lists (numpy would make it 2-D)."""
    if isinstance(values, np.ndarray):
        return values
    if isinstance(values, torch.Tensor):
        raise TypeError(f"non-tensor entry {key!r} is a torch.Tensor; put tensors in `tensors`/`batch`")
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"non-tensor entry {key!r} must be a np.ndarray, list or tuple, got {type(values).__name__}")
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def index_array(idxs: Any, n: int) -> np.ndarray:
    """Normalise an index (ints or a bool mask; list, numpy or torch) to int64 row numbers in [0, n)."""
    if isinstance(idxs, torch.Tensor):
        arr = idxs.detach().cpu().numpy()
    elif isinstance(idxs, np.ndarray):
        arr = idxs
    elif isinstance(idxs, (list, tuple, range)):
        arr = np.asarray(list(idxs))
        if arr.size == 0:
            arr = arr.astype(np.int64)
    else:
        raise TypeError(f"index must be a list, np.ndarray or torch.Tensor of ints or bools, got {type(idxs).__name__}")
    if arr.ndim != 1:
        raise ValueError(f"index must be 1-D, got shape {arr.shape}")
    if arr.dtype == np.bool_:
        if arr.shape[0] != n:
            raise IndexError(f"boolean mask has {arr.shape[0]} entries but the DataProto has {n} rows")
        return np.flatnonzero(arr).astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"index entries must be integers or bools, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < -n or arr.max() >= n):
        bad = arr[(arr < -n) | (arr >= n)][0]
        raise IndexError(f"row index {bad} is out of range for a DataProto of {n} rows")
    return np.where(arr < 0, arr + n, arr)


def values_equal(a: Any, b: Any) -> bool:
    """Equality that works for tensors, arrays, nested containers and NaN (NaN == NaN here).

    Self-referencing values (an object array or list that contains itself) compare by structure:
    a pair of containers already being compared further up counts as equal there, so two cycles of
    the same shape are equal, and a cycle is never equal to an acyclic value."""
    return _values_equal(a, b, set())


def _values_equal(a: Any, b: Any, active: set[tuple[int, int]]) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(torch.equal(a.cpu(), b.cpu()))
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        if a.dtype != object and b.dtype != object:
            return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc" and b.dtype.kind in "fc"))
        return _children_equal(a, b, zip(a.ravel(), b.ravel(), strict=True), active)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and _children_equal(a, b, ((a[k], b[k]) for k in a), active)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return False
        return _children_equal(a, b, zip(a, b, strict=True), active)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def _children_equal(a: Any, b: Any, pairs, active: set[tuple[int, int]]) -> bool:
    """The element pairs of containers `a` and `b` are all equal; (a, b) is on the comparison
    stack meanwhile, and meeting it again below is taken as equal (the cycle repeats)."""
    key = (id(a), id(b))
    if key in active:
        return True
    active.add(key)
    try:
        return all(_values_equal(x, y, active) for x, y in pairs)
    finally:
        active.discard(key)


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to `limit` characters, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _merge_metrics(into: dict[str, list], metrics: Any, part: int) -> None:
    """Append one part's metrics to `into`: ``name -> [value of part 0, value of part 1, ...]``.

    As upstream, each part's value is ONE entry, whatever it is (a worker's list of per-micro-batch
    values stays a list inside the list); a part whose metrics are a list of dicts contributes one
    entry per dict. `reduce_metrics` averages over all the numbers inside.
    """
    if metrics is None:
        return
    if isinstance(metrics, (list, tuple)):
        for item in metrics:
            _merge_metrics(into, item, part)
        return
    if not isinstance(metrics, dict):
        raise TypeError(
            f"meta_info['metrics'] of part {part} must be a dict or a list of dicts, got {type(metrics).__name__}"
        )
    for name, value in metrics.items():
        into.setdefault(name, []).append(value)


def merge_meta_info(metas: Sequence[dict]) -> dict:
    """Merge the meta_info of concatenated parts.

    ``metrics`` (a dict name -> value, or a list of such dicts, per part) become one dict
    ``name -> list`` with one entry per part (per dict) in part order, as upstream. Any other key
    must be equal in every part that has it (kept once); differing values raise ValueError naming
    the key.
    """
    merged: dict[str, Any] = {}
    origin: dict[str, int] = {}
    metrics: dict[str, list] | None = None
    for part, meta in enumerate(metas):
        for key, value in meta.items():
            if key == "metrics":
                if value is not None:  # upstream skips a part's None metrics
                    metrics = {} if metrics is None else metrics
                    _merge_metrics(metrics, value, part)
            elif key not in merged:
                merged[key], origin[key] = value, part
            elif not values_equal(merged[key], value):
                raise ProtocolError(
                    f"Conflicting values for meta_info key '{key}': cannot concat DataProtos, meta_info[{key!r}] is "
                    f"{short_repr(merged[key])} in part {origin[key]} "
                    f"but {short_repr(value)} in part {part}; make the workers agree (e.g. reduce it) or "
                    "pop it before concat"
                )
    if metrics is not None:
        merged["metrics"] = metrics
    return merged


def list_of_dict_to_dict_of_list(list_of_dict: list[dict]) -> dict[str, list]:
    """``[{"a": 1}, {"a": 2}] -> {"a": [1, 2]}``; every dict must have the keys of the first."""
    if not list_of_dict:
        return {}
    keys = list(list_of_dict[0].keys())
    out: dict[str, list] = {k: [] for k in keys}
    for i, d in enumerate(list_of_dict):
        if set(d.keys()) != set(keys):
            raise ValueError(f"dict {i} has keys {sorted(d)} but dict 0 has {sorted(keys)}")
        for k in keys:
            out[k].append(d[k])
    return out


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add `tensor_dict2`'s arrays to `tensor_dict1` in place; shared keys must hold equal arrays
    (object arrays compared element-wise, NaN equal to NaN), else ValueError naming the key."""
    for key, val in tensor_dict2.items():
        if key in tensor_dict1:
            if not isinstance(val, np.ndarray) or not values_equal(tensor_dict1[key], val):
                raise ProtocolError(
                    f"`{key}` in tensor_dict1 and tensor_dict2 are not the same object. The "
                    f"non-tensor key {key!r} holds "
                    "different values in the two dicts; union refuses to overwrite it"
                )
        else:
            tensor_dict1[key] = val
    return tensor_dict1


def union_meta(meta1: dict, meta2: dict) -> dict:
    """Add `meta2`'s entries to `meta1` in place; a shared key must hold equal values."""
    for key, val in meta2.items():
        if key in meta1 and not values_equal(meta1[key], val):
            raise ProtocolError(
                f"{key} in meta_dict1 and meta_dict2 are not the same object: meta_info key {key!r} "
                "differs between the "
                f"two DataProtos ({short_repr(meta1[key])} vs {short_repr(val)})"
            )
        meta1[key] = val
    return meta1


def _collate_indices(rows: list) -> np.ndarray:
    return np.asarray(rows, dtype=np.int64)


_RESERVED_LOADER_KWARGS = ("dataset", "batch_size", "collate_fn", "generator")


def mini_batch_indices(
    n: int, mini_batch_size: int, epochs: int, seed: int | None, dataloader_kwargs: dict | None
) -> Iterator[np.ndarray]:
    """Row numbers of each mini-batch for `make_iterator`, epoch after epoch.

    The order comes from a `torch.utils.data.DataLoader` over ``range(n)`` with ``batch_size=
    mini_batch_size``, the given `dataloader_kwargs` (``shuffle``, ``drop_last``, ``sampler``...)
    and, when `seed` is set, one ``torch.Generator`` seeded once and shared by all epochs. That
    is how upstream draws it, so the same seed gives the same mini-batches as upstream.
    """
    from torch.utils.data import DataLoader

    kwargs = dict(dataloader_kwargs or {})
    reserved = [k for k in _RESERVED_LOADER_KWARGS if k in kwargs]
    if reserved:
        raise ValueError(f"dataloader_kwargs must not set {reserved}: make_iterator sets them itself")
    if not isinstance(mini_batch_size, int) or mini_batch_size <= 0:
        raise ValueError(f"mini_batch_size must be a positive int, got {mini_batch_size!r}")
    if not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be a non-negative int, got {epochs!r}")
    if n % mini_batch_size != 0 and not kwargs.get("drop_last", False):
        raise ProtocolError(
            f"{n} % {mini_batch_size} != 0: {n} rows do not divide into mini-batches of {mini_batch_size}; pass "
            "dataloader_kwargs={'drop_last': True} to drop the remainder"
        )
    generator = None
    if seed is not None:
        generator = torch.Generator()
        generator.manual_seed(seed)
    loader = DataLoader(
        range(n), batch_size=mini_batch_size, collate_fn=_collate_indices, generator=generator, **kwargs
    )
    for _ in range(epochs):
        yield from loader


def as_slice(idx: np.ndarray) -> slice | None:
    """`idx` as a slice when it is a run of consecutive rows (so the mini-batch can be a view)."""
    if idx.size and np.array_equal(idx, np.arange(idx[0], idx[0] + idx.size)):
        return slice(int(idx[0]), int(idx[0]) + idx.size)
    return None
