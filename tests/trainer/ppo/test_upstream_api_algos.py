"""Every public name of upstream verl's algorithm modules exists here with a compatible signature.

The table lists, per module, upstream's public functions with their parameter names in order
(from upstream's main branch) and its public constants/classes. "Compatible": our function takes
upstream's parameters at the same positions (so positional calls work) and by the same names
(so keyword calls work); any parameter we add comes after them and has a default.
Run `python tests/test_upstream_api_algos.py` to print the per-module counts.
"""

from __future__ import annotations

import importlib
import inspect
import sys

import pytest

_LOSS = ["old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode", "config", "rollout_is_weights"]
_GRPO = ["token_level_rewards", "response_mask", "index", "epsilon", "norm_adv_by_std_in_grpo", "config"]
_GROUP = ["token_level_rewards", "response_mask", "index", "epsilon", "config"]
_OTB = [
    "token_level_rewards",
    "response_mask",
    "index",
    "old_log_probs",
    "sum_pi_squared",
    "rollout_is_weights",
    "handle_zero_tail",
    "epsilon",
]

UPSTREAM: dict[str, dict[str, list[str] | None]] = {
    "verl.trainer.ppo.core_algos": {
        "POLICY_LOSS_REGISTRY": None,
        "ADV_ESTIMATOR_REGISTRY": None,
        "AdvantageEstimator": None,
        "PolicyLossFn": None,
        "register_policy_loss": ["name"],
        "get_policy_loss_fn": ["name"],
        "register_adv_est": ["name_or_enum"],
        "get_adv_estimator_fn": ["name_or_enum"],
        "AdaptiveKLController": ["init_kl_coef", "target_kl", "horizon"],
        "FixedKLController": ["kl_coef"],
        "get_kl_controller": ["kl_ctrl"],
        "compute_gae_advantage_return": ["token_level_rewards", "values", "response_mask", "gamma", "lam"],
        "compute_grpo_outcome_advantage": _GRPO,
        "compute_grpo_vectorized_outcome_advantage": _GRPO,
        "compute_gdpo_outcome_advantage": _GRPO + ["non_tensor_batch", "batch"],
        "compute_grpo_passk_outcome_advantage": _GRPO,
        "compute_reinforce_plus_plus_baseline_outcome_advantage": _GROUP,
        "compute_rloo_outcome_advantage": _GROUP,
        "compute_opo_outcome_advantage": _GROUP,
        "compute_reinforce_plus_plus_outcome_advantage": ["token_level_rewards", "response_mask", "config"],
        "compute_remax_outcome_advantage": ["token_level_rewards", "reward_baselines", "response_mask", "config"],
        "compute_gpg_outcome_advantage": [
            "token_level_rewards",
            "response_mask",
            "index",
            "epsilon",
            "f_norm",
            "alpha",
            "config",
        ],
        "compute_rloo_vectorized_outcome_advantage": _GROUP,
        "compute_optimal_token_baseline_advantage": _OTB,
        "compute_multi_turn_optimal_token_baseline_advantage": _OTB,
        "compute_rewards": ["token_level_scores", "old_log_prob", "ref_log_prob", "kl_ratio"],
        "agg_loss": [
            "loss_mat",
            "loss_mask",
            "loss_agg_mode",
            "dp_size",
            "batch_num_tokens",
            "global_batch_size",
            "loss_scale_factor",
        ],
        "compute_policy_loss": [
            "old_log_prob",
            "log_prob",
            "advantages",
            "response_mask",
            "cliprange",
            "cliprange_low",
            "cliprange_high",
            "clip_ratio_c",
            "loss_agg_mode",
        ],
        **{
            f"compute_policy_loss_{n}": _LOSS
            for n in (
                "vanilla",
                "up",
                "dppo_tv",
                "dppo_kl",
                "gspo",
                "sapo",
                "gpg",
                "clip_cov",
                "kl_cov",
                "geo_mean",
                "cispo",
                "bypass_mode",
            )
        },
        "compute_policy_loss_reinforce": ["rollout_log_prob"] + _LOSS[1:],
        "compute_entropy_loss": ["logits", "response_mask", "loss_agg_mode"],
        "compute_value_loss": [
            "vpreds",
            "returns",
            "values",
            "response_mask",
            "cliprange_value",
            "loss_agg_mode",
            "dp_size",
            "batch_num_tokens",
            "global_batch_size",
            "loss_scale_factor",
        ],
        "kl_penalty": ["logprob", "ref_logprob", "kl_penalty"],
        "kl_penalty_forward": ["logprob", "ref_logprob", "kl_penalty"],
        "compute_pf_ppo_reweight_data": ["data", "reweight_method", "weight_pow"],
    },
    "verl.trainer.ppo.rollout_corr_helper": {
        "SAFETY_BOUND": None,
        "SUPPORTED_ROLLOUT_RS_OPTIONS": None,
        "TOKEN_LEVEL_ROLLOUT_RS_OPTIONS": None,
        "compute_binary_kl_divergence": ["log_p", "log_q", "eps"],
        "compute_rollout_rejection_mask": [
            "log_ratio",
            "response_mask",
            "rollout_rs",
            "rollout_rs_threshold",
            "old_log_prob",
            "rollout_log_prob",
        ],
        "compute_rs_metrics": [
            "option_name",
            "rs_statistic",
            "response_mask",
            "seq_valid_mask",
            "level",
            "per_sequence_values",
            "rollout_rs_threshold",
            "rollout_rs_threshold_lower",
            "apply_lower_threshold",
        ],
        "compute_rollout_correction_weights": [
            "log_ratio",
            "response_mask",
            "rollout_is",
            "rollout_is_threshold",
            "rollout_is_batch_normalize",
        ],
        "compute_is_metrics": [
            "rollout_is_weights",
            "raw_rollout_is_weights",
            "log_ratio_for_metrics",
            "response_mask",
            "rollout_is",
            "rollout_is_threshold",
            "rollout_is_threshold_lower",
        ],
        "compute_rollout_correction_and_rejection_mask": [
            "old_log_prob",
            "rollout_log_prob",
            "response_mask",
            "rollout_is",
            "rollout_is_threshold",
            "rollout_is_batch_normalize",
            "rollout_rs",
            "rollout_rs_threshold",
        ],
        "compute_offpolicy_metrics": ["old_log_prob", "rollout_log_prob", "response_mask"],
        "compute_rollout_correction_and_add_to_batch": ["batch", "rollout_corr_config"],
        "compute_rollout_corr_metrics_from_logprobs": ["log_prob", "rollout_log_prob", "response_mask"],
        "apply_bypass_mode": ["batch", "rollout_corr_config", "policy_loss_config"],
    },
    "verl.trainer.ppo.metric_utils": {
        "reduce_metrics": ["metrics"],
        "compute_data_metrics": ["batch", "use_critic"],
        "compute_timing_metrics": ["batch", "timing_raw"],
        "compute_throughout_metrics": ["batch", "timing_raw", "n_gpus"],
        "compute_variance_proxy_metrics": ["batch", "gradient_norm"],
        "bootstrap_metric": ["data", "subset_size", "reduce_fns", "n_bootstrap", "seed"],
        "calc_maj_val": ["data", "vote_key", "val_key"],
        "process_validation_metrics": ["data_sources", "sample_uids", "infos_dict", "seed"],
    },
    # the module-level algorithm helpers of the trainer module (the trainer class is not listed)
    "verl.trainer.ppo.ray_trainer": {
        "compute_advantage": [
            "data",
            "adv_estimator",
            "gamma",
            "lam",
            "num_repeat",
            "norm_adv_by_std_in_grpo",
            "config",
        ],
        "apply_kl_penalty": ["data", "kl_ctrl", "kl_penalty"],
        "compute_response_mask": ["data"],
    },
}

