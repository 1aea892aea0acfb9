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
