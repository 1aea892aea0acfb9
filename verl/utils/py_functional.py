"""Small pure-Python helpers (no torch, no ray)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

__all__ = ["DynamicEnum", "append_to_dict", "config_get", "env_override", "union_two_dict"]


@contextmanager
def env_override(env: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, then restore them (a variable
    that was unset is removed again)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def config_get(config: Any, key: str, default: Any = None) -> Any:
    """Read `key` from a config that is a dataclass (`BaseConfig`), a dict, a DictConfig or any
    object with attributes. A missing key, a `None` value or a `None` config give `default`."""
    if config is None:
        return default
    if isinstance(config, Mapping):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


class _DynamicEnumMeta(type):
    def __iter__(cls):
        return iter(cls._registry.values())

    def __contains__(cls, item) -> bool:
        if isinstance(item, str):
            return item in cls._registry
        return item in cls._registry.values()

    def __getitem__(cls, name: str):
        return cls._registry[name]

    def __getattr__(cls, name: str):
        # only reached when normal lookup fails: members registered at run time
        registry = cls.__dict__.get("_registry")
        if registry is not None and name in registry:
            return registry[name]
        raise AttributeError(f"{cls.__name__} has no member {name!r}")

    def __len__(cls) -> int:
        return len(cls._registry)


class DynamicEnum(metaclass=_DynamicEnumMeta):
    """An enum whose members can be added at run time (``MyEnum.register("NEW")``).

    Each subclass must define its own ``_registry = {}`` and ``_next_value = 0``. Members compare
    by identity, hash by name, and pickle as a reference to the member of the same name, so a
    member sent to another process is the member there.
    """

    _registry: dict[str, DynamicEnum] = {}
    _next_value: int = 0

    def __init__(self, name: str, value: int):
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value}>"

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.name))

    def __reduce__(self):
        return (getattr, (type(self), self.name))

    @classmethod
    def register(cls, name: str) -> DynamicEnum:
        """Add a member named `name`; ValueError if it exists already."""
        if name in cls._registry:
            raise ValueError(f"{cls.__name__}.{name} is already registered")
        member = cls(name, cls._next_value)
        cls._registry[name] = member
        cls._next_value += 1
        return member

    @classmethod
    def remove(cls, name: str) -> DynamicEnum:
        """Remove and return the member named `name` (KeyError if absent)."""
        return cls._registry.pop(name)

    @classmethod
    def from_name(cls, name: str) -> DynamicEnum | None:
        """The member named `name`, or None."""
        return cls._registry.get(name)


def union_two_dict(dict1: dict, dict2: dict) -> dict:
    """Add `dict2` into `dict1` (in place); a shared key must have equal values (ValueError naming it)."""
    for key, val in dict2.items():
        if key in dict1 and dict1[key] != val:
            raise ValueError(f"key {key!r} has different values in the two dicts: {dict1[key]!r} vs {val!r}")
        dict1[key] = val
    return dict1


def append_to_dict(data: dict, new_data: dict[str, Any], prefix: str = "") -> None:
    """Collect the values of `new_data` under their keys in `data` (in place), as upstream's.

    A missing key starts an empty list, or an empty `Metric` of the same aggregation when the
    value is a `verl.utils.metric.Metric` (so per-micro-batch Metrics reduce by their own rule);
    a list value is added element by element, anything else appended. `prefix` is put before
    every key that does not already start with it.
    """
    from verl.utils.metric import Metric

    for key, val in new_data.items():
        name = key if key.startswith(prefix) else f"{prefix}{key}"
        if name not in data:
            data[name] = val.init_list() if isinstance(val, Metric) else []
        if isinstance(val, list):
            data[name].extend(val)
        else:
            data[name].append(val)
