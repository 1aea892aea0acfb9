"""`BaseConfig`: the base of every config dataclass.

Config groups are plain dataclasses (readable, typed, validated in `__post_init__`). As in
upstream verl they also behave like read-only mappings and are frozen once built:

- `cfg["name"]` reads a field or any attribute set on the instance (`ConfigKeyError` when there is
  none: an AttributeError as upstream raises, and a KeyError as `Mapping` code expects; TypeError
  for a key that is not a string; an AttributeError raised by a property propagates);
  `cfg.get("name", default)`; `"name" in cfg`; iteration and `len()` cover the fields;
- a field cannot be reassigned after construction unless the class lists it in `_mutable_fields`
  (`FrozenInstanceError`); new attributes can still be attached. Build a changed copy with
  `dataclasses.replace(cfg, name=value)`, which validates again.

Divergence from upstream, on purpose: `__post_init__` may normalise its own fields (e.g. a lone
string into a list); the freeze starts when the constructor returns. Upstream freezes a field from
its first assignment, so its `__post_init__` hooks cannot normalise. `_target_` is not a field
here: `omega_conf_to_dataclass` reads it from the section and drops it.
"""

from __future__ import annotations

import dataclasses
from abc import ABCMeta
from collections.abc import Iterator, Mapping
from typing import Any

_BUILT = "_verl_config_built"  # instance flag: set when the constructor (and __post_init__) returned


class _FreezeAfterInit(ABCMeta):
    """Marks an instance as built once its class's constructor has returned, so `__post_init__`
    may still normalise fields and every later assignment is checked (`BaseConfig.__setattr__`).
    Copies (`copy`, `pickle`, Ray) carry the flag in `__dict__`; `dataclasses.replace` constructs."""

    def __call__(cls, *args, **kwargs):
        obj = super().__call__(*args, **kwargs)
        object.__setattr__(obj, _BUILT, True)
        return obj


class ConfigKeyError(KeyError, AttributeError):
    """`cfg[key]` for a key the config does not have: upstream raises AttributeError there, while
    `Mapping` methods (`in`, `get`) and dict-minded callers expect KeyError; this is both."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _defines(obj: Any, key: str) -> bool:
    return key in obj.__dict__ or any(key in klass.__dict__ for klass in type(obj).__mro__)


@dataclasses.dataclass
class BaseConfig(Mapping, metaclass=_FreezeAfterInit):
    """Dataclass + read-only Mapping view, frozen after construction except `_mutable_fields`."""

    _mutable_fields = frozenset()  # class attribute (not a field): names that may be reassigned

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get(_BUILT) and name in self.__dict__ and name not in type(self)._mutable_fields:
            raise dataclasses.FrozenInstanceError(
                f"Field '{name}' is frozen and cannot be modified ({type(self).__name__} is read-only once built; "
                f"use dataclasses.replace(cfg, {name}=...) for a changed copy)"
            )
        super().__setattr__(name, value)

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)  # TypeError for a non-string key, as getattr
        except AttributeError as exc:
            if _defines(self, key):  # a property that raised: its error is the useful one
                raise
            raise ConfigKeyError(f"{type(self).__name__} has no key {key!r}") from exc

    def __iter__(self) -> Iterator[str]:
        return iter(self._field_names())

    def __len__(self) -> int:
        return len(self._field_names())

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            return default

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

    __hash__ = None  # equality is by value


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
