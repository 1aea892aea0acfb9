"""DataProto: the batch container exchanged between the driver and the worker groups.

A `DataProto` of ``bs`` rows holds

- ``batch``: a `TensorDict` with one batch dimension of size ``bs``; every tensor is ``(bs, ...)``
  (token ids ``(bs, seq_len)``, masks ``(bs, seq_len)`` with 1 = valid token, scores ``(bs,)``...);
- ``non_tensor_batch``: ``name -> np.ndarray`` of length ``bs`` along axis 0, usually
  ``dtype=object`` holding per-row Python objects (prompt strings, ``uid``, ground truths, dicts);
- ``meta_info``: a plain dict of batch-wide values (temperature, global step, metrics).

Every row operation (slice, index, chunk, concat, repeat, reorder) is applied to ``batch`` and
``non_tensor_batch`` together so rows stay aligned; ``meta_info`` is carried along (shallow-copied).
The public names and behaviour follow upstream verl's `verl.protocol`.
"""

from __future__ import annotations

import copy
import logging
import os
import pickle
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from verl.dataproto.base import DataProtoBase

# Re-exported: upstream's public names of `verl.protocol` that live beside DataProto (the same
# objects, so `isinstance(x, DataProtoFuture)` holds whichever module a caller imports them from).
from verl.dataproto.batch_ops import (
    all_gather_data_proto,
    fold_batch_dim,
    pad_dataproto_to_divisor,
    unfold_batch_dim,
    unpad_dataproto,
)
from verl.dataproto.futures import BatchData, DataProtoFuture, WorkerCallError
from verl.utils import tensordict_utils as tu
from verl.utils.protocol_utils import (
    as_slice,
    index_array,
    list_of_dict_to_dict_of_list,
    merge_meta_info,
    mini_batch_indices,
    to_object_array,
    union_meta,
    union_numpy_dict,
    values_equal,
)
from verl.utils.tensordict_utils import (
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)

logger = logging.getLogger(__name__)


__all__ = [
    "BatchData",
    "DataProto",
    "DataProtoConfig",
    "DataProtoFuture",
    "DataProtoItem",
    "WorkerCallError",
    "all_gather_data_proto",
    "collate_fn",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "union_numpy_dict",
    "union_tensor_dict",
    "unfold_batch_dim",
    "unpad_dataproto",
]


class _DataProtoConfigMeta(type):
    """Gives `DataProtoConfig` class-level properties (``DataProtoConfig.auto_padding = True``)."""

    _config: dict[str, Any] = {}
    auto_padding_key = "_verl_auto_padding"

    @property
    def auto_padding(cls) -> bool:
        by_env = os.environ.get("VERL_AUTO_PADDING", "").strip().upper() in ("1", "TRUE", "YES", "ON")
        return by_env or bool(cls._config.get(cls.auto_padding_key, False))

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"DataProtoConfig.auto_padding must be a bool, got {enabled!r}")
        cls._config[cls.auto_padding_key] = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Process-wide switches of the data layer.

    ``DataProtoConfig.auto_padding`` (or env ``VERL_AUTO_PADDING=1``) lets `DataProto.chunk` split
    unevenly and lets `Dispatch.DP_COMPUTE_PROTO` pad a batch to a multiple of the worker count
    (the padding rows are removed from the result). Per batch, the same is enabled with
    ``meta_info[DataProtoConfig.auto_padding_key] = True`` (``from_dict(..., auto_padding=True)``).
    """


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add `tensor_dict2`'s keys to `tensor_dict1` in place; shared keys must hold equal values."""
    return tu.union_tensor_dict(tensor_dict1, tensor_dict2)


# ----------------------------------------------------------------------------- DataProtoItem


@dataclass
class DataProtoItem:
    """One row of a DataProto: ``batch`` has batch size ``[]``, ``non_tensor_batch`` holds scalars."""

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- DataProto


