"""Conversion of OmegaConf / dict config sections into the project's config dataclasses.

`omega_conf_to_dataclass(config, dataclass_type=None)` (upstream name and semantics):

- an empty section gives `dataclass_type()` (or None when no type is given); a section that is
  already an object (a dataclass instance, ...) is returned as is;
- without `dataclass_type` the section's `_target_` names what to build: a dataclass is converted
  as below, anything else is built by Hydra's `instantiate` (nested `_target_`s included);
- with `dataclass_type` that type is built, or the subclass of it that the section's `_target_`
  names (upstream's `_target_: verl.workers.config.FSDPOptimizerConfig` under an `optim` field
  typed `OptimizerConfig`); any other `_target_` is ignored, as upstream; nested dataclass fields
  are converted recursively.

On top of upstream, every value is checked against its field's annotation *before* the
dataclass (and its range checks) is built, so a wrong type fails with the dotted key, the value
and the type expected (`ConfigTypeError`), and a key that is not a field fails with the closest
field names. Booleans must be true/false (never strings such as "maybe"); an integer field never
takes a float (1.5 would be truncated); a number is accepted where a float or a string is
expected; a lone string is accepted where a list of strings is expected (it becomes a one-item list).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import types
import typing
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

__all__ = ["ConfigTypeError", "check_value_type", "closest_keys", "describe_type", "omega_conf_to_dataclass"]


class ConfigTypeError(TypeError, ValueError):
    """A config value whose type does not match the annotation of its dataclass field (a
    TypeError, and a ValueError so that callers catching config errors as ValueError see it)."""


def _to_container(config: Any) -> Any:
    if isinstance(config, (DictConfig, ListConfig)):
        return OmegaConf.to_container(config, resolve=True)
    return config


def _locate(path: str) -> Any:
    module_name, _, attr = str(path).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"_target_={path!r} cannot be imported: {exc}") from exc


def closest_keys(key: str, candidates, n: int = 3) -> list[str]:
    """Up to `n` of `candidates` closest to `key` (difflib ratio >= 0.6), best first."""
    return difflib.get_close_matches(key, list(candidates), n=n, cutoff=0.6)


# --------------------------------------------------------------------------- type checking
def _origin(tp: Any) -> Any:
    return typing.get_origin(tp)


def _is_union(tp: Any) -> bool:
    return _origin(tp) in (typing.Union, types.UnionType)


def describe_type(tp: Any) -> str:
    """A reader's description of an annotation: `int | None` -> 'an integer or null'."""
    if tp is Any or tp is object:
        return "any value"
    if tp is type(None):
        return "null"
    if _is_union(tp):
        return " or ".join(dict.fromkeys(describe_type(a) for a in typing.get_args(tp)))
    if tp is bool:
        return "a boolean (true or false)"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    origin = _origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        return f"one of {list(args)}"
    if tp is list or origin is list:
        return f"a list of {_plural(args[0])}" if args else "a list"
    if tp is tuple or origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_plural(args[0])}"
        if args:
            return f"a list of {len(args)} values ({', '.join(describe_type(a) for a in args)})"
        return "a list"
    if tp is dict or origin is dict:
        return "a mapping {key: value}"
    if dataclasses.is_dataclass(tp):
        return f"a config section (a mapping of {tp.__name__} keys)"
    return getattr(tp, "__name__", str(tp))


def _plural(tp: Any) -> str:
    return {int: "integers", float: "numbers", str: "strings", bool: "booleans"}.get(tp, describe_type(tp))


def _what(value: Any) -> str:
    if value == "" and isinstance(value, str):
        return "an empty value"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number with a fraction" if isinstance(value, float) and not float(value).is_integer() else "a float",
        str: "a string",
        list: "a list",
        tuple: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)


class _Mismatch(Exception):
    pass


