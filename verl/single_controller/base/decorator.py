"""`@register`: how a worker method is called from the driver through a worker group.

A registered method carries three choices, read by `WorkerGroup` when it builds the driver-side
proxy of the method:

- dispatch mode: how the driver's arguments become per-worker arguments, and how the per-worker
  results become one result (`Dispatch`, or a dict ``{"dispatch_fn": f, "collect_fn": g}``);
- execute mode: which workers run it (`Execute.ALL` or `Execute.RANK_ZERO`);
- blocking: whether the proxy waits for the results (``False`` returns object refs, or a
  `DataProtoFuture` for DataProto-returning modes).

Dispatch functions have the signature ``dispatch_fn(worker_group, *args, **kwargs) -> (args,
kwargs)`` where, for a call on all workers, every returned argument is a list with one entry per
worker (entry i goes to rank i). Collect functions have ``collect_fn(worker_group, outputs)``
where `outputs` lists the per-rank results (or object refs) in rank order.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial, wraps
from typing import Any

from verl.dataproto.futures import is_object_ref
from verl.protocol import DataProto, DataProtoFuture, pad_dataproto_to_divisor, unpad_dataproto
from verl.utils.py_functional import DynamicEnum

# Keyword the dispatcher adds to a worker call to say how many padding rows it appended; the
# worker-group proxy removes it again before the call and strips that many rows from the result.
_padding_size_key = "_padding_size_key_x123d"


def unpad_output(output, pad: int):
    """A collected result without the `pad` rows the dispatcher appended (see `_padding_size_key`)."""
    if isinstance(output, DataProto):
        return unpad_dataproto(output, pad)
    if isinstance(output, DataProtoFuture):
        return output.then(partial(unpad_dataproto, pad_size=pad))
    # Per-rank lists (DP_COMPUTE_METRIC) cannot be unpadded row-wise: the padding rows were
    # processed by the last ranks and are part of their results.
    return output


__all__ = [
    "MAGIC_ATTR",
    "Dispatch",
    "Execute",
    "collect_all_to_all",
    "collect_dp_compute",
    "collect_dp_compute_data_proto",
    "collect_nd_compute",
    "collect_nd_compute_dataproto",
    "dispatch_all_to_all",
    "dispatch_dp_compute",
    "dispatch_dp_compute_data_proto",
    "dispatch_dp_compute_data_proto_with_func",
    "dispatch_nd_compute",
    "dispatch_nd_compute_dataproto",
    "dispatch_one_to_all",
    "get_predefined_dispatch_fn",
    "get_predefined_execute_fn",
    "make_nd_compute_dataproto_dispatch_fn",
    "register",
    "register_dispatch_mode",
    "unpad_output",
    "update_dispatch_mode",
]

# Attribute under which `register` stores its choices on the method; the odd name avoids clashes
# with anything a user might set on a function.
MAGIC_ATTR = "attrs_3141562937"


class Dispatch(DynamicEnum):
    """How arguments are spread over the workers and results gathered.

    - ``RANK_ZERO``: arguments go unchanged to rank 0 only; its result is returned.
    - ``ONE_TO_ALL``: every worker gets the same arguments; a list of per-rank results is returned.
    - ``ALL_TO_ALL``: arguments are passed as given: if every argument is a list with one entry
      per worker, worker i gets entry i, otherwise every worker gets everything; list of results.
    - ``DP_COMPUTE``: every argument must be a list with one entry per worker; list of results.
    - ``DP_COMPUTE_PROTO``: every argument is a DataProto (or DataProtoFuture) split into
      world_size consecutive chunks; results (DataProtos) are concatenated in rank order. With
      auto padding the batch is padded to a multiple of world_size and the padding rows are
      removed from the result.
    - ``DP_COMPUTE_PROTO_WITH_FUNC``: like DP_COMPUTE_PROTO, but the first argument is a function
      sent unchanged to every worker.
    - ``DP_COMPUTE_METRIC``: split like DP_COMPUTE_PROTO, results returned as a per-rank list.
    - ``DIRECT_ROLLOUT_METHOD``: marks methods that are not meant to be called through the group.
    """

    _registry: dict = {}
    _next_value = 0


class Execute(DynamicEnum):
    """Which workers run a method: ``ALL`` of them, or ``RANK_ZERO`` only."""

    _registry: dict = {}
    _next_value = 0


for _name in (
    "RANK_ZERO",
    "ONE_TO_ALL",
    "ALL_TO_ALL",
    "DP_COMPUTE",
    "DP_COMPUTE_PROTO",
    "DP_COMPUTE_PROTO_WITH_FUNC",
    "DP_COMPUTE_METRIC",
    "DIRECT_ROLLOUT_METHOD",
):
    Dispatch.register(_name)
for _name in ("ALL", "RANK_ZERO"):
    Execute.register(_name)


# ----------------------------------------------------------------------------- dispatch / collect


def dispatch_one_to_all(worker_group, *args, **kwargs):
    n = worker_group.world_size
    return tuple([arg] * n for arg in args), {k: [v] * n for k, v in kwargs.items()}


def dispatch_all_to_all(worker_group, *args, **kwargs):
    return args, kwargs


def collect_all_to_all(worker_group, output):
    return output


def dispatch_rank_zero(worker_group, *args, **kwargs):
    return args, kwargs


def _check_per_worker(worker_group, args, kwargs, what: str):
    n = worker_group.world_size
    for i, arg in enumerate(args):
        if not isinstance(arg, (list, tuple)) or len(arg) != n:
            got = (
                f"a {type(arg).__name__} of length {len(arg)}"
                if isinstance(arg, (list, tuple))
                else f"a {type(arg).__name__}"
            )
            raise ValueError(
                f"{what}: positional argument {i} must be a list with one entry per worker ({n}), got {got}"
            )
    for k, v in kwargs.items():
        if not isinstance(v, (list, tuple)) or len(v) != n:
            got = (
                f"a {type(v).__name__} of length {len(v)}" if isinstance(v, (list, tuple)) else f"a {type(v).__name__}"
            )
            raise ValueError(
                f"{what}: keyword argument {k!r} must be a list with one entry per worker ({n}), got {got}"
            )


def dispatch_dp_compute(worker_group, *args, **kwargs):
    _check_per_worker(worker_group, args, kwargs, "Dispatch.DP_COMPUTE")
    return tuple(list(a) for a in args), {k: list(v) for k, v in kwargs.items()}


def collect_dp_compute(worker_group, output):
    if len(output) != worker_group.world_size:
        raise ValueError(f"expected one result per worker ({worker_group.world_size}), got {len(output)}")
    return output


def _split_args_kwargs_data_proto(chunks: int, *args, **kwargs):
    """Chunk every DataProto / DataProtoFuture argument into `chunks` pieces."""
    split_args = []
    for i, arg in enumerate(args):
        if not isinstance(arg, (DataProto, DataProtoFuture)):
            raise TypeError(
                f"positional argument {i} is a {type(arg).__name__}; this dispatch mode needs DataProto or "
                "DataProtoFuture arguments"
            )
        split_args.append(arg.chunk(chunks=chunks))
    split_kwargs = {}
    for k, v in kwargs.items():
        if not isinstance(v, (DataProto, DataProtoFuture)):
            raise TypeError(
                f"keyword argument {k!r} is a {type(v).__name__}; this dispatch mode needs DataProto or "
                "DataProtoFuture arguments"
            )
        split_kwargs[k] = v.chunk(chunks=chunks)
    return split_args, split_kwargs


def _split_args_kwargs_data_proto_with_auto_padding(chunks: int, *args, **kwargs):
    """Like `_split_args_kwargs_data_proto`, but DataProtos with padding enabled whose length does
    not divide `chunks` are padded first (all such arguments must have the same length); the pad
    size travels to the proxy under `_padding_size_key`. The caller's DataProtos are not modified."""
    length, pad = None, 0
    padded_args, padded_kwargs = [], {}
    items = [(None, a) for a in args] + list(kwargs.items())
    for key, value in items:
        if isinstance(value, DataProto) and value.is_padding_enabled():
            if length is None:
                length = len(value)
                pad = (-length) % chunks
            elif len(value) != length:
                name = "positional argument" if key is None else f"keyword argument {key!r}"
                raise ValueError(
                    f"auto padding needs all DataProto arguments to have the same length; {name} has {len(value)} "
                    f"rows, an earlier one {length}"
                )
            if pad:
                value, _ = pad_dataproto_to_divisor(value, chunks)
        if key is None:
            padded_args.append(value)
        else:
            padded_kwargs[key] = value
    split_args, split_kwargs = _split_args_kwargs_data_proto(chunks, *padded_args, **padded_kwargs)
    if pad:
        split_kwargs[_padding_size_key] = pad
    return split_args, split_kwargs


