"""Conversion of OmegaConf / dict config sections into the project's config dataclasses."""

from __future__ import annotations

import dataclasses
import importlib
import typing
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


def _to_container(config: Any) -> Any:
    if isinstance(config, (DictConfig, ListConfig)):
        return OmegaConf.to_container(config, resolve=True)
    return config


def _locate(path: str) -> type:
    module_name, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"_target_={path!r} cannot be imported: {exc}") from exc


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass type inside an annotation such as `Foo`, `Optional[Foo]` or `Foo | None`."""
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def omega_conf_to_dataclass(config: Any, dataclass_type: type | None = None, _path: str = "") -> Any:
    """Build the dataclass described by `config` (DictConfig, dict or an instance already).

    The type is `dataclass_type` when given, else the `_target_` entry of the section (as in
    upstream verl). Nested dataclass fields are converted recursively. A key that is not a field
    raises ValueError naming the full key and the accepted keys: a typo never passes silently.
    """
    if dataclass_type is not None and isinstance(config, dataclass_type):
        return config
    data = _to_container(config)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TypeError(f"config section {_path or '<root>'} must be a mapping, got {type(data).__name__}")
    data = dict(data)
    target = data.pop("_target_", None)
    if dataclass_type is None:
        if target is None:
            raise ValueError(f"config section {_path or '<root>'} has no _target_ and no dataclass_type was given")
        dataclass_type = _locate(target)
    if not dataclasses.is_dataclass(dataclass_type):
        raise TypeError(f"{dataclass_type!r} is not a dataclass")

    hints = typing.get_type_hints(dataclass_type)
    fields = {f.name: f for f in dataclasses.fields(dataclass_type) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{_path}." if _path else ""
        raise ValueError(
            f"unknown config key(s) {[where + k for k in unknown]} for {dataclass_type.__name__}; "
            f"accepted keys: {sorted(fields)}"
        )
    kwargs = {}
    for name, value in data.items():
        sub_type = _dataclass_in(hints.get(name))
        key_path = f"{_path}.{name}" if _path else name
        if sub_type is not None and isinstance(value, dict):
            value = omega_conf_to_dataclass(value, sub_type, key_path)
        kwargs[name] = value
    return dataclass_type(**kwargs)
