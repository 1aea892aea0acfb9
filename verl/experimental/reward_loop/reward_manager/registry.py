"""Registry of the reward loop's managers: `reward.reward_manager.name=<name>` selects one.

Separate from the driver-side registry of `verl.workers.reward_manager` (whose managers score a
whole batch at once): a manager here scores one sample per call (`async run_single`).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["REWARD_MANAGER", "get_reward_manager_cls", "register"]

REWARD_MANAGER: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make a reward-loop manager selectable as `reward.reward_manager.name=name`.

    Registering another class under a taken name raises (two modules cannot silently shadow each
    other); registering the same class again (a module reloaded) is allowed.
    """

    def decorator(cls: type) -> type:
        existing = REWARD_MANAGER.get(name)
        if existing is not None and (existing.__module__, existing.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(
                f"reward manager {name!r} is already registered to {existing.__module__}.{existing.__qualname__}"
            )
        REWARD_MANAGER[name] = cls
        return cls

    return decorator


def get_reward_manager_cls(name: str) -> type:
    """The reward-loop manager class registered as `name`."""
    if name not in REWARD_MANAGER:
        raise ValueError(
            f"Unknown reward manager: {name}. reward.reward_manager.name={name!r} is not a registered reward-loop "
            f"manager; registered: {sorted(REWARD_MANAGER)}"
        )
    return REWARD_MANAGER[name]
