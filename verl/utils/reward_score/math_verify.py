"""Scoring with the optional `math_verify` package (``pip install math-verify``), as upstream's
``verl.utils.reward_score.math_verify``: 1.0 when math_verify judges the response's answer
equal to ``\\boxed{ground_truth}``, else 0.0; `timeout_score` when its check times out."""

from __future__ import annotations

__all__ = ["compute_score"]


def compute_score(model_output: str, ground_truth: str, timeout_score: float = 0.0) -> float:
    try:
        from math_verify.errors import TimeoutException
        from math_verify.metric import math_metric
        from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
    except ImportError as exc:
        raise ImportError(
            "verl.utils.reward_score.math_verify needs the math-verify package: pip install math-verify"
        ) from exc
    verify = math_metric(
        gold_extraction_target=(LatexExtractionConfig(),),
        pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()),
    )
    try:
        score, _ = verify(["\\boxed{" + str(ground_truth) + "}"], [str(model_output)])
        return float(score)
    except TimeoutException:
        return float(timeout_score)
    except Exception:  # noqa: BLE001 - unparsable text scores 0
        return 0.0
