"""Several roles in one worker process, independent of the backend that runs the process.

`colocated_worker_class` builds a `Worker` subclass ("WorkerDict") holding one object per role;
role ``key``'s registered method ``m`` becomes ``key_m`` on it, with the same registration, so a
worker group over that class dispatches to every role. `WorkerGroup.spawn(prefix_set)` then gives
one group per role with the original method names. The Ray backend wraps the class in an actor
(`create_colocated_worker_cls`); the in-process backend instantiates it directly.
"""

from __future__ import annotations

import inspect
from typing import Any

from verl.single_controller.base.decorator import MAGIC_ATTR
from verl.single_controller.base.worker import Worker

__all__ = ["colocated_worker_class", "unwrap_worker_class"]


def unwrap_worker_class(cls) -> type:
    """The user's class behind ``ray.remote(cls)``, or `cls` itself for a plain class (read without
    importing Ray: a Ray actor class keeps the original under ``__ray_actor_class__``)."""
    return getattr(cls, "__ray_actor_class__", cls)


def _role_method(role: str, name: str, method):
    """A WorkerDict method forwarding to ``self.worker_dict[role].name`` with the same registration."""
    if inspect.iscoroutinefunction(method):

        async def forward(self, *args, **kwargs):
            return await getattr(self.worker_dict[role], name)(*args, **kwargs)

    else:

        def forward(self, *args, **kwargs):
            return getattr(self.worker_dict[role], name)(*args, **kwargs)

    forward.__name__ = f"{role}_{name}"
    forward.__qualname__ = f"WorkerDict.{role}_{name}"
    setattr(forward, MAGIC_ATTR, getattr(method, MAGIC_ATTR))
    return forward


def colocated_worker_class(roles: dict[str, tuple[type, tuple, dict[str, Any]]], module: str = __name__) -> type:
    """A `Worker` subclass whose constructor builds ``cls(*args, **kwargs)`` for every
    ``role -> (cls, args, kwargs)`` of `roles` (in that order) and whose registered methods are
    the roles' methods prefixed with ``<role>_``.

    Raises ValueError when `roles` is empty or two roles produce the same prefixed name."""
    if not roles:
        raise ValueError("colocation needs at least one role")
    role_classes = {role: unwrap_worker_class(cls) for role, (cls, _, _) in roles.items()}
    role_init = {role: (args, kwargs) for role, (_, args, kwargs) in roles.items()}

    def __init__(self):
        Worker.__init__(self)
        self.worker_dict = {}
        for role, user_cls in role_classes.items():
            args, kwargs = role_init[role]
            self.worker_dict[role] = user_cls(*args, **kwargs)

    namespace: dict[str, Any] = {
        "__init__": __init__,
        "__module__": module,
        "__doc__": f"Colocated roles {sorted(role_classes)} in one process.",
    }
    for role, user_cls in role_classes.items():
        for name in dir(user_cls):
            try:
                method = getattr(user_cls, name)
            except AttributeError:
                continue
            if callable(method) and hasattr(method, MAGIC_ATTR):
                combined_name = f"{role}_{name}"
                if combined_name in namespace:
                    raise ValueError(
                        f"colocated method name {combined_name!r} is produced by two roles; rename a role or a method"
                    )
                namespace[combined_name] = _role_method(role, name, method)
    return type("WorkerDict", (Worker,), namespace)
