"""Scoring functions the reward-manager tests run in worker processes. Kept free of heavy imports
(no torch): every spawned worker imports this module to unpickle them."""

import time


def sleeps_on_nine(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "9":
        time.sleep(30)
    return float(solution_str == ground_truth)


def slow_or_failing(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "9":
        time.sleep(30)
    if solution_str == "8":
        raise KeyError("bad")
    return float(solution_str == ground_truth)


def stubborn_on_nine(data_source, solution_str, ground_truth, extra_info=None):
    """Sleeps 30 s on '9' and swallows every Exception on the way (a deadline raised as an
    Exception inside the call does not stop it; only killing its process does)."""
    if solution_str == "9":
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                time.sleep(0.05)
            except Exception:  # noqa: BLE001, S110 - the point of this scorer
                pass
    return float(solution_str == ground_truth)


def batched_sleeper(data_sources, solution_strs, ground_truths, extra_infos):
    if "9" in solution_strs:
        time.sleep(30)
    return [1.0] * len(solution_strs)