def dispatch_dp_compute_data_proto(worker_group, *args, **kwargs):
    return _split_args_kwargs_data_proto_with_auto_padding(worker_group.world_size, *args, **kwargs)


def dispatch_dp_compute_data_proto_with_func(worker_group, *args, **kwargs):
    if not args or not callable(args[0]):
        raise TypeError("Dispatch.DP_COMPUTE_PROTO_WITH_FUNC needs a function as the first positional argument")
    split_args, split_kwargs = _split_args_kwargs_data_proto(worker_group.world_size, *args[1:], **kwargs)
    return [[args[0]] * worker_group.world_size] + split_args, split_kwargs


def _concat_data_proto_or_future(output: list):
    if not output:
        raise ValueError("no worker output to concatenate")
    if all(isinstance(o, DataProto) for o in output):
        return DataProto.concat(output)
    if all(is_object_ref(o) for o in output):
        return DataProtoFuture.concat(output)
    kinds = sorted({type(o).__name__ for o in output})
    raise TypeError(f"worker outputs must all be DataProto (or all object refs) to be concatenated, got {kinds}")


def collect_dp_compute_data_proto(worker_group, output):
    return _concat_data_proto_or_future(collect_dp_compute(worker_group, output))


# ----------------------------------------------------------------------------- mesh-aware (nd) dispatch