def _conform(value: Any, tp: Any, key: str) -> Any:
    """`value` checked against `tp` (and lightly normalised); raises _Mismatch."""
    if tp is Any or tp is object or isinstance(tp, (str, typing.TypeVar)) or tp is None:
        return value
    if tp is type(None):
        if value is None:
            return None
        raise _Mismatch
    if _is_union(tp):
        return _conform_union(value, tp, key)
    if value is None:
        raise _Mismatch
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # `trainer.experiment_name=2024` is parsed as a number
        raise _Mismatch
    origin = _origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        if value in args:
            return value
        raise _Mismatch
    if tp in (list, tuple) or origin in (list, tuple):
        return _conform_sequence(value, tp is list or origin is list, args, key)
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise _Mismatch
        if len(args) == 2:
            return {k: _conform_item(v, args[1], f"{key}.{k}") for k, v in value.items()}
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, dict):
            return omega_conf_to_dataclass(value, tp, _path=key)
        raise _Mismatch
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _Mismatch
    return value  # an annotation this checker does not model (Callable, ...): left to the dataclass


def _conform_union(value: Any, tp: Any, key: str) -> Any:
    args = typing.get_args(tp)
    if value is None:
        if type(None) in args:
            return None
        raise _Mismatch
    options = [a for a in args if a is not type(None)]
    if len(options) == 1:  # `X | None`: the error about X (e.g. inside a section) is the useful one
        return _conform(value, options[0], key)
    for arg in options:
        try:
            return _conform(value, arg, key)
        except (_Mismatch, ConfigTypeError):
            continue
    raise _Mismatch


