"""HTTP client of a SandboxFusion service (https://github.com/bytedance/SandboxFusion).

Each test case is one ``POST <sandbox_fusion_url>`` (the service's ``/run_code`` endpoint) with
``{"code", "language", "stdin", "run_timeout", "memory_limit_MB"}``; a case passes when the run
finished with return code 0 and its stdout equals the expected output (trailing whitespace of each
line ignored). ``assert_case`` tests append the assertion to the program instead of using stdin.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["call_sandbox_api", "check_correctness", "require_sandbox_url"]

DEFAULT_LANGUAGE = "python"


def require_sandbox_url(sandbox_fusion_url: str | None) -> str:
    """The URL, or ValueError saying how to configure one."""
    if not sandbox_fusion_url:
        raise ValueError(
            "sandbox_fusion needs a sandbox URL: set reward_model.sandbox_fusion.url (e.g. "
            "'https://<your-sandbox>/run_code') or pass sandbox_fusion_url=...; no sandbox URL is configured"
        )
    return sandbox_fusion_url


def call_sandbox_api(
    sandbox_fusion_url: str,
    code: str,
    stdin: str | None,
    compile_timeout: float,
    run_timeout: float,
    memory_limit_mb: int | None,
    language: str = DEFAULT_LANGUAGE,
    request_timeout: float | None = None,
) -> tuple[dict | None, str | None]:
    """One run; returns (response json, None) or (None, error text). Never raises on network errors."""
    import requests

    url = require_sandbox_url(sandbox_fusion_url)
    payload: dict[str, Any] = {
        "code": code,
        "language": language,
        "stdin": stdin or "",
        "compile_timeout": compile_timeout,
        "run_timeout": run_timeout,
    }
    if memory_limit_mb is not None:
        payload["memory_limit_MB"] = int(memory_limit_mb)
    try:
        resp = requests.post(url, json=payload, timeout=request_timeout or (compile_timeout + run_timeout + 10))
        resp.raise_for_status()
        return resp.json(), None
    except Exception as exc:  # noqa: BLE001 - reported per test case
        return None, f"{type(exc).__name__}: {exc}"


def _same_output(actual: str, expected: str) -> bool:
    def lines(text: str) -> list[str]:
        return [ln.rstrip() for ln in str(text).strip().splitlines()]

    return lines(actual) == lines(expected)


def check_correctness(
    sandbox_fusion_url: str,
    in_outs: dict,
    generation: str,
    timeout: float = 10,
    concurrent_semaphore=None,
    memory_limit_mb: int | None = None,
    language: str = DEFAULT_LANGUAGE,
) -> tuple[list, list[dict]]:
    """Run `generation` on every case of `in_outs` (``{"inputs": [...], "outputs": [...]}`` or
    ``{"assert_case": [...]}``). Returns (results, metadata): per case True (passed), False
    (wrong output), -1 (sandbox/API error), -2 (runtime error or timeout); metadata holds the
    status, stdout/stderr and error text of each case."""
    require_sandbox_url(sandbox_fusion_url)
    asserts = in_outs.get("assert_case") if isinstance(in_outs.get("assert_case"), list) else None
    inputs = in_outs.get("inputs") or ([""] * len(asserts) if asserts else [])
    outputs = in_outs.get("outputs") or ([None] * len(asserts) if asserts else [])
    results: list = []
    metadata: list[dict] = []
    guard = concurrent_semaphore if concurrent_semaphore is not None else nullcontext()
    for i, (stdin, expected) in enumerate(zip(inputs, outputs, strict=False)):
        code = generation if not asserts else f"{generation}\n{asserts[i]}\n"
        with guard:
            response, error = call_sandbox_api(
                sandbox_fusion_url, code, stdin, timeout, timeout, memory_limit_mb, language
            )
        meta: dict[str, Any] = {"case_index": i, "input": stdin, "expected_output": expected, "api_error": error}
        if response is None:
            results.append(-1)
            meta["status"] = "api_error"
        else:
            run = response.get("run_result") or {}
            meta.update(
                status=response.get("status"),
                run_status=run.get("status"),
                stdout=run.get("stdout"),
                stderr=run.get("stderr"),
                return_code=run.get("return_code"),
            )
            if response.get("status") == "SandboxError":
                results.append(-1)
            elif run.get("status") != "Finished" or run.get("return_code") not in (0, None):
                results.append(-2)
            elif asserts:
                results.append(True)
            else:
                results.append(_same_output(run.get("stdout") or "", expected if expected is not None else ""))
        metadata.append(meta)
    return results, metadata
