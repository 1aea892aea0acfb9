"""A complete user advantage estimator, registered by decorator and selected by name:

    python -m verl.trainer.main_ppo \
        trainer.external_modules=[docs/examples/custom_adv_estimator.py] \
        algorithm.adv_estimator=grpo_median

`trainer.external_modules` imports this file in the driver (where advantages are computed) and in
every worker before the config is validated, so the new name is accepted.

The estimator: the outcome reward minus the *median* reward of its group (robust to one outlier
response), broadcast to every response token. Groups are the responses that share a `uid`; they
are never assumed contiguous or equally sized. A group of one response gets 0 (no baseline).
"""

import numpy as np
import torch

from verl.trainer.ppo.core_algos import register_adv_est


@register_adv_est("grpo_median")
def compute_grpo_median_advantage(token_level_rewards, response_mask, index, config=None, **kwargs):
    """
    Args:
        token_level_rewards: [B, L] rewards (the outcome score sits on the last valid token).
        response_mask: [B, L] 1 on generated tokens that count.
        index: [B] object array of prompt ids (uid); equal ids form a group.
        config: the `algorithm` config (unused here); **kwargs: everything else the trainer passes.

    Returns:
        (advantages, returns), both [B, L], zero on masked positions.
    """
    scores = (token_level_rewards * response_mask).sum(dim=-1)  # [B]
    baseline = torch.zeros_like(scores)
    has_baseline = torch.zeros_like(scores, dtype=torch.bool)
    for uid in np.unique(index):
        rows = torch.as_tensor(np.flatnonzero(index == uid))
        if len(rows) > 1:
            baseline[rows] = scores[rows].median()
            has_baseline[rows] = True
    advantages = torch.where(has_baseline, scores - baseline, torch.zeros_like(scores))
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages
