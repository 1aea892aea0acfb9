"""The algorithm core: advantage estimators, policy losses, loss aggregation, KL and value loss.

Everything here is a pure torch function of explicit tensors (no distributed calls, no workers, no
Hydra). Shapes use B = responses in the batch, L = padded response length; `response_mask` [B, L]
is 1 on the generated tokens that count. `index` is the numpy array of prompt ids (`uid`, object
dtype) that defines the groups; groups are never assumed to be contiguous or of equal size. The
spec of every formula is `ALGORITHMS.md`; the user-facing summary is `docs/algorithms.md`.

Extension points (user files can register their own functions without editing this package):

- `@register_policy_loss(name)`: `fn(old_log_prob, log_prob, advantages, response_mask,
  loss_agg_mode="token-mean", config=None, rollout_is_weights=None) -> (pg_loss, metrics)`,
  selected by `actor_rollout_ref.actor.policy_loss.loss_mode`.
- `@register_adv_est(name)`: `fn(token_level_rewards, response_mask, index=None, config=None,
  **kwargs) -> (advantages, returns)`, selected by `algorithm.adv_estimator`.

Micro-batching: `agg_loss` computes the exact share of the mini-batch loss for a micro-batch when
it is given the mini-batch-global denominators; the engine writes them into the loss's
`config.global_batch_info` and every loss passes `**batch_info_of(config)` on (docs/algorithms.md).

Layout: this module is the facade. The registries, their registrars and getters, the estimator
traits and `AdvantageEstimator` live in `verl.trainer.ppo.algos.registry` (the bottom of the
algorithm layer: the built-ins import it, nothing there imports this module); the built-in
functions live in `verl.trainer.ppo.algos` (`aggregation`, `kl`, `policy_losses`, `normalization`,
`gae_lambda`, `advantages`, `token_baselines`, `rewards`). All are re-exported here as the same
objects. The registrars use the dicts bound to `ADV_ESTIMATOR_REGISTRY` / `POLICY_LOSS_REGISTRY`
in this module when they run, so rebinding them here (as upstream's tests do) redirects later
registrations. Rebinding a function
here does not reach the built-ins, though: monkeypatching `core_algos.agg_loss` changes what user
code calling `core_algos.agg_loss` gets, while the built-in losses keep calling the `agg_loss`
they imported from `algos.aggregation` (`algos.policy_losses.agg_loss` is the name they look up).
"""

from __future__ import annotations

import logging

from verl.utils.py_functional import config_get

logger = logging.getLogger(__name__)

__all__ = [
    # registries
    "POLICY_LOSS_REGISTRY",
    "register_policy_loss",
    "get_policy_loss_fn",
    "ADV_ESTIMATOR_REGISTRY",
    "AdvantageEstimator",
    "register_adv_est",
    "get_adv_estimator_fn",
    "AdvEstimatorTraits",
    "ADV_ESTIMATOR_TRAITS",
    "get_adv_estimator_traits",
    "adv_estimators_with",
    "unpack_policy_loss_output",
    "config_get",
    # aggregation and micro-batching
    "LOSS_AGG_MODES",
    "GLOBAL_BATCH_INFO_KEYS",
    "agg_loss",
    "batch_info_of",
    "BatchLossStats",
    "compute_batch_loss_stats",
    "merge_batch_loss_stats",
    "make_global_batch_info",
    "compute_group_num_tokens",
    # KL
    "KL_PENALTY_TYPES",
    "kl_penalty",
    "kl_penalty_forward",
    "compute_rewards",
    "FixedKLController",
    "AdaptiveKLController",
    "get_kl_controller",
    # losses
    "compute_policy_loss",
    "compute_policy_loss_vanilla",
    "compute_policy_loss_gspo",
    "compute_policy_loss_sapo",
    "compute_policy_loss_cispo",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_gpg",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_pg",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dro",
    "compute_policy_loss_up",
    "compute_policy_loss_bypass_mode",
    "PolicyLossFn",
    "compute_entropy_loss",
    "compute_value_loss",
    # advantages
    "normalize_by_config",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_process_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_norm_outcome_advantage",
    "compute_gdpo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_pf_ppo_reweight_data",
    "step_rewards_to_go",
    # GAE lambda
    "GAELambdaContext",
    "GAE_LAMBDA_FN_REGISTRY",
    "register_gae_lambda_fn",
    "resolve_gae_lambda",
    "vapo_length_adaptive",
    "relative_position",
    # rewards
    "compute_overlong_penalty",
]


# =============================================================================================
# Registries: they live in algos/registry.py (the bottom of the algorithm layer); re-exported here
# as the same objects. The registrars use the dicts bound to these names here, so rebinding
# core_algos.ADV_ESTIMATOR_REGISTRY (as upstream's tests do) redirects later registrations.
# =============================================================================================

# =============================================================================================
# The built-in functions, one module per section (verl/trainer/ppo/algos/). They import the
# registrars above, so they come last; importing them registers the built-ins. The names are
# re-exported here as the same objects.
# =============================================================================================
from verl.trainer.ppo.algos.advantages import (  # noqa: E402
    compute_gae_advantage_return,
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_process_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_norm_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_pf_ppo_reweight_data,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    step_rewards_to_go,
)
from verl.trainer.ppo.algos.aggregation import (  # noqa: E402
    GLOBAL_BATCH_INFO_KEYS,
    LOSS_AGG_MODES,
    BatchLossStats,
    agg_loss,
    batch_info_of,
    compute_batch_loss_stats,
    compute_group_num_tokens,
    make_global_batch_info,
    merge_batch_loss_stats,
)
from verl.trainer.ppo.algos.gae_lambda import (  # noqa: E402
    GAE_LAMBDA_FN_REGISTRY,
    GAELambdaContext,
    register_gae_lambda_fn,
    relative_position,
    resolve_gae_lambda,
    vapo_length_adaptive,
)
from verl.trainer.ppo.algos.gae_lambda import (  # noqa: E402
    _resolve_callable as _resolve_callable,  # validate_config resolves algorithm.lam with it
)
from verl.trainer.ppo.algos.kl import (  # noqa: E402
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    compute_rewards,
    get_kl_controller,
    kl_penalty,
    kl_penalty_forward,
)
from verl.trainer.ppo.algos.normalization import (  # noqa: E402
    normalize_by_config,
)
from verl.trainer.ppo.algos.policy_losses import (  # noqa: E402
    compute_entropy_loss,
    compute_policy_loss,
    compute_policy_loss_bypass_mode,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_pg,
    compute_policy_loss_reinforce,
    compute_policy_loss_sapo,
    compute_policy_loss_up,
    compute_policy_loss_vanilla,
    compute_value_loss,
)
from verl.trainer.ppo.algos.registry import (  # noqa: E402
    ADV_ESTIMATOR_REGISTRY,
    ADV_ESTIMATOR_TRAITS,
    POLICY_LOSS_REGISTRY,
    AdvantageEstimator,
    AdvEstimatorTraits,
    PolicyLossFn,
    adv_estimators_with,
    get_adv_estimator_fn,
    get_adv_estimator_traits,
    get_policy_loss_fn,
    register_adv_est,
    register_policy_loss,
    unpack_policy_loss_output,
)
from verl.trainer.ppo.algos.rewards import (  # noqa: E402
    compute_overlong_penalty,
)
from verl.trainer.ppo.algos.token_baselines import (  # noqa: E402
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