# upstream's keyword-only parameters (after `*`)
KEYWORD_ONLY = {("verl.trainer.ppo.rollout_corr_helper", "compute_rs_metrics"): 4}

UPSTREAM_ESTIMATORS = [
    "GAE",
    "GRPO",
    "REINFORCE_PLUS_PLUS",
    "REINFORCE_PLUS_PLUS_BASELINE",
    "REMAX",
    "RLOO",
    "OPO",
    "GRPO_PASSK",
    "GPG",
    "RLOO_VECTORIZED",
    "GRPO_VECTORIZED",
    "OPTIMAL_TOKEN_BASELINE",
    "TIR_OPTIMAL_TOKEN_BASELINE",
    "GDPO",
]


def signature_problem(module_name: str, name: str, expected: list[str] | None) -> str | None:
    """None when `module_name.name` exists with a compatible signature, else what is wrong."""
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - a report, not a crash
        return f"module does not import: {exc}"
    if not hasattr(module, name):
        return "missing"
    if expected is None:
        return None
    obj = getattr(module, name)
    params = list(inspect.signature(obj.__init__ if inspect.isclass(obj) else obj).parameters.values())
    if inspect.isclass(obj):
        params = params[1:]  # self
    n_positional = KEYWORD_ONLY.get((module_name, name), len(expected))
    names = [p.name for p in params]
    for i, want in enumerate(expected[:n_positional]):
        if (
            i >= len(params)
            or params[i].name != want
            or params[i].kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY)
        ):
            return f"position {i}: expected {want!r}, have {names}"
    has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    for want in expected[n_positional:]:
        if want not in names and not has_var_kw:
            return f"keyword {want!r} missing, have {names}"
    for p in params[len(expected) :]:
        if p.default is inspect.Parameter.empty and p.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        ):
            return f"extra required parameter {p.name!r}"
    return None


CASES = [(m, n) for m, names in UPSTREAM.items() for n in names]


@pytest.mark.parametrize("module_name,name", CASES, ids=[f"{m.rsplit('.', 1)[-1]}.{n}" for m, n in CASES])
def test_upstream_public_name_is_present_and_compatible(module_name, name):
    problem = signature_problem(module_name, name, UPSTREAM[module_name][name])
    assert problem is None, f"{module_name}.{name}: {problem}"


def test_advantage_estimator_enum_has_upstream_members():
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, AdvantageEstimator

    for member in UPSTREAM_ESTIMATORS:
        assert getattr(AdvantageEstimator, member).value in ADV_ESTIMATOR_REGISTRY


def test_upstream_defaults_of_the_aggregation_sensitive_losses():
    from verl.trainer.ppo import core_algos

    def default(fn):
        return inspect.signature(fn).parameters["loss_agg_mode"].default

    assert default(core_algos.compute_policy_loss_sapo) == "seq-mean-token-mean"
    assert default(core_algos.compute_policy_loss_gspo) == "seq-mean-token-mean"
    assert default(core_algos.compute_policy_loss_reinforce) == "seq-mean-token-sum"
    assert default(core_algos.compute_policy_loss_vanilla) == "token-mean"


def counts() -> dict[str, tuple[int, int]]:
    """module -> (compatible upstream names here, upstream names)."""
    return {
        m: (sum(signature_problem(m, n, sig) is None for n, sig in names.items()), len(names))
        for m, names in UPSTREAM.items()
    }


if __name__ == "__main__":
    for module_name, (have, total) in counts().items():
        print(f"{module_name}: {have}/{total}")
        for name, sig in UPSTREAM[module_name].items():
            problem = signature_problem(module_name, name, sig)
            if problem:
                print(f"  {name}: {problem}")
    sys.exit(0)