@dataclass(repr=False, eq=False)
class DataProto(DataProtoBase):
    """A batch of ``len(self)`` rows: tensors in ``batch``, per-row objects in ``non_tensor_batch``,
    batch-wide values in ``meta_info`` (see the module docstring).

    Construct with `from_dict` / `from_single_dict`; the constructor validates that every entry has
    the same number of rows.
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.non_tensor_batch is None:
            self.non_tensor_batch = {}
        if self.meta_info is None:
            self.meta_info = {}
        self.check_consistency()

    # ------------------------------------------------------------------ basics

    def check_consistency(self) -> None:
        """Raise if the parts disagree: batch must be a TensorDict with one batch dimension, every
        non-tensor entry an np.ndarray with that many rows, meta_info a dict."""
        if self.batch is not None:
            if not isinstance(self.batch, TensorDictBase):
                raise TypeError(f"DataProto.batch must be a TensorDict or None, got {type(self.batch).__name__}")
            if len(self.batch.batch_size) != 1:
                raise ValueError(
                    "DataProto.batch must have exactly one batch dimension, got "
                    f"batch_size={tuple(self.batch.batch_size)}"
                )
        if not isinstance(self.non_tensor_batch, dict):
            raise TypeError(f"DataProto.non_tensor_batch must be a dict, got {type(self.non_tensor_batch).__name__}")
        if not isinstance(self.meta_info, dict):
            raise TypeError(f"DataProto.meta_info must be a dict, got {type(self.meta_info).__name__}")
        rows = self.batch.batch_size[0] if self.batch is not None else None
        reference = "batch"
        for key, val in self.non_tensor_batch.items():
            if not isinstance(val, np.ndarray):
                raise TypeError(
                    f"non_tensor_batch[{key!r}] must be a np.ndarray (dtype=object for Python objects), got "
                    f"{type(val).__name__}"
                )
            if val.ndim == 0:
                raise ValueError(
                    f"non_tensor_batch[{key!r}] is a 0-d array; it needs one entry per row (put batch-wide "
                    "values in meta_info)"
                )
            if rows is None:
                rows, reference = val.shape[0], f"non_tensor_batch[{next(iter(self.non_tensor_batch))!r}]"
            elif val.shape[0] != rows:
                raise ValueError(f"non_tensor_batch[{key!r}] has {val.shape[0]} rows but {reference} has {rows}")

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        if self.non_tensor_batch:
            return int(next(iter(self.non_tensor_batch.values())).shape[0])
        return 0

    def __repr__(self) -> str:
        tensors = (
            {k: f"{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" for k, v in self.batch.items()}
            if self.batch is not None
            else {}
        )
        non_tensors = {k: f"{v.shape} {v.dtype}" for k, v in self.non_tensor_batch.items()}
        return (
            f"DataProto(len={len(self)}, batch={tensors}, non_tensor_batch={non_tensors}, "
            f"meta_info_keys={sorted(self.meta_info)})"
        )

    def __getitem__(self, item):
        """``data[i]`` -> DataProtoItem; ``data[a:b]`` -> view; list / array / tensor of ints or a
        bool mask -> a new DataProto with those rows (copied)."""
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            n = len(self)
            if not -n <= item < n:
                raise IndexError(f"row {item} is out of range for a DataProto of {n} rows")
            item = int(item) % n
            batch = self.batch[item] if self.batch is not None else None
            return DataProtoItem(
                batch=batch,
                non_tensor_batch={k: v[item] for k, v in self.non_tensor_batch.items()},
                meta_info=self.meta_info,
            )
        if isinstance(item, (list, tuple, np.ndarray, torch.Tensor)):
            return self.select_idxs(item)
        raise TypeError(
            f"DataProto indices must be int, slice, list, np.ndarray or torch.Tensor, got {type(item).__name__}"
        )

    def __iter__(self) -> Iterator[DataProtoItem]:
        for i in range(len(self)):
            yield self[i]

    # ------------------------------------------------------------------ pickling and files

    def __getstate__(self):
        # Tensors travel as flat byte buffers (see tensordict_utils.tensordict_to_state): no
        # per-row objects, and Ray can pass the buffers out of band without copying them.
        return {
            "batch": tu.tensordict_to_state(self.batch),
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    def __setstate__(self, state):
        self.batch = tu.tensordict_from_state(state["batch"])
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def save_to_disk(self, filepath: str) -> None:
        """Write this DataProto to `filepath` (atomically: a crash never leaves half a file)."""
        directory = os.path.dirname(os.path.abspath(filepath))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".dataproto-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(self, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, filepath)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @staticmethod
    def load_from_disk(filepath: str) -> DataProto:
        """Read a DataProto written by `save_to_disk`."""
        with open(filepath, "rb") as f:
            data = pickle.load(f)
        if not isinstance(data, DataProto):
            raise TypeError(f"{filepath} holds a {type(data).__name__}, not a DataProto")
        return data

    def get_data_info(self) -> str:
        """Human-readable list of the keys with shapes and dtypes."""
        lines = [f"DataProto with {len(self)} rows"]
        lines.append("batch:")
        if self.batch is not None:
            for key, val in self.batch.items():
                shape = tuple(val.shape) if hasattr(val, "shape") else "?"
                lines.append(
                    f"  {key}: shape={shape} dtype={getattr(val, 'dtype', type(val).__name__)} "
                    f"device={getattr(val, 'device', None)}"
                )
        lines.append("non_tensor_batch:")
        for key, val in self.non_tensor_batch.items():
            lines.append(f"  {key}: shape={val.shape} dtype={val.dtype}")
        lines.append("meta_info:")
        for key, val in self.meta_info.items():
            lines.append(f"  {key}: {type(val).__name__}")
        return "\n".join(lines)

    def print_size(self, prefix: str = "") -> None:
        """Print the memory held by the tensors and by the numpy arrays (object payloads not counted)."""
        tensor_bytes = 0
        if self.batch is not None:
            for _, t in self.batch.items(include_nested=True, leaves_only=True):
                if isinstance(t, torch.Tensor):
                    tensor_bytes += t.element_size() * t.numel()
        array_bytes = sum(v.nbytes for v in self.non_tensor_batch.values())
        print(
            f"{prefix}size of tensordict: {tensor_bytes / 1024**3:.6f} GB, size of non_tensor_batch: "
            f"{array_bytes / 1024**3:.6f} GB"
        )

    def print_summary(self, desc: str) -> None:
        """Print the meta_info values, the tensors' shapes and dtypes and the non-tensor entries'
        shapes and element types, between start/end markers naming `desc`."""
        print(f"--- start of {desc} ---")
        for key, val in self.meta_info.items():
            if isinstance(val, list):
                print(f"meta_info: {key}: len={len(val)}, first={val[:10]}")
            else:
                print(f"meta_info: {key}: {val}")
        if self.batch is not None:
            for key, tensor in self.batch.items():
                print(f"batch field(tensor): {key}, tensor_size: {tuple(tensor.shape)}, dtype: {tensor.dtype}")
        for key, arr in self.non_tensor_batch.items():
            first = type(arr[0]).__name__ if len(arr) else "-"
            print(f"non_tensor_batch field (numpy array): {key}, array (size: {arr.shape}), type: {first}")
        print(f"--- end of {desc} ---")

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_single_dict(
        cls, data: dict[str, Any], meta_info: dict | None = None, auto_padding: bool = False
    ) -> DataProto:
        """Split one dict into tensors (torch.Tensor) and per-row objects (np.ndarray, list, tuple)."""
        tensors, non_tensors = {}, {}
        for key, val in data.items():
            if isinstance(val, torch.Tensor):
                tensors[key] = val
            elif isinstance(val, (np.ndarray, list, tuple)):
                non_tensors[key] = val
            else:
                raise TypeError(
                    f"value of {key!r} has type {type(val).__name__}; expected torch.Tensor, np.ndarray, list or tuple"
                )
        return cls.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info, auto_padding=auto_padding)

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> DataProto:
        """Build a DataProto; rows are dim 0 of every tensor and axis 0 of every non-tensor entry.

        Args:
            tensors: name -> tensor ``(bs, ...)``.
            non_tensors: name -> np.ndarray, list or tuple of ``bs`` per-row objects (lists are
                stored as 1-D object arrays even when their items are equal-length lists).
            meta_info: batch-wide values (copied shallowly).
            num_batch_dims: must be 1 (kept for upstream signature compatibility).
            auto_padding: allow uneven chunking of this batch (see `DataProtoConfig`).
        """
        if num_batch_dims != 1:
            raise tu.ProtocolError(
                "only support num_batch_dims=1: DataProto has exactly one batch dimension, got "
                f"num_batch_dims={num_batch_dims}"
            )
        tensors = tensors or {}
        non_tensors = non_tensors or {}
        meta_info = dict(meta_info or {})
        batch = None
        if tensors:
            first_key, bs = None, None
            for key, t in tensors.items():
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"tensors[{key!r}] has type {type(t).__name__}; expected torch.Tensor")
                if t.dim() < 1:
                    raise ValueError(f"tensors[{key!r}] is 0-d; every tensor needs a leading batch dimension")
                if bs is None:
                    first_key, bs = key, t.shape[0]
                elif t.shape[0] != bs:
                    raise ValueError(f"tensors[{key!r}] has {t.shape[0]} rows but tensors[{first_key!r}] has {bs}")
            batch = TensorDict(source=dict(tensors), batch_size=[bs])
        converted = {key: to_object_array(val, key) for key, val in non_tensors.items()}
        if auto_padding:
            meta_info[DataProtoConfig.auto_padding_key] = True
        return cls(batch=batch, non_tensor_batch=converted, meta_info=meta_info)

    @classmethod
    def from_tensordict(
        cls, tensor_dict: TensorDict, meta_info: dict | None = None, num_batch_dims: int = 1
    ) -> DataProto:
        """Inverse of `to_tensordict`: tensors -> batch, `NonTensorStack` -> non_tensor_batch
        (object arrays), `NonTensorData` -> meta_info."""
        from tensordict.tensorclass import NonTensorData, NonTensorStack

        if num_batch_dims != 1:
            raise ValueError(f"DataProto supports exactly one batch dimension, got num_batch_dims={num_batch_dims}")
        meta = dict(meta_info or {})
        tensors, non_tensors = {}, {}
        for key in tensor_dict.keys():
            val = tensor_dict.get(key)
            if isinstance(val, NonTensorStack):
                non_tensors[key] = to_object_array(val.tolist(), key)
            elif isinstance(val, NonTensorData):
                if key in meta and not values_equal(meta[key], val.data):
                    raise ValueError(f"meta_info[{key!r}] is given twice with different values")
                meta[key] = val.data
            else:
                tensors[key] = val
        batch = None
        if tensors:
            if len(tensor_dict.batch_size) < 1:
                raise ValueError("the TensorDict has no batch dimension; build it with batch_size=[bs]")
            batch = TensorDict(source=tensors, batch_size=tensor_dict.batch_size[:1], device=tensor_dict.device)
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    def to_tensordict(self) -> TensorDict:
        """One TensorDict holding everything: tensors as is, each non-tensor entry as a
        `NonTensorStack` of row objects, each meta_info entry as `NonTensorData`."""
        tensors: dict[str, Any] = dict(self.batch.items()) if self.batch is not None else {}
        for key, val in self.non_tensor_batch.items():
            if key in tensors:
                raise ValueError(
                    f"key {key!r} is in both batch and non_tensor_batch; rename one before to_tensordict()"
                )
            tensors[key] = list(val)
        clash = set(tensors) & set(self.meta_info)
        if clash:
            raise ValueError(f"meta_info keys {sorted(clash)} clash with row keys; rename them before to_tensordict()")
        td = tu.get_tensordict(tensors, dict(self.meta_info))
        if not tensors:
            td.batch_size = torch.Size([len(self)])
        return td

    # ------------------------------------------------------------------ selection

    def _derive(self, batch: TensorDict | None, non_tensor_batch: dict, meta_info: dict | None = None) -> DataProto:
        # Row-derived DataProtos share nothing mutable at the top level with their parent.
        return type(self)(
            batch=batch,
            non_tensor_batch=non_tensor_batch,
            meta_info=dict(self.meta_info) if meta_info is None else meta_info,
        )

    def to(self, device) -> DataProto:
        """Move the tensors to `device` (in place) and return self."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def select(
        self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None, deepcopy: bool = False
    ) -> DataProto:
        """A DataProto with only the given keys (None = all of that part). KeyError names a missing key.

        Tensors are shared with self unless ``deepcopy=True`` (then everything is copied)."""
        if batch_keys is not None:
            batch_keys = [batch_keys] if isinstance(batch_keys, str) else list(batch_keys)
            available = set(self.batch.keys()) if self.batch is not None else set()
            missing = [k for k in batch_keys if k not in available]
            if missing:
                raise KeyError(f"batch keys {missing} not found; available: {sorted(available)}")
            batch = self.batch.select(*batch_keys) if self.batch is not None else None
        else:
            batch = self.batch
        if non_tensor_batch_keys is not None:
            non_tensor_batch_keys = (
                [non_tensor_batch_keys] if isinstance(non_tensor_batch_keys, str) else list(non_tensor_batch_keys)
            )
            missing = [k for k in non_tensor_batch_keys if k not in self.non_tensor_batch]
            if missing:
                raise KeyError(f"non_tensor_batch keys {missing} not found; available: {sorted(self.non_tensor_batch)}")
            non_tensor = {k: self.non_tensor_batch[k] for k in non_tensor_batch_keys}
        else:
            non_tensor = dict(self.non_tensor_batch)
        if meta_info_keys is not None:
            meta_info_keys = [meta_info_keys] if isinstance(meta_info_keys, str) else list(meta_info_keys)
            missing = [k for k in meta_info_keys if k not in self.meta_info]
            if missing:
                raise KeyError(f"meta_info keys {missing} not found; available: {sorted(self.meta_info)}")
            meta = {k: self.meta_info[k] for k in meta_info_keys}
        else:
            meta = dict(self.meta_info)
        if deepcopy:
            batch = batch.clone() if batch is not None else None
            non_tensor = copy.deepcopy(non_tensor)
            meta = copy.deepcopy(meta)
        elif batch is self.batch and batch is not None:
            # a new TensorDict object over the same tensors, so adding keys to the result leaves self alone
            batch = batch.select(*batch.keys())
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def select_idxs(self, idxs) -> DataProto:
        """Rows `idxs` (ints, negative allowed, or a bool mask of len(self); list, numpy or torch),
        in the given order, copied into a new DataProto."""
        idx = index_array(idxs, len(self))
        batch = self.batch[torch.from_numpy(idx)] if self.batch is not None else None
        if batch is not None and idx.size == 0:
            batch = self.batch[0:0]
        return self._derive(batch, {k: v[idx] for k, v in self.non_tensor_batch.items()})

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows ``start:end:step`` as a view (tensors are not copied). A negative step is allowed
        and then copies."""
        sl = slice(start, end, step)
        if step is not None and step < 0:
            return self.select_idxs(np.arange(len(self))[sl])
        batch = self.batch[sl] if self.batch is not None else None
        return self._derive(batch, {k: v[sl] for k, v in self.non_tensor_batch.items()})

    def pop(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None) -> DataProto:
        """Remove the given keys from self and return them as a new DataProto (KeyError names a
        missing key; nothing is removed in that case)."""
        batch_keys = [batch_keys] if isinstance(batch_keys, str) else list(batch_keys or [])
        non_tensor_batch_keys = (
            [non_tensor_batch_keys] if isinstance(non_tensor_batch_keys, str) else list(non_tensor_batch_keys or [])
        )
        meta_info_keys = [meta_info_keys] if isinstance(meta_info_keys, str) else list(meta_info_keys or [])
        available = set(self.batch.keys()) if self.batch is not None else set()
        for keys, have, part in (
            (batch_keys, available, "batch"),
            (non_tensor_batch_keys, self.non_tensor_batch, "non_tensor_batch"),
            (meta_info_keys, self.meta_info, "meta_info"),
        ):
            missing = [k for k in keys if k not in have]
            if missing:
                raise KeyError(f"{part} keys {missing} not found; available: {sorted(have)}")
        tensors = {k: self.batch.pop(k) for k in batch_keys}
        non_tensors = {k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys}
        meta = {k: self.meta_info.pop(k) for k in meta_info_keys}
        batch = (
            TensorDict(source=tensors, batch_size=self.batch.batch_size, device=self.batch.device) if tensors else None
        )
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    def rename(self, old_keys=None, new_keys=None) -> DataProto:
        """Rename keys in place (batch keys, or non-tensor keys when the name is there); returns self."""
        old = [old_keys] if isinstance(old_keys, str) else list(old_keys or [])
        new = [new_keys] if isinstance(new_keys, str) else list(new_keys or [])
        if len(old) != len(new):
            raise ValueError(
                f"rename needs as many new keys as old keys, got {len(old)} old {old} and {len(new)} new {new}"
            )
        for o, n in zip(old, new, strict=False):
            if self.batch is not None and o in self.batch.keys():
                self.batch.rename_key_(o, n)
            elif o in self.non_tensor_batch:
                if n in self.non_tensor_batch:
                    raise KeyError(f"cannot rename {o!r} to {n!r}: {n!r} already exists in non_tensor_batch")
                self.non_tensor_batch[n] = self.non_tensor_batch.pop(o)
            else:
                raise KeyError(f"key {o!r} not found in batch or non_tensor_batch")
        return self

    def union(self, other: DataProto) -> DataProto:
        """Add `other`'s keys to self in place (equal row counts; a shared key must hold equal
        values, else ValueError naming it) and return self."""
        if (
            len(self) != len(other)
            and (self.batch is not None or self.non_tensor_batch)
            and (other.batch is not None or other.non_tensor_batch)
        ):
            raise tu.ProtocolError(
                f"Two tensor dict must have identical batch size: cannot union DataProtos of {len(self)} "
                f"and {len(other)} rows"
            )
        if self.batch is None:
            self.batch = other.batch
        elif other.batch is not None:
            self.batch = union_tensor_dict(self.batch, other.batch)
        self.non_tensor_batch = union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        self.meta_info = union_meta(self.meta_info, other.meta_info)
        self.check_consistency()
        return self

    # ------------------------------------------------------------------ iteration and splitting

    def make_iterator(
        self, mini_batch_size: int, epochs: int, seed: int | None = None, dataloader_kwargs: dict | None = None
    ) -> Iterator[DataProto]:
        """Yield mini-batches of `mini_batch_size` rows, `epochs` times over the data.

        ``dataloader_kwargs`` go to the `torch.utils.data.DataLoader` that draws the row order
        (``shuffle``: a new permutation each epoch, reproducible with `seed` and the same as
        upstream's for that seed; ``drop_last``; a ``sampler``...). Without ``drop_last`` the row
        count must divide evenly. Every mini-batch carries this DataProto's meta_info, and its
        non-tensor entries are object arrays (as upstream's collate makes them).
        """
        for idx in mini_batch_indices(len(self), mini_batch_size, epochs, seed, dataloader_kwargs):
            run = as_slice(idx)
            part = self.slice(run.start, run.stop) if run is not None else self.select_idxs(idx)
            part.non_tensor_batch = {
                k: v if v.dtype == object else v.astype(object) for k, v in part.non_tensor_batch.items()
            }
            part.meta_info = self.meta_info
            yield part

    def is_padding_enabled(self) -> bool:
        """True when this batch (meta_info) or the process (DataProtoConfig) enables auto padding."""
        return bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False)) or DataProtoConfig.auto_padding

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append `padding_size` copies of the last row (``padding_candidate="first"``: the first
        row) in place."""
        if padding_size == 0:
            return
        if len(self) == 0:
            raise ValueError("cannot pad an empty DataProto: there is no row to repeat")
        row = 0 if padding_candidate == "first" else len(self) - 1
        padded = DataProto.concat([self, self.select_idxs(np.full(padding_size, row))])
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into exactly `chunks` consecutive views (each carries this meta_info).

        The row count must divide evenly unless padding is enabled (`is_padding_enabled`). Uneven
        sizes are upstream's: with a tensor batch they are `TensorDict.chunk`'s (every piece
        ``ceil(n / chunks)`` rows, the last ones shorter: 10 rows in 4 -> 3, 3, 3, 1); without one,
        `np.array_split`'s (10 in 4 -> 3, 3, 2, 2). Where `TensorDict.chunk` would return fewer
        than `chunks` pieces (5 rows in 4 -> 2, 2, 1), upstream fails; here the missing trailing
        pieces are empty, so piece i can always go to worker i.
        """
        if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks <= 0:
            raise ValueError(f"chunks must be a positive int, got {chunks!r}")
        n = len(self)
        if n % chunks != 0 and not self.is_padding_enabled():
            raise tu.ProtocolError(
                f"only support equal chunk. Got size of DataProto {n} and chunk {chunks}: "
                f"a DataProto of {n} rows cannot be split into {chunks} equal chunks; pad it first "
                f"(pad_dataproto_to_divisor) or enable auto padding (DataProtoConfig.auto_padding = True)"
            )
        bounds = tu._chunk_bounds(n, chunks) if self.batch is not None else tu._even_bounds(n, chunks)
        return [self.slice(int(bounds[i]), int(bounds[i + 1])) for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive views of `split_size` rows (the last may be shorter)."""
        if not isinstance(split_size, int) or split_size <= 0:
            raise ValueError(f"split_size must be a positive int, got {split_size!r}")
        return [self.slice(start, start + split_size) for start in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: list[DataProto]) -> DataProto:
        """Concatenate rows of several DataProtos (same keys in each part).

        meta_info is merged: ``metrics`` become flat lists over all parts, other keys must agree
        (ValueError naming the key otherwise). Parts with no keys at all (``DataProto()``) only
        contribute meta_info.
        """
        data = list(data)
        if not data:
            raise ValueError("DataProto.concat needs at least one DataProto")
        for i, d in enumerate(data):
            if not isinstance(d, DataProto):
                raise TypeError(f"DataProto.concat: part {i} is a {type(d).__name__}, not a DataProto")
        meta = merge_meta_info([d.meta_info for d in data])
        parts = [d for d in data if d.batch is not None or d.non_tensor_batch]
        if not parts:
            return DataProto(meta_info=meta)
        with_batch = [d.batch is not None for d in parts]
        if any(with_batch) and not all(with_batch):
            raise ValueError(
                f"DataProto.concat: parts {[i for i, b in enumerate(with_batch) if not b]} have no tensor "
                "batch while others do"
            )
        batch = tu.concat_tensordict([d.batch for d in parts]) if all(with_batch) else None
        keys0 = set(parts[0].non_tensor_batch)
        for i, d in enumerate(parts[1:], start=1):
            if set(d.non_tensor_batch) != keys0:
                raise ValueError(
                    f"DataProto.concat: part {i} has non_tensor_batch keys {sorted(d.non_tensor_batch)} but part "
                    f"0 has {sorted(keys0)}"
                )
        non_tensor = {
            k: np.concatenate([d.non_tensor_batch[k] for d in parts], axis=0) for k in parts[0].non_tensor_batch
        }
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def reorder(self, indices) -> None:
        """Reorder rows in place: row i becomes old row ``indices[i]``."""
        idx = index_array(indices, len(self))
        if self.batch is not None:
            self.batch = self.batch[torch.from_numpy(idx)]
        self.non_tensor_batch = {k: v[idx] for k, v in self.non_tensor_batch.items()}

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Each row `repeat_times` times: ``interleave=True`` gives a a b b, False gives a b a b."""
        if not isinstance(repeat_times, int) or repeat_times < 0:
            raise ValueError(f"repeat_times must be a non-negative int, got {repeat_times!r}")
        rows = np.arange(len(self))
        idx = np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)
        if self.batch is None or not all(isinstance(v, torch.Tensor) for v in self.batch.values()) or repeat_times == 0:
            return self.select_idxs(idx)

        # per-tensor repeat_interleave / repeat instead of TensorDict fancy indexing (its per-call
        # overhead dominated this on the driver); the same values, fresh storage
        def rep(v: torch.Tensor) -> torch.Tensor:
            return (
                v.repeat_interleave(repeat_times, dim=0)
                if interleave
                else v.repeat(repeat_times, *([1] * (v.dim() - 1)))
            )

        size = [len(self) * repeat_times, *self.batch.batch_size[1:]]
        batch = TensorDict({k: rep(v) for k, v in self.batch.items()}, batch_size=size, device=self.batch.device)
        return self._derive(batch, {k: v[idx] for k, v in self.non_tensor_batch.items()})

    def sample_level_repeat(self, repeat_times) -> DataProto:
        """Row i repeated ``repeat_times[i]`` times, consecutively (an int repeats every row)."""
        if isinstance(repeat_times, int):
            return self.repeat(repeat_times, interleave=True)
        if isinstance(repeat_times, torch.Tensor):
            counts = repeat_times.detach().cpu().numpy()
        else:
            counts = np.asarray(list(repeat_times))
        if counts.ndim != 1 or counts.shape[0] != len(self):
            raise ValueError(f"repeat_times needs one count per row ({len(self)}), got shape {counts.shape}")
        if counts.size and (not np.issubdtype(counts.dtype, np.integer) or counts.min() < 0):
            raise ValueError(f"repeat_times must be non-negative integers, got {counts.tolist()[:10]}")
        return self.select_idxs(np.repeat(np.arange(len(self)), counts.astype(np.int64)))

    def unfold_column_chunks(self, n_split: int, split_keys: list[str] | None = None) -> DataProto:
        """Cut dim 1 of each `split_keys` entry into `n_split` pieces and move them to the batch
        dimension (``(bs, n_split * k, ...) -> (bs * n_split, k, ...)``); other entries are
        repeated so rows stay aligned."""
        split_keys = set(split_keys or [])
        n = len(self)

        def unfold(key, val):
            if key in split_keys and isinstance(val, np.ndarray) and val.ndim == 1 and val.dtype == object:
                val = _rows_as_columns(key, val)  # one sequence per row: its items become columns
            if key in split_keys:
                if val.shape[1] % n_split != 0:
                    raise ValueError(f"dim 1 of {key!r} has size {val.shape[1]}, not divisible by n_split={n_split}")
                return val.reshape(n * n_split, val.shape[1] // n_split, *val.shape[2:])
            return (
                val.repeat_interleave(n_split, dim=0)
                if isinstance(val, torch.Tensor)
                else np.repeat(val, n_split, axis=0)
            )

        batch = None
        if self.batch is not None:
            batch = TensorDict(
                {k: unfold(k, v) for k, v in self.batch.items()}, batch_size=[n * n_split], device=self.batch.device
            )
        non_tensor = {k: unfold(k, v) for k, v in self.non_tensor_batch.items()}
        return self._derive(batch, non_tensor)


def _rows_as_columns(key: str, val: np.ndarray) -> np.ndarray:
    """A 1-D object array of per-row sequences of one length m -> [n, m] object array (the layout
    upstream's `from_dict` gives such a list), so `unfold_column_chunks` cuts its dim 1."""
    lengths = [len(row) for row in val]
    if any(m != lengths[0] for m in lengths):
        i = next(i for i, m in enumerate(lengths) if m != lengths[0])
        raise ValueError(
            f"unfold_column_chunks: every row of {key!r} must hold the same number of items; "
            f"row {i} has {lengths[i]} items, row 0 has {lengths[0]}"
        )
    out = np.empty((len(val), lengths[0] if lengths else 0), dtype=object)
    for i, row in enumerate(val):
        for j, item in enumerate(row):
            out[i, j] = item  # one by one: an item that is itself a list stays one object
    return out


# ----------------------------------------------------------------------------- collate


def collate_fn(x: list[DataProtoItem]) -> DataProto:
    """Stack DataProtoItems (e.g. from a torch DataLoader over a DataProto) into a DataProto."""
    if not x:
        raise ValueError("collate_fn needs at least one DataProtoItem")
    batch = torch.stack([item.batch for item in x]).contiguous() if x[0].batch is not None else None
    non_tensor = {
        key: to_object_array([item.non_tensor_batch[key] for item in x], key) for key in x[0].non_tensor_batch
    }
    return DataProto(batch=batch, non_tensor_batch=non_tensor)
