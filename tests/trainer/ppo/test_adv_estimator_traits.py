"""Estimator traits declared at registration: a user's estimator gets the same trainer checks and
services as a built-in one; the registries keep upstream's rebind-as-module-global semantics."""

from types import SimpleNamespace

import pytest
import torch

from verl.trainer.main_ppo import load_default_config
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import AdvantageEstimator, AdvEstimatorTraits, get_adv_estimator_traits
from verl.trainer.ppo.utils import CRITIC_ESTIMATORS, GROUP_ESTIMATORS, need_critic, validate_config


def _fake_estimator(token_level_rewards, response_mask, **kwargs):
    return token_level_rewards, token_level_rewards


@pytest.fixture
def user_estimator():
    """Register `_fake_estimator` under a test name with the given traits; removed afterwards
    (a later test checks that docs/algorithms.md names every registered estimator)."""
    names = []

    def register(name, **traits):
        names.append(name)
        return core_algos.register_adv_est(name, **traits)(_fake_estimator)

    yield register
    for name in names:
        core_algos.ADV_ESTIMATOR_REGISTRY.pop(name, None)
        core_algos.ADV_ESTIMATOR_TRAITS.pop(name, None)


def test_builtin_traits_match_the_former_name_lists():
    # the lists validate_config used before the traits existed
    assert GROUP_ESTIMATORS == {
        "grpo",
        "grpo_vectorized",
        "grpo_passk",
        "grpo_process",
        "rloo",
        "rloo_vectorized",
        "reinforce_plus_plus_baseline",
        "opo",
        "gpg",
    }
    assert CRITIC_ESTIMATORS == {"gae"}
    assert core_algos.adv_estimators_with("needs_greedy_baseline") == {"remax"}
    assert core_algos.adv_estimators_with("needs_old_log_probs") == {
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
    }
    assert get_adv_estimator_traits(AdvantageEstimator.GAE) == AdvEstimatorTraits(needs_critic=True)
    with pytest.raises(ValueError, match="unknown estimator trait 'needs_grups'"):
        core_algos.adv_estimators_with("needs_grups")


def test_estimator_without_traits_behaves_as_upstream(user_estimator):
    fn = user_estimator("test_traits_plain_tmp")
    assert core_algos.ADV_ESTIMATOR_REGISTRY["test_traits_plain_tmp"] is fn  # the value stays the bare function
    assert get_adv_estimator_traits("test_traits_plain_tmp") == AdvEstimatorTraits()
    assert get_adv_estimator_traits("never_registered") == AdvEstimatorTraits()
    # positional enum registration of the same definition is a silent re-import
    grpo = core_algos.compute_grpo_outcome_advantage
    assert core_algos.register_adv_est(AdvantageEstimator.GRPO, needs_groups=True)(grpo) is grpo


def test_user_group_estimator_gets_the_rollout_n_check(user_estimator):
    user_estimator("test_traits_group_tmp", needs_groups=True)
    bad = load_default_config(["algorithm.adv_estimator=test_traits_group_tmp", "actor_rollout_ref.rollout.n=1"])
    with pytest.raises(ValueError, match=r"adv_estimator='test_traits_group_tmp'.*actor_rollout_ref\.rollout\.n=1"):
        validate_config(bad)
    # the same estimator without the trait runs with one response per prompt
    core_algos.ADV_ESTIMATOR_TRAITS.pop("test_traits_group_tmp")
    v = validate_config(
        load_default_config(
            [
                "algorithm.adv_estimator=test_traits_group_tmp",
                "actor_rollout_ref.rollout.n=1",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
            ]
        )
    )
    assert v.algorithm.adv_estimator == "test_traits_group_tmp" and not v.use_critic


def test_user_value_estimator_gets_a_critic(user_estimator):
    user_estimator("test_traits_critic_tmp", needs_critic=True)
    config = {"algorithm": {"adv_estimator": "test_traits_critic_tmp"}, "critic": {"enable": None}}
    assert need_critic(config) is True
    assert need_critic({"algorithm": {"adv_estimator": "grpo"}}) is False
    assert need_critic({"algorithm": {"adv_estimator": "test_traits_critic_tmp"}, "critic": {"enable": False}}) is False
    v = validate_config(load_default_config(["algorithm.adv_estimator=test_traits_critic_tmp"]))
    assert v.use_critic
    with pytest.raises(ValueError, match=r"adv_estimator='test_traits_critic_tmp' needs a value model"):
        validate_config(load_default_config(["algorithm.adv_estimator=test_traits_critic_tmp", "critic.enable=False"]))


def test_user_greedy_baseline_estimator_needs_sampling(user_estimator):
    user_estimator("test_traits_greedy_tmp", needs_greedy_baseline=True)
    bad = load_default_config(
        ["algorithm.adv_estimator=test_traits_greedy_tmp", "actor_rollout_ref.rollout.do_sample=False"]
    )
    with pytest.raises(ValueError, match=r"adv_estimator=test_traits_greedy_tmp compares sampled responses"):
        validate_config(bad)


def test_old_log_prob_shortcut_is_off_for_estimators_that_read_old_log_probs(user_estimator):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    user_estimator("test_traits_old_lp_tmp", needs_old_log_probs=True)
    rc = SimpleNamespace(bypass_mode=False, rollout_rs=None, rollout_is=None)
    algorithm = SimpleNamespace(rollout_correction=rc, use_kl_in_reward=False, adv_estimator="grpo")
    cfg = SimpleNamespace(
        algorithm=algorithm,
        actor=SimpleNamespace(ppo_mini_batch_size=4, ppo_epochs=1),
        data=SimpleNamespace(train_batch_size=4),
    )
    fake = SimpleNamespace(cfg=cfg)
    fake.bypass_mode = lambda: RayPPOTrainer.bypass_mode(fake)
    assert RayPPOTrainer.can_skip_old_log_prob(fake) is True
    for name in ("optimal_token_baseline", "test_traits_old_lp_tmp"):
        algorithm.adv_estimator = name
        assert RayPPOTrainer.can_skip_old_log_prob(fake) is False, name


def test_rebound_registries_receive_later_registrations(monkeypatch):
    # upstream's own test replaces the dicts as module globals, then registers
    adv, losses = {"gae": lambda x: x * 2}, {}
    monkeypatch.setattr(core_algos, "ADV_ESTIMATOR_REGISTRY", adv)
    monkeypatch.setattr(core_algos, "POLICY_LOSS_REGISTRY", losses)

    @core_algos.register_adv_est("test_rebound_est")
    def est(token_level_rewards, response_mask, **kwargs):
        return token_level_rewards, token_level_rewards

    @core_algos.register_policy_loss("test_rebound_loss")
    def loss(old_log_prob, log_prob, advantages, response_mask, **kwargs):
        return log_prob.sum(), {}

    assert adv["test_rebound_est"] is est and set(adv) == {"gae", "test_rebound_est"}
    assert losses == {"test_rebound_loss": loss}
    assert core_algos.get_adv_estimator_fn("test_rebound_est") is est
    assert core_algos.get_policy_loss_fn("test_rebound_loss") is loss
    assert core_algos.get_adv_estimator_fn("gae")(torch.tensor(2.0)) == 4.0
    monkeypatch.undo()
    core_algos.ADV_ESTIMATOR_TRAITS.pop("test_rebound_est", None)
    assert "test_rebound_est" not in core_algos.ADV_ESTIMATOR_REGISTRY
    assert "test_rebound_loss" not in core_algos.POLICY_LOSS_REGISTRY
