"""A complete user reward function, used without editing verl:

    python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \
        reward.custom_reward_function.path=docs/examples/custom_reward.py \
        reward.custom_reward_function.name=compute_score \
        +reward.custom_reward_function.reward_kwargs.partial_credit=0.1

The reward loop calls it once per response (with the `naive` reward manager) and puts the score on
the response's last valid token. Return a float, or a dict with a "score" entry plus any other
numbers you want logged (here "acc", which DAPO's `filter_groups.metric=acc` and validation's
accuracy metrics read).
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, partial_credit=0.0):
    """Exact match of the first line of the response with the ground truth.

    Args:
        data_source: the row's `data_source` column (e.g. "verl_toy/addition").
        solution_str: the decoded response, special tokens removed.
        ground_truth: `reward_model.ground_truth` of the row.
        extra_info: the row's `extra_info` dict (may be None).
        partial_credit: score of a well-formed but wrong answer (digits only), set through
            `reward.custom_reward_function.reward_kwargs.partial_credit`.
    """
    answer = solution_str.strip().splitlines()[0].strip() if solution_str.strip() else ""
    correct = answer == str(ground_truth).strip()
    if correct:
        score = 1.0
    elif answer.lstrip("-").isdigit():
        score = float(partial_credit)
    else:
        score = 0.0
    return {"score": score, "acc": float(correct)}
