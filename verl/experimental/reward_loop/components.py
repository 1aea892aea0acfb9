"""Several rewards: scoring functions combined by weights (`reward.components`).

Each component is a scoring function of its own (`fn(data_source, solution_str, ground_truth,
extra_info=None, **reward_kwargs) -> float | dict`, sync or `async def`), given as

    reward:
      components:
        - {name: correct, path: my_rewards.py, function: correctness, weight: 1.0}
        - {name: brevity, path: my_rewards.py, function: brevity, weight: 0.1, reward_kwargs: {limit: 8}}

(`path: null` is the shipped `default_compute_score`; `function` defaults to `compute_score`,
`weight` to 1.0). A sample's score is `sum_i weight_i * component_i`, and each component's value is
a column of the extra info named after it, logged by the trainer as `reward/<name>/mean` (and in
validation as `val-aux/<data_source>/<name>/...`). This is TRL's `reward_funcs` + `reward_weights`
idea; GDPO (`algorithm.adv_estimator=gdpo`) can normalise each component within its group instead
of their sum: set `algorithm.gdpo_reward_keys` to the component names.

The components of a sample run concurrently; a component that raises or returns something that
is not a finite number makes the sample a counted scoring error (its message names the component).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
import re
from dataclasses import dataclass
from typing import Any

COMPONENT_KEYS = ("name", "path", "function", "weight", "reward_kwargs")


@dataclass
class Component:
    name: str
    fn: Any
    weight: float


class WeightedComponents:
    """An async scoring function: `{"score": weighted sum, <name>: value, ...}` per sample."""

    def __init__(self, components: list[Component]):
        self.components = components
        self.names = [c.name for c in components]
        self.__qualname__ = "WeightedComponents(" + ", ".join(self.names) + ")"

    async def __call__(self, **kwargs) -> dict:
        values = await asyncio.gather(*(_call(c.fn, kwargs) for c in self.components))
        out: dict[str, Any] = {}
        total = 0.0
        for comp, value in zip(self.components, values, strict=True):
            number = value.get("score") if isinstance(value, dict) else value
            if isinstance(number, bool) or not isinstance(number, numbers.Real) or not math.isfinite(float(number)):
                raise ValueError(f"reward component {comp.name!r} returned {number!r:.200}, not a finite number")
            out[comp.name] = float(number)
            total += comp.weight * float(number)
        out["score"] = total
        return out


async def _call(fn, kwargs: dict) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(**kwargs)
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, **kwargs))


def load_components(specs: Any) -> WeightedComponents | None:
    """The `reward.components` list as one scoring function (None for an empty list); each spec
    is checked (keys, a unique identifier-like name, a number weight) naming the offending entry."""
    from verl.utils.import_utils import load_extern_type

    specs = list(specs or [])
    if not specs:
        return None
    components, seen = [], set()
    for i, spec in enumerate(specs):
        where = f"reward.components[{i}]"
        spec = dict(spec) if hasattr(spec, "items") else spec
        if not isinstance(spec, dict):
            raise TypeError(f"{where}={spec!r} must be a mapping with keys {list(COMPONENT_KEYS)}")
        unknown = sorted(set(spec) - set(COMPONENT_KEYS))
        if unknown:
            raise ValueError(f"{where} has unknown key(s) {unknown}; accepted: {list(COMPONENT_KEYS)}")
        name = spec.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][\w.-]*", name) or name in seen | {"score"}:
            raise ValueError(f"{where}.name={name!r} must be a unique name (letters, digits, _ . -), not 'score'")
        seen.add(name)
        weight = spec.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
            raise ValueError(f"{where}.weight={weight!r} must be a number")
        if spec.get("path"):
            fn = load_extern_type(spec["path"], spec.get("function") or "compute_score")
        else:
            from verl.utils.reward_score import default_compute_score as fn
        if spec.get("reward_kwargs"):
            fn = functools.partial(fn, **dict(spec["reward_kwargs"]))
        components.append(Component(name, fn, float(weight)))
    return WeightedComponents(components)
