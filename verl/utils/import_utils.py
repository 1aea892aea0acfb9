"""Importing user code by name: module paths or `.py` files.

A user extends verl without forking it by writing a file that registers things (a policy loss, an
advantage estimator, a reward manager...) and naming that file in the config
(`actor_rollout_ref.model.external_lib`, `trainer.external_modules`) or in the environment variable
`VERL_USE_EXTERNAL_MODULES` (comma separated). Every process that may need the registration (the
driver and each worker) calls `import_external_libs` with the same list.

A file is imported once per process: importing the same path again returns the module already
loaded, so a decorator such as `@register_policy_loss("mine")` does not run twice.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import Any

__all__ = [
    "import_external_libs",
    "import_external_libs_from_env",
    "load_extern_type",
    "is_vllm_available",
    "EXTERNAL_MODULES_ENV",
]

EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"


def _as_list(name_or_path_list: str | Iterable[str] | None) -> list[str]:
    if name_or_path_list is None:
        return []
    if isinstance(name_or_path_list, str):
        # a single string may hold several comma-separated entries (environment-variable style)
        return [part.strip() for part in name_or_path_list.split(",") if part.strip()]
    out = []
    for item in name_or_path_list:
        if item is None:
            continue
        if not isinstance(item, str):
            raise TypeError(f"external module entry {item!r} must be a string (module path or .py file)")
        out.extend(_as_list(item))
    return out


def _looks_like_file(entry: str) -> bool:
    return entry.endswith(".py") or os.sep in entry or (os.altsep is not None and os.altsep in entry)


def _import_file(path: str) -> ModuleType:
    abs_path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(abs_path):
        raise FileNotFoundError(f"external module file {path!r} does not exist (resolved to {abs_path})")
    stem = os.path.splitext(os.path.basename(abs_path))[0]
    # a stable, unique module name per absolute path: the same file imported twice is one module
    digest = hashlib.sha1(abs_path.encode()).hexdigest()[:10]
    module_name = f"verl_external_{stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, abs_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot build an import spec for external module file {abs_path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        # leave no half-initialised module behind: a retry must execute the file again
        sys.modules.pop(module_name, None)
        raise
    return module


def import_external_libs(name_or_path_list: str | Iterable[str] | None = None) -> list[ModuleType]:
    """Import every entry of `name_or_path_list` and return the modules, in order.

    Args:
        name_or_path_list: None (nothing to do), one string, or a list of strings. Each entry is a
            dotted module path (`my_pkg.my_losses`) or a path to a `.py` file
            (`/home/me/my_losses.py`); a string may also hold several comma-separated entries.
    Raises:
        FileNotFoundError / ImportError with the entry named when an entry cannot be imported.
    """
    modules = []
    for entry in _as_list(name_or_path_list):
        if _looks_like_file(entry):
            modules.append(_import_file(entry))
            continue
        try:
            modules.append(importlib.import_module(entry))
        except ImportError as exc:
            raise ImportError(
                f"external module {entry!r} cannot be imported ({exc}); give a module path importable "
                "from this process or the path of a .py file"
            ) from exc
    return modules


def import_external_libs_from_env() -> list[ModuleType]:
    """Import the entries of the environment variable `VERL_USE_EXTERNAL_MODULES` (comma separated)."""
    return import_external_libs(os.environ.get(EXTERNAL_MODULES_ENV, ""))


def load_extern_type(file_path: str | None, type_name: str | None) -> Any:
    """Return attribute `type_name` of the module or `.py` file `file_path` (None when no path).

    Used for user-provided classes and functions named in the config (custom dataset class,
    custom reward function...).
    """
    if not file_path:
        return None
    (module,) = import_external_libs([file_path])
    if not type_name or not hasattr(module, type_name):
        available = sorted(n for n in dir(module) if not n.startswith("_"))
        raise AttributeError(f"{file_path!r} defines no {type_name!r}; it defines {available}")
    return getattr(module, type_name)


def is_vllm_available() -> bool:
    """True when the optional `vllm` package can be imported (it is never imported here)."""
    return importlib.util.find_spec("vllm") is not None
