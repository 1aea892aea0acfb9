"""Derived config values (verl/trainer/config/derived.py): the per-role batch plan with its
divisibility rules, the loss-scale default, the number of steps; and validation done once."""

from types import SimpleNamespace

import pytest

from verl.trainer.config.derived import (
    WorkerSettings,
    default_loss_scale_factor,
    derive,
    role_batch_plan,
    total_training_steps,
)
from verl.trainer.main_ppo import load_default_config
from verl.trainer.ppo.utils import remember_validated, validate_config, validated_config


def role(mini, micro=None, dynamic=False, tokens=1000):
    return SimpleNamespace(
        ppo_mini_batch_size=mini,
        ppo_micro_batch_size_per_gpu=micro,
        use_dynamic_bsz=dynamic,
        ppo_max_token_len_per_gpu=tokens,
    )


def test_role_batch_plan_counts_sequences_per_rank():
    # 8 prompts x n=4 = 32 sequences per mini-batch over 4 ranks = 8 per rank, micro-batches of 2;
    # a training batch of 32 prompts holds 32 / 8 = 4 mini-batches
    plan = role_batch_plan("actor_rollout_ref.actor", role(8, micro=2), rollout_n=4, world_size=4, train_batch_size=32)
    assert (plan.mini_batch_sequences, plan.per_rank_mini_batch, plan.micro_batch_per_rank) == (32, 8, 2)
    assert plan.n_mini_batches == 4 and plan.max_token_len_per_rank is None
    # dynamic batch sizes: a token budget instead of a micro-batch size (which is then ignored)
    plan = role_batch_plan("critic", role(8, micro=3, dynamic=True, tokens=512), rollout_n=4, world_size=2)
    assert (plan.per_rank_mini_batch, plan.micro_batch_per_rank, plan.max_token_len_per_rank) == (16, None, 512)
    assert plan.n_mini_batches is None  # no training batch size given (a worker built by hand)


@pytest.mark.parametrize(
    "mini, micro, n, world, train, pattern",
    [
        (64, 8, 8, 1, 32, r"ppo_mini_batch_size=64 is larger than data\.train_batch_size=32"),
        (12, 8, 8, 1, 32, r"train_batch_size=32 is not a multiple of .*ppo_mini_batch_size=12.*hold 8 prompts"),
        (3, 1, 1, 2, None, r"ppo_mini_batch_size \* rollout\.n = 3 \* 1 = 3 sequences cannot be split over 2"),
        (4, None, 2, 1, None, r"ppo_micro_batch_size_per_gpu is null and .*use_dynamic_bsz=False"),
        (4, 3, 2, 2, None, r"=3 does not divide .* 4 \* 2 / 2 = 4 sequences; use a divisor of 4"),
    ],
)
def test_role_batch_plan_names_the_numbers(mini, micro, n, world, train, pattern):
    with pytest.raises(ValueError, match=pattern):
        role_batch_plan("x", role(mini, micro=micro), rollout_n=n, world_size=world, train_batch_size=train)


def test_loss_scale_default_and_total_steps():
    assert default_loss_scale_factor(SimpleNamespace(loss_scale_factor=None), 64) == 64.0
    assert default_loss_scale_factor(SimpleNamespace(loss_scale_factor=2.5), 64) == 2.5
    assert total_training_steps(SimpleNamespace(total_training_steps=None, total_epochs=3), 7) == 21
    assert total_training_steps(SimpleNamespace(total_training_steps=5, total_epochs=3), 7) == 5


def test_derive_from_a_validated_config_uses_the_critic_pool():
    v = validate_config(
        load_default_config(
            [
                "algorithm.adv_estimator=gae",
                "trainer.n_gpus_per_node=2",
                "trainer.role_pools={critic: [1]}",
                "data.train_batch_size=8",
                "actor_rollout_ref.rollout.n=2",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "critic.ppo_mini_batch_size=2",
                "data.max_response_length=6",
            ]
        )
    )
    assert v.derived == derive(v)  # validation derived the same values
    d = derive(v, batches_per_epoch=10)
    assert (d.actor.world_size, d.actor.per_rank_mini_batch, d.actor.n_mini_batches) == (2, 4, 2)
    assert (d.critic.world_size, d.critic.per_rank_mini_batch, d.critic.n_mini_batches) == (1, 4, 4)
    assert d.loss_scale_factor == 6.0 and d.total_training_steps == 10 * v.trainer.total_epochs
    assert WorkerSettings(seed=3, batch_plan=d.actor).batch_plan.owner == "actor_rollout_ref.actor"


def test_a_config_is_validated_once():
    config = load_default_config(["algorithm.adv_estimator=grpo"])
    v = validate_config(config)
    assert validated_config(config) is v  # the task runner and the trainer reuse run_ppo's object
    config.trainer.total_epochs = 7  # a changed config is validated again
    v7 = validated_config(config)
    assert v7 is not v and v7.trainer.total_epochs == 7
    mine = remember_validated(config, v7)
    assert validated_config(config) is mine
