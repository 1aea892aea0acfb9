"""DataProtos still being computed: `DataProtoFuture`, the dispatch view `BatchData`, `WorkerCallError`.

The data layer knows nothing of Ray. A future holds opaque object refs and the function that
resolves them; the controller backend that makes the refs registers both the ref type and that
function once (`register_object_refs`; `verl.single_controller.ray.calls` does so for Ray on
import). A future captures the resolver when it is built and pickles with it (a module-level
function travels by name), so a worker that receives a future can resolve it without having
imported the backend first.

Import these names from `verl.protocol` (upstream's module); they live here to keep that module
about `DataProto` itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from tensordict import TensorDictBase

from verl.dataproto.base import DataProtoBase
from verl.utils import tensordict_utils as tu

if TYPE_CHECKING:
    DataProto = DataProtoBase  # annotations: a verl.protocol.DataProto

__all__ = ["BatchData", "DataProtoFuture", "WorkerCallError", "is_object_ref", "register_object_refs"]


class WorkerCallError(RuntimeError):
    """A remote worker call failed: the worker raised, or its process died.

    Attributes: ``label`` (which worker and method, e.g. ``"MyWorker.compute on rank 1"``),
    ``rank`` (int or None) and ``method`` (str or None). The message holds the remote traceback.
    """

    def __init__(self, message: str, label: str = "", rank: int | None = None, method: str | None = None):
        super().__init__(message)
        self.label, self.rank, self.method = label, rank, method


# The registered backend: the type of its object refs and ``resolve(refs, labels, timeout) -> values``
# (raising WorkerCallError naming the label of a failed producer).
_ref_types: tuple[type, ...] = ()
_default_resolve: Callable[[list, list | None, float | None], list] | None = None


def register_object_refs(ref_type: type, resolve: Callable[[list, list | None, float | None], list]) -> None:
    """Declare the object-ref type of a controller backend and how to resolve a list of them."""
    global _ref_types, _default_resolve
    if ref_type not in _ref_types:
        _ref_types = (*_ref_types, ref_type)
    _default_resolve = resolve


def is_object_ref(obj: Any) -> bool:
    """True for an object ref of a registered backend (False while none is registered)."""
    return bool(_ref_types) and isinstance(obj, _ref_types)


def _concat_dataprotos(parts: list) -> DataProto:
    """`DataProto.concat` of `parts`, through the class they came in (a subclass stays one)."""
    return type(parts[0]).concat(parts)


def _pick_chunk(data: DataProto, index: int, chunks: int) -> DataProto:
    return data.chunk(chunks=chunks)[index]


def _apply_in_order(data: Any, fns: tuple) -> Any:
    for fn in fns:
        data = fn(data)
    return data


@dataclass
class DataProtoFuture:
    """A DataProto still being computed by a worker group (``register(blocking=False)``).

    ``futures`` are the object refs of the per-worker outputs, ``collect_fn`` combines them
    (`DataProto.concat`), ``dispatch_fn`` optionally picks a part of the result (set by `chunk`).
    Pass it straight to another worker group's DP_COMPUTE_PROTO method: each receiving worker
    resolves it itself, so the driver never waits for or copies the data. ``labels`` name the
    producing workers for error messages; ``resolve_fn`` turns the refs into values (the registered
    backend's when not given).
    """

    collect_fn: Callable
    futures: list
    dispatch_fn: Callable | None = None
    labels: list | None = None
    resolve_fn: Callable | None = None

    def __post_init__(self):
        if self.resolve_fn is None:
            self.resolve_fn = _default_resolve

    @staticmethod
    def concat(data: list, labels: list | None = None) -> DataProtoFuture:
        """A future of the concatenation of the DataProtos behind the object refs `data`."""
        return DataProtoFuture(collect_fn=_concat_dataprotos, futures=list(data), labels=labels)

    def chunk(self, chunks: int) -> list[DataProtoFuture]:
        """`chunks` futures; the i-th resolves to ``self.get().chunk(chunks)[i]``."""
        if not isinstance(chunks, int) or chunks <= 0:
            raise ValueError(f"chunks must be a positive int, got {chunks!r}")
        return [self.then(partial(_pick_chunk, index=i, chunks=chunks)) for i in range(chunks)]

    def then(self, fn: Callable[[DataProto], DataProto]) -> DataProtoFuture:
        """A future of ``fn(self.get())`` (fn must be picklable: it runs where the future is resolved)."""
        steps = fn if self.dispatch_fn is None else partial(_apply_in_order, fns=(self.dispatch_fn, fn))
        return DataProtoFuture(
            collect_fn=self.collect_fn,
            futures=self.futures,
            dispatch_fn=steps,
            labels=self.labels,
            resolve_fn=self.resolve_fn,
        )

    def get(self, timeout: float | None = None) -> DataProto:
        """Wait for the outputs and combine them; a failed producer raises WorkerCallError naming it."""
        resolve = self.resolve_fn or _default_resolve  # a backend registered after the future was built
        if resolve is None:
            raise RuntimeError(
                "DataProtoFuture.get: no object-ref backend is registered, so the refs cannot be resolved; "
                "import verl.single_controller.ray (it registers Ray's) before building the future"
            )
        outputs = resolve(self.futures, self.labels, timeout)
        as_tensordict = bool(outputs) and all(isinstance(o, TensorDictBase) for o in outputs)
        for i, out in enumerate(outputs):
            if not isinstance(out, DataProtoBase) and not as_tensordict:
                who = self.labels[i].text if self.labels else f"result {i}"
                raise TypeError(
                    f"{who} returned a {type(out).__name__}, but a DataProtoFuture needs DataProto (or "
                    "all TensorDict) outputs"
                )
        # TensorDict outputs (upstream's "protocol v2" workers) are concatenated the tensordict way
        result = tu.concat_tensordict(outputs) if as_tensordict else self.collect_fn(outputs)
        if self.dispatch_fn is not None:
            result = self.dispatch_fn(result)
        return result


class BatchData:
    """Uniform view of what a dispatch passes to or collects from workers.

    Wraps one value (``BatchData(x).chunk(n)``: a `DataProto`, `DataProtoFuture` or `TensorDict`
    split into `n` parts for `n` workers) or a list of worker outputs (``BatchData(outputs).concat()``:
    DataProtos, TensorDicts, or object refs of DataProtos, which become a `DataProtoFuture`).
    Upstream's single-controller code uses these four methods; so can a custom dispatch mode.
    """

    def __init__(self, data: Any):
        self.data = data

    def is_chunkable(self) -> bool:
        """True for a DataProto, DataProtoFuture or TensorDict."""
        return isinstance(self.data, (DataProtoBase, DataProtoFuture, TensorDictBase))

    def chunk(self, chunks: int) -> list:
        """`chunks` consecutive parts of the wrapped value (see `DataProto.chunk`)."""
        if isinstance(self.data, (DataProtoBase, DataProtoFuture)):
            return self.data.chunk(chunks=chunks)
        if isinstance(self.data, TensorDictBase):
            return tu.chunk_tensordict(self.data, chunks)
        raise TypeError(
            f"BatchData.chunk: a {type(self.data).__name__} is not chunkable (expected DataProto, "
            "DataProtoFuture or TensorDict)"
        )

    def _kind(self) -> str | None:
        items = self.data
        if not isinstance(items, (list, tuple)) or not items:
            return None
        if all(isinstance(o, DataProtoBase) for o in items):
            return "dataproto"
        if all(isinstance(o, TensorDictBase) for o in items):
            return "tensordict"
        if all(is_object_ref(o) for o in items):
            return "refs"
        return None

    def is_concatable(self) -> bool:
        """True for a non-empty list of DataProtos, of TensorDicts, or of object refs."""
        return self._kind() is not None

    def concat(self) -> Any:
        """Concatenate the wrapped list (DataProto.concat / concat_tensordict / DataProtoFuture.concat)."""
        kind = self._kind()
        if kind == "dataproto":
            return _concat_dataprotos(list(self.data))
        if kind == "tensordict":
            return tu.concat_tensordict(list(self.data))
        if kind == "refs":
            return DataProtoFuture.concat(list(self.data))
        types = (
            sorted({type(o).__name__ for o in self.data})
            if isinstance(self.data, (list, tuple))
            else [type(self.data).__name__]
        )
        raise TypeError(
            f"BatchData.concat needs a non-empty list of DataProto, TensorDict or ray.ObjectRef, got {types}"
        )
