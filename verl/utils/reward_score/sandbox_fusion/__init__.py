"""Code scoring in a remote SandboxFusion service (upstream's ``sandbox_fusion`` entry point).

`compute_score(sandbox_fusion_url, concurrent_semaphore, memory_limit_mb, completion, test_cases,
continuous=False, timeout=10) -> (score, metadata)`: the program is the last fenced code block of
the completion (no block: score 0); `test_cases` is a dict or its JSON text with ``inputs`` /
``outputs`` (or ``assert_case``). ``score`` is the fraction of passed cases; with `continuous`, of
the first 10 cases, plus one more counted case when those all pass but a later one fails (so a
known-wrong program never scores 1.0). Calling it without a URL raises ValueError saying how to
configure one (``reward_model.sandbox_fusion.url``).
"""

from __future__ import annotations

import json
import logging

from .utils import check_correctness, require_sandbox_url

logger = logging.getLogger(__name__)

__all__ = ["check_correctness", "compute_score", "extract_code"]


def extract_code(completion: str) -> str | None:
    """The last `````python`` block, else the first fenced block (a language tag line dropped), else None."""
    if "```python" in completion:
        return completion.split("```python")[-1].split("```")[0]
    if "```" in completion:
        parts = completion.split("```")
        if len(parts) >= 2:
            block = parts[1]
            first, _, rest = block.partition("\n")
            return rest if first.strip().isalpha() else block
    return None


def compute_score(
    sandbox_fusion_url, concurrent_semaphore, memory_limit_mb, completion, test_cases, continuous=False, timeout=10
):
    require_sandbox_url(sandbox_fusion_url)
    code = extract_code(str(completion))
    if code is None:
        return 0.0, [{"error": "Invalid completion (missing code block)"}]
    if not isinstance(test_cases, dict):
        try:
            test_cases = json.loads(test_cases)
        except (TypeError, json.JSONDecodeError) as exc:
            return 0.0, [{"error": f"Invalid test_cases JSON format: {exc}"}]
    has_asserts = isinstance(test_cases.get("assert_case"), list)
    if not has_asserts and ("inputs" not in test_cases or "outputs" not in test_cases):
        return 0.0, [{"error": "Invalid test_cases structure (missing inputs/outputs)"}]
    results, metadata = check_correctness(
        sandbox_fusion_url,
        test_cases,
        code,
        timeout=timeout,
        concurrent_semaphore=concurrent_semaphore,
        memory_limit_mb=memory_limit_mb,
    )
    if not results:
        return 0.0, metadata
    if continuous:
        considered = min(len(results), 10)
        passed = sum(1 for r in results[:considered] if r is True)
        if passed == considered and any(r is False for r in results[considered:]):
            considered += 1
        return passed / considered, metadata
    return sum(1 for r in results if r is True) / len(results), metadata
