"""Registry of reward managers: `reward_model.reward_manager=<name>` selects one.

A user class can be registered from any module imported through `trainer.external_modules`
(`@register("mine")`), or named directly as `path/to/file.py:ClassName` or
`package.module:ClassName` (see `get_reward_manager_cls`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from verl.utils.import_utils import load_extern_type

REWARD_MANAGER_REGISTRY: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make a reward manager selectable by `name`.

    Registering a different class under a name that is taken raises, so two modules cannot
    silently shadow each other; re-registering the same class (same module and name: a module
    reloaded) is allowed.
    """

    def decorator(cls: type) -> type:
        existing = REWARD_MANAGER_REGISTRY.get(name)
        if existing is not None and (existing.__module__, existing.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(
                f"reward manager {name!r} is already registered to {existing.__module__}.{existing.__qualname__}"
            )
        REWARD_MANAGER_REGISTRY[name] = cls
        return cls

    return decorator


def get_reward_manager_cls(name: str) -> type:
    """The class registered as `name`, or loaded from `file.py:Class` / `pkg.module:Class`."""
    if name in REWARD_MANAGER_REGISTRY:
        return REWARD_MANAGER_REGISTRY[name]
    if ":" in name:
        return load_object(name, what="reward_model.reward_manager")
    raise ValueError(
        f"Unknown reward manager: {name}. reward_model.reward_manager={name!r} is not a registered reward manager; "
        f"registered: {sorted(REWARD_MANAGER_REGISTRY)} (or give 'path/to/file.py:ClassName')"
    )


def loaded_user_files() -> list[str]:
    """The .py files imported through `verl.utils.import_utils` in this process (their modules
    are named `verl_external_*`); process pools re-import them so their functions unpickle."""
    return [
        m.__file__
        for name, m in list(sys.modules.items())
        if name.startswith("verl_external_") and getattr(m, "__file__", None)
    ]


def load_object(spec: str, what: str) -> Any:
    """Load `path/to/file.py:Name` or `package.module:Name`."""
    module_path, sep, name = spec.rpartition(":")
    if not sep or not module_path or not name:
        raise ValueError(f"{what}={spec!r} must look like 'path/to/file.py:Name' or 'package.module:Name'")
    try:
        return load_extern_type(module_path, name)
    except (ImportError, FileNotFoundError, AttributeError) as exc:
        raise type(exc)(f"{what}={spec!r}: {exc}") from exc