def _conform_sequence(value: Any, is_list: bool, args: tuple, key: str) -> Any:
    """`value` as a ``list[args[0]]`` (`is_list`) or a ``tuple[args]``; raises _Mismatch."""
    if is_list and isinstance(value, str) and args and args[0] is str:
        return [value]  # `trainer.logger=console`
    if not isinstance(value, (list, tuple)):
        raise _Mismatch
    if is_list:
        return [_conform_item(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if not args:
        return value
    if len(args) == 2 and args[1] is Ellipsis:
        return type(value)(_conform_item(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
        raise _Mismatch
    return type(value)(_conform_item(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=False)))


def _conform_item(value: Any, tp: Any, key: str) -> Any:
    try:
        return _conform(value, tp, key)
    except _Mismatch:
        raise ConfigTypeError(_type_message(key, value, tp)) from None


def _type_message(key: str, value: Any, tp: Any) -> str:
    msg = f"{key}={value!r}: expected {describe_type(tp)}, got {_what(value)}"
    if isinstance(value, str) and _bare(tp) is bool:
        if value.strip().lower() in ("true", "false"):
            msg += " (write true or false without quotes)"
        else:
            msg += " (write true or false)"
    elif isinstance(value, str) and _bare(tp) in (int, float) and _is_number(value):
        # e.g. `${oc.env:MAX_LEN}` resolves to text; the rest of the run would read it as text too
        msg += (
            f" (the text {value!r} is not converted: write the number without quotes, or decode an environment "
            "variable with ${oc.decode:${oc.env:NAME}})"
        )
    elif isinstance(value, float) and _bare(tp) is int:
        if value.is_integer():
            msg += f" (write {int(value)}: an integer field takes no float)"
        else:
            msg += " (an integer field never takes a float: it would be truncated)"
    return msg


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _bare(tp: Any) -> Any:
    """`X` for `X | None`, else `tp`."""
    if _is_union(tp):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass type inside an annotation such as `Foo`, `Optional[Foo]` or `Foo | None`."""
    if dataclasses.is_dataclass(tp):
        return tp
    return next((arg for arg in typing.get_args(tp) if dataclasses.is_dataclass(arg)), None)


def check_value_type(value: Any, annotation: Any, key: str) -> Any:
    """`value` if it fits `annotation` (with the light normalisations of the module docstring),
    else ConfigTypeError naming `key`, the value and the expected type."""
    return _conform_item(value, annotation, key)


# --------------------------------------------------------------------------- conversion
def _qualify(exc: Exception, path: str) -> Exception | None:
    """Our __post_init__ checks name their section by a short owner (`optim.lr=...`); give the
    message the full dotted path of the section being built, so the user sees the exact key."""
    if not path or type(exc) not in (ValueError, TypeError):
        return None
    msg = str(exc)
    if msg.startswith((path + ".", path + " ", path + ":")):
        return None
    parts = path.split(".")
    for i in range(1, len(parts)):
        suffix = ".".join(parts[i:])
        if msg.startswith((suffix + ".", suffix + "=")):
            return type(exc)(path + msg[len(suffix) :])
    if path in msg:
        return None
    return type(exc)(f"{path}: {msg}")


def omega_conf_to_dataclass(config: Any, dataclass_type: type | None = None, _path: str = "") -> Any:
    """Build the dataclass described by `config` (DictConfig, dict, or an object already).

    See the module docstring for the rules. `_path` is the dotted key of the section (for
    messages). Unknown keys raise ValueError naming the full key, the closest fields and all
    accepted keys; mistyped values raise ConfigTypeError.
    """
    if config is None or (isinstance(config, (DictConfig, ListConfig, dict, list)) and len(config) == 0):
        return None if dataclass_type is None else dataclass_type()
    if not isinstance(config, (DictConfig, ListConfig, dict, list)):
        return config
    data = _to_container(config)
    if not isinstance(data, dict):
        raise ConfigTypeError(f"config section {_path or '<root>'} must be a mapping, got {_what(data)}: {data!r}")
    data = dict(data)
    target = data.pop("_target_", None)
    if dataclass_type is None:
        if target is None:
            raise ValueError(
                f"config section {_path or '<root>'} has no _target_ and no dataclass_type was given; "
                "give one of them (e.g. _target_: verl.workers.config.ActorConfig)"
            )
        located = _locate(target)
        if not dataclasses.is_dataclass(located):
            from hydra.utils import instantiate

            return instantiate(
                config if isinstance(config, DictConfig) else OmegaConf.create(config), _convert_="partial"
            )
        dataclass_type = located
    elif target is not None:
        try:
            located = _locate(target)
        except ValueError:
            located = None  # a _target_ of a class this project does not have: ignored, as before
        if isinstance(located, type) and dataclasses.is_dataclass(located) and issubclass(located, dataclass_type):
            dataclass_type = located
    if not dataclasses.is_dataclass(dataclass_type):
        raise TypeError(f"{dataclass_type!r} is not a dataclass")

    hints = typing.get_type_hints(dataclass_type)
    fields = {f.name: f for f in dataclasses.fields(dataclass_type) if f.init}
    where = f"{_path}." if _path else ""
    unknown = sorted(set(data) - set(fields))
    if unknown:
        hints_txt = []
        for k in unknown:
            close = closest_keys(k, fields)
            if close:
                hints_txt.append(f"{where}{k}: did you mean {' or '.join(where + c for c in close)}?")
        raise ValueError(
            f"unknown config key(s) {[where + k for k in unknown]} for {dataclass_type.__name__}"
            + (f" ({'; '.join(hints_txt)})" if hints_txt else "")
            + f"; accepted keys: {sorted(fields)}"
        )
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = check_value_type(value, hints.get(name, Any), where + name)
    try:
        return dataclass_type(**kwargs)
    except (ValueError, TypeError) as exc:
        better = _qualify(exc, _path)
        if better is None:
            raise
        raise better from exc


def update_dict_with_config(dictionary: dict, config: Any) -> None:
    """Overwrite, in place, each key of `dictionary` that `config` (a DictConfig, a dataclass or
    any object with attributes) also has; keys the config lacks keep their value."""
    for key in dictionary:
        if hasattr(config, key):
            dictionary[key] = getattr(config, key)