def dispatch_nd_compute(dp_rank_mapping: list[int], dp_size: int, worker_group, *args, **kwargs):
    """Arguments are lists of `dp_size` entries; worker i gets entry ``dp_rank_mapping[i]``."""
    pad = kwargs.pop(_padding_size_key, None)
    out_args = []
    for i, arg in enumerate(args):
        if not isinstance(arg, (list, tuple)) or len(arg) != dp_size:
            raise ValueError(f"positional argument {i} must be a list of dp_size={dp_size} entries")
        out_args.append([arg[dp_rank_mapping[r]] for r in range(worker_group.world_size)])
    out_kwargs = {}
    for k, v in kwargs.items():
        if not isinstance(v, (list, tuple)) or len(v) != dp_size:
            raise ValueError(f"keyword argument {k!r} must be a list of dp_size={dp_size} entries")
        out_kwargs[k] = [v[dp_rank_mapping[r]] for r in range(worker_group.world_size)]
    if pad is not None:
        out_kwargs[_padding_size_key] = pad
    return tuple(out_args), out_kwargs


def collect_nd_compute(collect_mask: list[bool], worker_group, output):
    """Keep the outputs of the ranks whose ``collect_mask`` entry is True, in rank order."""
    if len(output) != worker_group.world_size:
        raise ValueError(f"expected one result per worker ({worker_group.world_size}), got {len(output)}")
    return [o for o, keep in zip(output, collect_mask, strict=False) if keep]


def dispatch_nd_compute_dataproto(dp_rank_mapping: list[int], dp_size: int, worker_group, *args, **kwargs):
    split_args, split_kwargs = _split_args_kwargs_data_proto_with_auto_padding(dp_size, *args, **kwargs)
    return dispatch_nd_compute(dp_rank_mapping, dp_size, worker_group, *split_args, **split_kwargs)


def collect_nd_compute_dataproto(
    collect_mask: list[bool], worker_group, output, dp_rank_mapping: list[int] | None = None
):
    kept = collect_nd_compute(collect_mask, worker_group, output)
    if dp_rank_mapping is not None:
        # concatenate in data-parallel order even if the collect ranks are not sorted by dp rank
        dp_of_kept = [dp for dp, keep in zip(dp_rank_mapping, collect_mask, strict=False) if keep]
        if sorted(dp_of_kept) != list(range(len(dp_of_kept))):
            raise ValueError(
                f"the collect ranks must hold each data-parallel rank exactly once; their dp ranks are {dp_of_kept}"
            )
        kept = [o for _, o in sorted(zip(dp_of_kept, kept, strict=False), key=lambda pair: pair[0])]
    return _concat_data_proto_or_future(kept)


