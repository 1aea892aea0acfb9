"""Rule-based reward functions, chosen by the row's ``data_source`` (upstream's routing).

``default_compute_score(data_source, solution_str, ground_truth, extra_info=None, ...)`` is what
the reward managers call when no ``custom_reward_function`` is configured (data_source -> module: result):

- ``openai/gsm8k`` -> ``gsm8k`` (``method="strict"``/``"flexible"``): 1.0 / 0.0
- ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500`` (and
  ``lighteval/MATH-Hard``) -> ``math`` (upstream: ``math_reward``): 1.0 / 0.0
- ``math_dapo``, ``math``, ``math_dapo_reasoning``, ``aime*`` -> ``math_dapo``: dict ``score`` 1.0 / -1.0,
  ``acc``, ``pred``
- ``numina_aops_forum``, ``numina_synthetic_math``, ``numina_amc_aime``, ``numina_synthetic_amc``,
  ``numina_cn_k12``, ``numina_olympiads`` -> ``prime_math``: 1.0 / 0.0
- ``codecontests``, ``apps``, ``codeforces``, ``taco`` -> ``sandbox_fusion`` (needs ``sandbox_fusion_url``):
  pass rate
- ``hiyouga/geometry3k`` -> ``geo3k``: 0.9 acc + 0.1 format
- ``searchR1_*`` (nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle) -> ``search_r1_like_qa_em``:
  exact match
- ``verl_toy/<task>`` (ours) -> ``verl_toy``: 1.0 / 0.0

A dict result is returned as is; a number or bool becomes a float; a tuple gives ``float(res[0])``.
"""

from __future__ import annotations

GSM8K_SOURCES = ("openai/gsm8k",)
MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "lighteval/MATH-Hard")
DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")
DAPO_PREFIX = "aime"
PRIME_MATH_SOURCES = (
    "numina_aops_forum",
    "numina_synthetic_math",
    "numina_amc_aime",
    "numina_synthetic_amc",
    "numina_cn_k12",
    "numina_olympiads",
)
CODE_SOURCES = ("codecontests", "apps", "codeforces", "taco")
GEO3K_SOURCES = ("hiyouga/geometry3k",)
SEARCH_R1_SOURCES = (
    "searchR1_nq",
    "searchR1_triviaqa",
    "searchR1_popqa",
    "searchR1_hotpotqa",
    "searchR1_2wikimultihopqa",
    "searchR1_musique",
    "searchR1_bamboogle",
)
TOY_PREFIX = "verl_toy/"


def known_data_sources() -> list[str]:
    """Data sources ``default_compute_score`` can score (``aime*`` and toy tasks by prefix)."""
    from verl.utils.reward_score.verl_toy import KNOWN_TASKS

    return [
        *GSM8K_SOURCES,
        *MATH_SOURCES,
        *DAPO_SOURCES,
        DAPO_PREFIX + "*",
        *PRIME_MATH_SOURCES,
        *CODE_SOURCES,
        *GEO3K_SOURCES,
        *SEARCH_R1_SOURCES,
        *(TOY_PREFIX + t for t in KNOWN_TASKS),
    ]


def _route(
    data_source,
    solution_str,
    ground_truth,
    extra_info,
    sandbox_fusion_url,
    concurrent_semaphore,
    memory_limit_mb,
    method,
):
    if data_source in GSM8K_SOURCES:
        from verl.utils.reward_score import gsm8k

        return gsm8k.compute_score(solution_str, ground_truth, method=method)
    if data_source in MATH_SOURCES:
        from verl.utils.reward_score import math

        return math.compute_score(solution_str, ground_truth)
    if data_source in DAPO_SOURCES or (isinstance(data_source, str) and data_source.startswith(DAPO_PREFIX)):
        from verl.utils.reward_score import math_dapo

        return math_dapo.compute_score(solution_str, ground_truth)
    if data_source in PRIME_MATH_SOURCES:
        from verl.utils.reward_score import prime_math

        return prime_math.compute_score(solution_str, ground_truth)
    if data_source in CODE_SOURCES:
        if not sandbox_fusion_url:
            # upstream falls back to running the program in-process (prime_code); we do not
            # execute model-written code outside a sandbox
            raise ValueError(
                f"data_source={data_source!r} is scored by running code in a sandbox: set "
                "reward_model.sandbox_fusion.url "
                "(sandbox_fusion_url=...); no sandbox URL is configured and local execution (upstream's "
                "prime_code) is not provided"
            )
        from verl.utils.reward_score import sandbox_fusion

        return sandbox_fusion.compute_score(
            sandbox_fusion_url, concurrent_semaphore, memory_limit_mb, solution_str, ground_truth, continuous=True
        )
    if data_source in GEO3K_SOURCES:
        from verl.utils.reward_score import geo3k

        return geo3k.compute_score(solution_str, ground_truth)
    if data_source in SEARCH_R1_SOURCES:
        from verl.utils.reward_score import search_r1_like_qa_em

        return search_r1_like_qa_em.compute_score(solution_str, ground_truth)
    if isinstance(data_source, str) and data_source.startswith(TOY_PREFIX):
        from verl.utils.reward_score import verl_toy

        return verl_toy.compute_score(solution_str, ground_truth, task=data_source[len(TOY_PREFIX) :])
    raise NotImplementedError(
        f"Reward function is not implemented for data_source={data_source!r}; known data sources: "
        f"{', '.join(known_data_sources())}. "
        "Set custom_reward_function.path / .name to score other data."
    )


def default_compute_score(
    data_source,
    solution_str,
    ground_truth,
    extra_info=None,
    sandbox_fusion_url=None,
    concurrent_semaphore=None,
    memory_limit_mb=None,
    method="strict",
    **kwargs,
) -> float | dict:
    """Score one decoded response by its data source (table in the module docstring).

    Args:
        data_source: selects the scorer; unknown ones raise NotImplementedError naming it and
            listing the known ones.
        solution_str: the decoded response. ground_truth: the reference (a dict for searchR1,
            the test cases for code sources).
        sandbox_fusion_url, concurrent_semaphore, memory_limit_mb: used by the code sources.
        method: answer extraction of gsm8k (``"strict"``: after ``####``; ``"flexible"``: the
            last number), set through ``reward.compute_score_kwargs``.
    Returns:
        a float, or the scorer's dict (``math_dapo``: ``score``/``acc``/``pred``).
    """
    res = _route(
        data_source,
        solution_str,
        ground_truth,
        extra_info,
        sandbox_fusion_url,
        concurrent_semaphore,
        memory_limit_mb,
        method,
    )
    if isinstance(res, dict):
        return res
    if isinstance(res, (int, float, bool)):
        return float(res)
    return float(res[0])


def _default_compute_score(
    data_source,
    solution_str,
    ground_truth,
    extra_info=None,
    sandbox_fusion_url=None,
    concurrent_semaphore=None,
    memory_limit_mb=None,
):
    """Older upstream name of `default_compute_score` (same arguments, no ``method``)."""
    return default_compute_score(
        data_source, solution_str, ground_truth, extra_info, sandbox_fusion_url, concurrent_semaphore, memory_limit_mb
    )


def get_default_compute_score(reward_name: str | None = None):
    """The scoring function a reward manager uses by default (the same for every manager)."""
    return default_compute_score


__all__ = ["default_compute_score", "get_default_compute_score", "known_data_sources"]
