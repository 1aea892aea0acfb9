"""A complete user reward manager: the naive manager plus a penalty on response length.

Select it by registered name (the file is imported everywhere through `trainer.external_modules`)
or directly by `file.py:ClassName`:

    python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \
        trainer.external_modules=[docs/examples/custom_reward_manager.py] \
        reward_model.reward_manager=length_penalized \
        +reward_model.reward_kwargs.length_penalty=0.01

    python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \
        reward_model.reward_manager=docs/examples/custom_reward_manager.py:LengthPenalizedRewardManager

A reward manager turns a generated batch into `token_level_scores` [B, R]. Subclassing
`AbstractRewardManager` keeps decoding, error counting, the EOS-trick penalty and the placement of
the score on the last valid token; a subclass decides how the scoring function is called
(`score_items`) and may adjust the final scores (`postprocess`).
"""

from verl.workers.reward_manager.abstract import AbstractRewardManager
from verl.workers.reward_manager.registry import register


@register("length_penalized")
class LengthPenalizedRewardManager(AbstractRewardManager):
    def __init__(
        self, tokenizer, num_examine=0, compute_score=None, reward_fn_key="data_source", length_penalty=0.01, **kwargs
    ):
        super().__init__(
            tokenizer, num_examine=num_examine, compute_score=compute_score, reward_fn_key=reward_fn_key, **kwargs
        )
        self.length_penalty = float(length_penalty)

    def score_items(self, items):
        # one call per response; a call that raises comes back as a ScoreError and is counted
        return [self.call_score_fn(item) for item in items]

    def postprocess(self, items, scores, extra):
        penalties = [self.length_penalty * item.valid_response_length for item in items]
        extra["length_penalty"] = penalties  # logged next to the score
        return [score - penalty for score, penalty in zip(scores, penalties, strict=False)]