def _dispatch_info(worker_group, mesh_name: str) -> list[int]:
    if mesh_name not in worker_group._dispatch_info:
        mapping = list(worker_group._query_dispatch_info(mesh_name))
        if len(mapping) != worker_group.world_size:
            raise ValueError(f"mesh {mesh_name!r}: got {len(mapping)} dp ranks for {worker_group.world_size} workers")
        dp_size = max(mapping) + 1
        if sorted(set(mapping)) != list(range(dp_size)):
            raise ValueError(f"mesh {mesh_name!r}: dp ranks {mapping} must cover 0..{dp_size - 1}")
        worker_group._dispatch_info[mesh_name] = mapping
    return worker_group._dispatch_info[mesh_name]


def dispatch_lazy_compute_data_proto(mesh_name: str, worker_group, *args, **kwargs):
    """DP_COMPUTE_PROTO over the data-parallel ranks that the workers registered for `mesh_name`
    (`Worker._register_dispatch_collect_info`); queried once and cached on the group."""
    mapping = _dispatch_info(worker_group, mesh_name)
    return dispatch_nd_compute_dataproto(mapping, max(mapping) + 1, worker_group, *args, **kwargs)


def collect_lazy_compute_data_proto(mesh_name: str, worker_group, output):
    mapping = _dispatch_info(worker_group, mesh_name)
    if mesh_name not in worker_group._collect_info:
        mask = [bool(x) for x in worker_group._query_collect_info(mesh_name)]
        if len(mask) != worker_group.world_size:
            raise ValueError(f"mesh {mesh_name!r}: got {len(mask)} collect flags for {worker_group.world_size} workers")
        worker_group._collect_info[mesh_name] = mask
    return collect_nd_compute_dataproto(
        worker_group._collect_info[mesh_name], worker_group, output, dp_rank_mapping=mapping
    )


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> dict[str, Callable]:
    """Dispatch mode for workers that form a device mesh (e.g. data x sequence parallel).

    Each worker registers ``(dp_rank, is_collect)`` for `mesh_name`; the batch is split into
    ``dp_size`` chunks, every worker of data-parallel rank d receives chunk d (so tensor/sequence
    parallel replicas see the same data), and only the collect ranks' outputs are concatenated
    (in dp order).
    """
    return {
        "dispatch_fn": partial(dispatch_lazy_compute_data_proto, mesh_name),
        "collect_fn": partial(collect_lazy_compute_data_proto, mesh_name),
    }


def _forbidden_direct_call(worker_group, *args, **kwargs):
    raise NotImplementedError(
        "this method is marked Dispatch.DIRECT_ROLLOUT_METHOD and cannot be called through the worker group"
    )


DISPATCH_MODE_FN_REGISTRY: dict[Any, dict[str, Callable]] = {
    Dispatch.RANK_ZERO: {"dispatch_fn": dispatch_rank_zero, "collect_fn": collect_all_to_all},
    Dispatch.ONE_TO_ALL: {"dispatch_fn": dispatch_one_to_all, "collect_fn": collect_all_to_all},
    Dispatch.ALL_TO_ALL: {"dispatch_fn": dispatch_all_to_all, "collect_fn": collect_all_to_all},
    Dispatch.DP_COMPUTE: {"dispatch_fn": dispatch_dp_compute, "collect_fn": collect_dp_compute},
    Dispatch.DP_COMPUTE_PROTO: {
        "dispatch_fn": dispatch_dp_compute_data_proto,
        "collect_fn": collect_dp_compute_data_proto,
    },
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: {
        "dispatch_fn": dispatch_dp_compute_data_proto_with_func,
        "collect_fn": collect_dp_compute_data_proto,
    },
    Dispatch.DP_COMPUTE_METRIC: {"dispatch_fn": dispatch_dp_compute_data_proto, "collect_fn": collect_dp_compute},
    Dispatch.DIRECT_ROLLOUT_METHOD: {"dispatch_fn": _forbidden_direct_call, "collect_fn": _forbidden_direct_call},
}


def get_predefined_dispatch_fn(dispatch_mode) -> dict[str, Callable]:
    """``{"dispatch_fn", "collect_fn"}`` of a `Dispatch` member."""
    try:
        return DISPATCH_MODE_FN_REGISTRY[dispatch_mode]
    except KeyError:
        raise KeyError(
            f"no dispatch functions registered for {dispatch_mode!r}; known: "
            f"{[m.name for m in DISPATCH_MODE_FN_REGISTRY]}"
        ) from None


