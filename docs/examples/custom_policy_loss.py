"""A complete user-defined policy loss, registered by decorator.

Use it without editing the package:

    python -m verl.trainer.main_ppo \
        trainer.external_modules=[docs/examples/custom_policy_loss.py] \
        actor_rollout_ref.actor.policy_loss.loss_mode=truncated_pg \
        +actor_rollout_ref.actor.policy_loss.extra.truncation=2.0

(`VERL_USE_EXTERNAL_MODULES=path.to.module` works as well.) The file is imported in the driver and
in every worker process, so the decorator runs before the actor looks up `loss_mode`.

The loss is REINFORCE with a stop-gradient importance weight truncated from above:
    per token  -sg(min(ratio, c)) * A * log_prob,   ratio = exp(log_prob - old_log_prob)
"""

import torch

import verl.utils.torch_functional as verl_F
from verl.trainer.ppo.core_algos import agg_loss, batch_info_of, config_get, register_policy_loss


@register_policy_loss("truncated_pg")
def compute_policy_loss_truncated_pg(
    old_log_prob: torch.Tensor,  # [B, L] log-probs of the policy that produced the batch
    log_prob: torch.Tensor,  # [B, L] current log-probs (requires grad)
    advantages: torch.Tensor,  # [B, L]
    response_mask: torch.Tensor,  # [B, L] 1 on tokens that count
    loss_agg_mode: str = "token-mean",
    config=None,  # actor config (dataclass) or a dict
    rollout_is_weights: torch.Tensor | None = None,  # [B, L] detached, or None
):
    # user knobs live in actor.policy_loss.extra; config_get reads dataclasses and dicts alike
    extra = config_get(config_get(config, "policy_loss"), "extra", {})
    truncation = float(config_get(extra, "truncation", 2.0))

    log_ratio = torch.clamp(log_prob - old_log_prob, -20.0, 20.0).detach()
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, max=truncation)
    per_token = -weight * advantages * log_prob
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights

    # the actor's config carries the mini-batch totals of this micro-batch (`global_batch_info`):
    # passed on, the result is this micro-batch's exact share of the mini-batch loss, so
    # accumulation stays exact (batch_info_of also accepts a dict config or None)
    pg_loss = agg_loss(per_token, response_mask, loss_agg_mode, **batch_info_of(config))

    metrics = {
        "actor/pg_clipfrac": verl_F.masked_mean((ratio > truncation).float(), response_mask).item(),
        "actor/ppo_kl": verl_F.masked_mean(-log_ratio, response_mask).item(),
        "actor/pg_clipfrac_lower": 0.0,
    }
    return pg_loss, metrics
