"""Upstream's module name for the MATH scorer; the implementation is `verl.utils.reward_score.math`."""

from verl.utils.reward_score.math import compute_score, is_equiv, last_boxed_only_string, remove_boxed, strip_string

__all__ = ["compute_score", "is_equiv", "last_boxed_only_string", "remove_boxed", "strip_string"]