def register_dispatch_mode(dispatch_mode_name: str, dispatch_fn: Callable, collect_fn: Callable):
    """Add a named dispatch mode, usable as ``Dispatch.<name>``; returns the new member."""
    mode = Dispatch.register(dispatch_mode_name)
    DISPATCH_MODE_FN_REGISTRY[mode] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}
    return mode


def update_dispatch_mode(dispatch_mode, dispatch_fn: Callable, collect_fn: Callable) -> None:
    """Replace the functions of an existing dispatch mode."""
    if dispatch_mode not in DISPATCH_MODE_FN_REGISTRY:
        raise KeyError(f"{dispatch_mode!r} is not a registered dispatch mode")
    DISPATCH_MODE_FN_REGISTRY[dispatch_mode] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}


def get_predefined_execute_fn(execute_mode) -> dict[str, str]:
    """``{"execute_fn_name": ...}``: the WorkerGroup method that runs a call in this mode."""
    table = {
        Execute.ALL: {"execute_fn_name": "execute_all"},
        Execute.RANK_ZERO: {"execute_fn_name": "execute_rank_zero"},
    }
    if execute_mode not in table:
        raise KeyError(f"unknown execute mode {execute_mode!r}; known: {[m.name for m in table]}")
    return table[execute_mode]


def _check_dispatch_mode(dispatch_mode) -> None:
    if isinstance(dispatch_mode, Dispatch):
        return
    if isinstance(dispatch_mode, dict):
        for key in ("dispatch_fn", "collect_fn"):
            if not callable(dispatch_mode.get(key)):
                raise ValueError(
                    f"a custom dispatch mode must be a dict with callables 'dispatch_fn' and 'collect_fn'; {key!r} is "
                    f"{dispatch_mode.get(key)!r}"
                )
        return
    raise TypeError(
        f"dispatch_mode must be a Dispatch member or a dict {{'dispatch_fn', 'collect_fn'}}, got {dispatch_mode!r}"
    )


def _check_execute_mode(execute_mode) -> None:
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"execute_mode must be an Execute member ({[m.name for m in Execute]}), got {execute_mode!r}")


def _materialize_futures(*args, **kwargs):
    args = tuple(a.get() if isinstance(a, DataProtoFuture) else a for a in args)
    kwargs = {k: (v.get() if isinstance(v, DataProtoFuture) else v) for k, v in kwargs.items()}
    return args, kwargs


def register(
    dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.ALL, blocking: bool = True, materialize_futures: bool = True
):
    """Mark a `Worker` method as callable through its worker group.

    Args:
        dispatch_mode: a `Dispatch` member, or ``{"dispatch_fn": f, "collect_fn": g}``
            (e.g. `make_nd_compute_dataproto_dispatch_fn("actor")`).
        execute_mode: `Execute.ALL` or `Execute.RANK_ZERO`. ``Dispatch.RANK_ZERO`` always runs on
            rank 0 only.
        blocking: the driver waits for the result (True) or gets object refs / a DataProtoFuture.
        materialize_futures: resolve DataProtoFuture arguments inside the worker before the call.
    """
    _check_dispatch_mode(dispatch_mode)
    _check_execute_mode(execute_mode)
    if dispatch_mode is Dispatch.RANK_ZERO:
        execute_mode = Execute.RANK_ZERO

    def decorator(func):
        if inspect.iscoroutinefunction(func):

            @wraps(func)
            async def wrapper(*args, **kwargs):
                if materialize_futures:
                    args, kwargs = _materialize_futures(*args, **kwargs)
                return await func(*args, **kwargs)

        else:

            @wraps(func)
            def wrapper(*args, **kwargs):
                if materialize_futures:
                    args, kwargs = _materialize_futures(*args, **kwargs)
                return func(*args, **kwargs)

        setattr(
            wrapper,
            MAGIC_ATTR,
            {
                "dispatch_mode": dispatch_mode,
                "execute_mode": execute_mode,
                "blocking": blocking,
                "materialize_futures": materialize_futures,
            },
        )
        return wrapper

    return decorator
