"""`BaseConfig`: the base of every config dataclass.

Config groups are plain dataclasses (readable, typed, validated in `__post_init__`). They also
behave like read-only mappings (`cfg["key"]`, `cfg.get("key", default)`, `"key" in cfg`) so that
code written for upstream verl's dict-style access, and our own functions that accept either a
dataclass or a plain dict, work unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any


@dataclasses.dataclass
class BaseConfig(Mapping):
    """Dataclass + read-only Mapping view over its fields."""

    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str) or key not in self._field_names():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._field_names())

    def __len__(self) -> int:
        return len(self._field_names())

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default) if key in self._field_names() else default

    def to_dict(self) -> dict[str, Any]:
        """Nested plain-dict copy (for logging and checkpoints)."""
        return dataclasses.asdict(self)

    @classmethod
    def _field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    # dataclass(eq=True) sets __hash__ to None; Mapping's __eq__ would compare as dicts. Keep
    # dataclass equality (same type, same fields) which is what tests and users expect.
    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self._field_names())

    __hash__ = None  # mutable


def check_choice(owner: str, key: str, value: Any, allowed) -> None:
    """Raise ValueError naming `owner.key`, the value and the accepted values."""
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{owner}.{key}={value!r} is not allowed; expected one of {allowed}")


def check_range(owner: str, key: str, value: Any, *, low=None, high=None, low_open=False, allow_none=False) -> None:
    """Raise ValueError naming `owner.key` when `value` is outside [low, high] (or (low, high])."""
    if value is None and allow_none:
        return
    if value is None:
        raise ValueError(f"{owner}.{key} must be set (got null)")
    bad_low = low is not None and (value <= low if low_open else value < low)
    bad_high = high is not None and value > high
    if bad_low or bad_high:
        lo = "(" if low_open else "["
        raise ValueError(f"{owner}.{key}={value!r} is out of range; expected a value in {lo}{low}, {high}]")
