"""Registry of reward managers: `reward_model.reward_manager=<name>` selects one.

A user class can be registered from any module imported through `trainer.external_modules`
(`@register("mine")`), or named directly as `path/to/file.py:ClassName` or
`package.module:ClassName` (see `get_reward_manager_cls`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, Callable

REWARD_MANAGER_REGISTRY: dict[str, type] = {}
# .py files loaded by `load_module`, in order; process pools re-load them in their children so
# that functions defined there unpickle by reference
LOADED_USER_FILES: list[str] = []


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make a reward manager selectable by `name`.

    Registering a different class under a name that is taken raises, so two modules cannot
    silently shadow each other; re-registering the same class (module reloaded) is allowed.
    """

    def decorator(cls: type) -> type:
        existing = REWARD_MANAGER_REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise ValueError(f"reward manager {name!r} is already registered to {existing.__module__}.{existing.__qualname__}")
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
        f"reward_model.reward_manager={name!r} is not a registered reward manager; registered: "
        f"{sorted(REWARD_MANAGER_REGISTRY)} (or give 'path/to/file.py:ClassName')"
    )


def load_module(path_or_name: str, what: str):
    """Import a module given as a .py file path or a dotted module path.

    A file is registered in `sys.modules` under a name derived from its absolute path, so the
    objects it defines pickle by reference (needed by process pools) and importing it twice
    returns the same module (registries are not filled twice).
    """
    if path_or_name.endswith(".py") or os.sep in path_or_name:
        path = os.path.abspath(os.path.expanduser(path_or_name))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{what}: file {path_or_name!r} does not exist")
        mod_name = "verl_user_" + "".join(c if c.isalnum() else "_" for c in path)
        if mod_name in sys.modules:
            return sys.modules[mod_name]
        spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[mod_name]
            raise
        LOADED_USER_FILES.append(path)
        return module
    try:
        return importlib.import_module(path_or_name)
    except ImportError as exc:
        raise ImportError(f"{what}: cannot import module {path_or_name!r}: {exc}") from exc


def load_object(spec: str, what: str, name: str | None = None) -> Any:
    """Load `file.py:attr` / `pkg.module:attr` (or `spec` + separate `name`)."""
    if name is None:
        spec, sep, name = spec.rpartition(":")
        if not sep or not spec or not name:
            raise ValueError(f"{what}={spec!r} must look like 'path/to/file.py:Name' or 'package.module:Name'")
    module = load_module(spec, what)
    if not hasattr(module, name):
        public = sorted(k for k in vars(module) if not k.startswith("_"))
        raise AttributeError(f"{what}: {spec!r} defines no {name!r}; it defines {public}")
    return getattr(module, name)
