"""Several rewards with weights: a correctness reward and a brevity reward, combined by the reward
loop (each one logged as `reward/<name>/mean`, their weighted sum is the score):

    C=docs/examples/reward_components.py
    python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \
        "+reward.components=[{name: correct, path: $C, function: correct, weight: 1.0}, \
            {name: brevity, path: $C, function: brevity, weight: 0.2, reward_kwargs: {limit: 4}}]"

Each function is an ordinary scoring function (sync or `async def`); the components of a response
run concurrently. With `algorithm.adv_estimator=gdpo` and `algorithm.gdpo_reward_keys=[correct,brevity]`
GDPO normalises each component within its group instead of their sum.
"""


def correct(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 when the first line of the response is the ground truth, else 0.0."""
    answer = solution_str.strip().splitlines()[0].strip() if solution_str.strip() else ""
    return float(answer == str(ground_truth).strip())


async def brevity(data_source, solution_str, ground_truth, extra_info=None, limit=4):
    """1.0 for a response of at most `limit` characters, falling linearly to 0 at twice that."""
    n = len(solution_str.strip())
    return max(0.0, min(1.0, 2.0 - n / limit))
