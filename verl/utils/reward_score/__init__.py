"""Rule-based reward functions, chosen by the row's ``data_source``.

``default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)`` is what
the reward managers call when no ``custom_reward_function`` is configured. Each scorer lives in its own
module (``gsm8k``, ``math``, ``verl_toy``) with a ``compute_score`` function.
"""

from __future__ import annotations

GSM8K_SOURCES = ("openai/gsm8k",)
MATH_SOURCES = (
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
    "lighteval/MATH-Hard",
    "math",
)
TOY_PREFIX = "verl_toy/"


def known_data_sources() -> list[str]:
    """Data sources ``default_compute_score`` can score (toy tasks listed with their prefix)."""
    from verl.utils.reward_score.verl_toy import KNOWN_TASKS

    return [*GSM8K_SOURCES, *MATH_SOURCES, *(TOY_PREFIX + t for t in KNOWN_TASKS)]


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float | dict:
    """Score one decoded response. Returns a float (1.0 right, 0.0 wrong for the built-in scorers).

    Extra keyword arguments (upstream passes e.g. ``sandbox_fusion_url``) are accepted and ignored by
    the rule-based scorers here. Raises NotImplementedError for an unknown ``data_source``, naming it
    and the known ones; use ``custom_reward_function.path`` for other data.
    """
    if data_source in GSM8K_SOURCES:
        from verl.utils.reward_score import gsm8k

        return gsm8k.compute_score(solution_str, ground_truth)
    if data_source in MATH_SOURCES:
        from verl.utils.reward_score import math

        return math.compute_score(solution_str, ground_truth)
    if isinstance(data_source, str) and data_source.startswith(TOY_PREFIX):
        from verl.utils.reward_score import verl_toy

        return verl_toy.compute_score(solution_str, ground_truth, task=data_source[len(TOY_PREFIX):])
    raise NotImplementedError(
        f"no reward function for data_source={data_source!r}; known data sources: {', '.join(known_data_sources())}. "
        "Set custom_reward_function.path / .name to score other data."
    )


# upstream name used by older code
_default_compute_score = default_compute_score

__all__ = ["default_compute_score", "known_data_sources"]
