"""The whole-config check that runs before any worker starts: every message names the key, the
value and what is allowed."""

import importlib.util
import logging
import textwrap

import pytest

from verl.trainer.main_ppo import load_default_config
from verl.trainer.ppo.utils import validate_config


def cfg(*overrides):
    return load_default_config(list(overrides))


# a run with a model path gets upstream's defaults (no embedded preset): GRPO needs rollout.n > 1,
# upstream's defaults leave the micro-batch size unset and log to wandb
REAL_RUN = (
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "trainer.logger=[console]",
)


def test_default_and_grpo_configs_validate():
    v = validate_config(cfg())
    assert v.algorithm.adv_estimator == "gae" and v.use_critic and not v.use_reference_policy
    v = validate_config(cfg("algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=True"))
    assert not v.use_critic and v.use_reference_policy and v.n_workers == 1


def test_unknown_keys_are_named():
    with pytest.raises(ValueError, match=r"unknown config key.*'data\.train_batch_sise'"):
        validate_config(cfg("+data.train_batch_sise=3"))
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.policy_loss\.loss_mod'"):
        validate_config(cfg("+actor_rollout_ref.actor.policy_loss.loss_mod=x"))
    with pytest.raises(ValueError, match=r"unknown top-level config section.*'trainr'"):
        validate_config(cfg("+trainr.x=1"))


def test_unregistered_loss_and_estimator_list_the_registered_names():
    with pytest.raises(ValueError, match=r"loss_mode='nope'.*registered: \[.*'gspo'.*'vanilla'"):
        validate_config(cfg("actor_rollout_ref.actor.policy_loss.loss_mode=nope"))
    with pytest.raises(ValueError, match=r"adv_estimator='nope'.*registered: \[.*'gae'.*'grpo'"):
        validate_config(cfg("algorithm.adv_estimator=nope"))


def test_user_loss_from_external_module_is_accepted(tmp_path):
    f = tmp_path / "my_loss_for_config_test.py"
    f.write_text(
        textwrap.dedent(
            """
        from verl.trainer.ppo.core_algos import register_policy_loss, compute_policy_loss_vanilla

        @register_policy_loss("cfg_test_loss")
        def my_loss(*args, **kwargs):
            return compute_policy_loss_vanilla(*args, **kwargs)
        """
        )
    )
    bad = cfg("actor_rollout_ref.actor.policy_loss.loss_mode=cfg_test_loss")
    with pytest.raises(ValueError, match="cfg_test_loss"):
        validate_config(bad)
    from verl.trainer.ppo import core_algos

    try:
        v = validate_config(
            cfg("actor_rollout_ref.actor.policy_loss.loss_mode=cfg_test_loss", f"trainer.external_modules=[{f}]")
        )
        assert v.actor.policy_loss.loss_mode == "cfg_test_loss"
    finally:  # later tests check that docs/algorithms.md lists every registered name
        core_algos.POLICY_LOSS_REGISTRY.pop("cfg_test_loss", None)


def test_group_estimator_with_one_response_names_both_keys():
    with pytest.raises(ValueError, match=r"adv_estimator='grpo'.*actor_rollout_ref\.rollout\.n=1"):
        validate_config(cfg("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"))
    # a non-group estimator is fine with n=1
    validate_config(
        cfg(
            "algorithm.adv_estimator=reinforce_plus_plus",
            "actor_rollout_ref.rollout.n=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        )
    )


def test_gae_without_critic_is_rejected():
    with pytest.raises(ValueError, match=r"adv_estimator='gae' needs a value model.*critic\.enable=False"):
        validate_config(cfg("critic.enable=False"))


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        (["trainer.n_gpus_per_node=3"], r"32 \* 8 = 256 sequences cannot be split evenly over 3 data-parallel workers"),
        (["data.train_batch_size=16"], r"ppo_mini_batch_size=32 is larger than data\.train_batch_size=16"),
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=12"],
            r"train_batch_size=32 is not a multiple of .*ppo_mini_batch_size=12.*8 prompts",
        ),
        (
            [
                "actor_rollout_ref.actor.use_dynamic_bsz=False",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=48",
            ],
            r"ppo_micro_batch_size_per_gpu=48 does not divide .* 32 \* 8 / 1 = 256",
        ),
        (
            [
                "trainer.n_gpus_per_node=2",
                "actor_rollout_ref.actor.use_dynamic_bsz=False",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=96",
            ],
            r"32 \* 8 / 2 = 128",
        ),
        (
            [
                "actor_rollout_ref.actor.use_dynamic_bsz=False",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=512",
            ],
            r"=512 does not divide .* = 256 sequences",
        ),
    ],
)
def test_batch_size_rules_give_the_numbers(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        validate_config(cfg("algorithm.adv_estimator=grpo", *overrides))


def test_batch_sizes_that_work():
    validate_config(cfg("algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=256"))
    # dynamic batch sizes ignore the micro-batch size
    validate_config(
        cfg(
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=48",
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
        )
    )
    validate_config(
        cfg(
            "algorithm.adv_estimator=grpo",
            "trainer.n_gpus_per_node=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        )
    )


def test_critic_batch_sizes_use_the_critic_pool():
    with pytest.raises(
        ValueError, match=r"critic\.ppo_mini_batch_size \* rollout\.n = 32 \* 8 = 256 sequences cannot be split over 3"
    ):
        validate_config(cfg("trainer.role_pools={critic: [3]}"))


def test_trainer_values_are_checked():
    with pytest.raises(ValueError, match=r"trainer\.resume_mode=resume_path needs trainer\.resume_from_path"):
        validate_config(cfg("trainer.resume_mode=resume_path"))
    with pytest.raises(
        ValueError, match=r"trainer\.device='tpu' is not allowed; expected one of \['auto', 'cuda', 'cpu'\]"
    ):
        validate_config(cfg("trainer.device=tpu"))
    with pytest.raises(ValueError, match=r"trainer\.logger\[\]='stdout'"):
        validate_config(cfg("trainer.logger=[console,stdout]"))
    with pytest.raises(ValueError, match=r"data\.truncation='cut'.*\['left', 'right', 'middle', 'error'\]"):
        validate_config(cfg("data.truncation=cut"))
    with pytest.raises(ValueError, match=r"trainer\.critic_warmup=2 needs a critic"):
        validate_config(cfg("algorithm.adv_estimator=grpo", "trainer.critic_warmup=2"))


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_missing_logger_backend_fails_before_start():
    with pytest.raises(ImportError, match=r"trainer\.logger includes 'wandb' but the package 'wandb' is not installed"):
        validate_config(cfg("trainer.logger=[console,wandb]"))


def test_rollout_correction_needs_rollout_log_probs():
    with pytest.raises(ValueError, match="calculate_log_probs=True"):
        validate_config(
            cfg("algorithm.rollout_correction.rollout_is=token", "actor_rollout_ref.rollout.calculate_log_probs=False")
        )


def test_missing_local_files_are_named_before_anything_starts(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"data\.train_files='/no/such/train\.parquet': no such file"):
        validate_config(cfg("algorithm.adv_estimator=grpo", "data.train_files=/no/such/train.parquet"))
    with pytest.raises(FileNotFoundError, match=r"actor_rollout_ref\.model\.path='/no/such/model'"):
        validate_config(cfg("algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=/no/such/model", *REAL_RUN))
    with pytest.raises(FileNotFoundError, match=r"custom_reward_function\.path='missing_reward\.py'"):
        validate_config(cfg("algorithm.adv_estimator=grpo", "custom_reward_function.path=missing_reward.py"))
    # a hub id is not a local path: it is left to the loader when it can be fetched (cached or hub reachable)
    import verl.trainer.ppo.source_checks as source_checks

    with monkeypatch.context() as m:
        m.setattr(source_checks, "_offline_reason", lambda repo_id: None)
        validate_config(
            cfg("algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct", *REAL_RUN)
        )
    # ... and refused before anything starts when it cannot
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        FileNotFoundError,
        match=r"actor_rollout_ref\.model\.path='no-such-org/no-such-model' is not a local "
        r"model directory.*cannot be fetched offline: HF_HUB_OFFLINE",
    ):
        validate_config(
            cfg("algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=no-such-org/no-such-model", *REAL_RUN)
        )
    empty = tmp_path / "empty_model"
    empty.mkdir()
    with pytest.raises(
        FileNotFoundError,
        match=r"actor_rollout_ref\.model\.path='.*empty_model' is not a local model "
        r"directory: config\.json missing",
    ):
        validate_config(cfg("algorithm.adv_estimator=grpo", f"actor_rollout_ref.model.path={empty}", *REAL_RUN))
    existing = tmp_path / "train.parquet"
    existing.write_bytes(b"PAR1")  # exists and is not empty (validation does not parse it; 0 bytes fails)
    validate_config(cfg("algorithm.adv_estimator=grpo", f"data.train_files=[{existing}]"))


def test_remote_and_file_uris_are_checked_before_anything_starts():
    with pytest.raises(
        NotImplementedError, match=r"actor_rollout_ref\.model\.path='hdfs://nn/models/x': remote storage"
    ):
        validate_config(
            cfg("algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=hdfs://nn/models/x", *REAL_RUN)
        )
    with pytest.raises(FileNotFoundError, match=r"data\.val_files='/no/such/val\.parquet'"):
        validate_config(cfg("algorithm.adv_estimator=grpo", "data.val_files=file:///no/such/val.parquet"))


def test_callbacks_are_checked_before_anything_starts(tmp_path):
    f = tmp_path / "my_callbacks_for_config_test.py"
    f.write_text(
        textwrap.dedent(
            """
        from verl.trainer.ppo.ray_trainer import TrainerCallback

        class Good(TrainerCallback):
            pass

        class NotACallback:
            pass
        """
        )
    )
    v = validate_config(cfg("algorithm.adv_estimator=grpo", f"trainer.callbacks=[{f}:Good]"))
    assert v.trainer.callbacks == [f"{f}:Good"]
    with pytest.raises(ValueError, match=r"trainer\.callbacks entry='Good' must look like 'path/to/file\.py:Name'"):
        validate_config(cfg("algorithm.adv_estimator=grpo", "trainer.callbacks=[Good]"))
    with pytest.raises(AttributeError, match=r"defines no 'Missing'"):
        validate_config(cfg("algorithm.adv_estimator=grpo", f"trainer.callbacks=[{f}:Missing]"))
    with pytest.raises(TypeError, match=r"NotACallback.*not a subclass of .*TrainerCallback"):
        validate_config(cfg("algorithm.adv_estimator=grpo", f"trainer.callbacks=[{f}:NotACallback]"))


def test_full_kl_in_reward_is_rejected_before_anything_starts():
    with pytest.raises(ValueError, match=r"kl_penalty='full' needs whole-vocabulary distributions"):
        validate_config(cfg("algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=full"))


def test_keys_read_by_the_hf_engine_and_the_checkpoint_manager_match_the_code():
    """The accepted-key lists of the checks are the keys the code actually reads."""
    import inspect
    import re

    import verl.utils.checkpoint.checkpoint_manager as ckpt
    import verl.workers.fsdp_workers as workers
    from verl.trainer.ppo.utils import CHECKPOINT_KEYS, HF_ENGINE_KWARGS

    read = set(re.findall(r'engine_kwargs\.get\("(\w+)"', inspect.getsource(workers)))
    assert read == set(HF_ENGINE_KWARGS)
    read = set(re.findall(r'cfg\.get\("(\w+)"\)', inspect.getsource(ckpt.BaseCheckpointManager.__init__)))
    # save_lora_only: read by BaseCheckpointManager.should_save_lora_only (upstream's property)
    read |= set(re.findall(r'\.get\("(save_lora_only)"', inspect.getsource(ckpt.BaseCheckpointManager)))
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    read |= set(re.findall(r'\.get\("(async_save)"', inspect.getsource(FSDPCheckpointManager.__init__)))
    assert read == set(CHECKPOINT_KEYS)


SEPARATE = (
    "actor_rollout_ref.hybrid_engine=False",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
)


@pytest.mark.slow  # the corpus of the rollout-pool checks; the fast lane keeps the backend example below
def test_a_rollout_of_its_own_needs_a_pool_and_a_broadcast_engine():
    v = validate_config(cfg(*SEPARATE))
    assert (v.async_plan.separate_rollout, v.async_plan.rollout_world_size, v.async_plan.backend) == (True, 1, "gloo")
    assert v.async_plan.lookahead == 0
    with pytest.raises(ValueError, match=r"hybrid_engine=False needs a rollout pool .*rollout\.nnodes=0 x .* is 0"):
        validate_config(cfg("actor_rollout_ref.hybrid_engine=False"))
    with pytest.raises(ValueError, match=r"checkpoint_engine\.backend=naive copies weights inside one process"):
        validate_config(cfg(*SEPARATE[:2]))
    with pytest.raises(ValueError, match=r"checkpoint_engine\.backend=hccl: Ascend NPU .* not available"):
        validate_config(cfg(*SEPARATE[:2], "actor_rollout_ref.rollout.checkpoint_engine.backend=hccl"))
    with pytest.raises(ValueError, match=r"engine_kwargs\.gloo: \['group_name'\] are not read .* \['timeout_s'\]"):
        validate_config(cfg(*SEPARATE, "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.gloo.group_name=x"))
    with pytest.raises(
        ValueError, match=r"trainer\.role_pools\.rollout: .* use actor_rollout_ref\.hybrid_engine=False"
    ):
        validate_config(cfg("trainer.role_pools={rollout: [1]}"))


def test_upstream_gpu_backend_names_run_as_the_device_broadcast(caplog):
    with caplog.at_level(logging.WARNING):
        v = validate_config(cfg(*SEPARATE[:2], "actor_rollout_ref.rollout.checkpoint_engine.backend=mooncake"))
    assert v.async_plan.backend == "gloo"
    assert any("backend=mooncake runs here as the gloo broadcast engine" in r.getMessage() for r in caplog.records)


def test_separate_async_needs_a_rollout_of_its_own():
    with pytest.raises(ValueError, match=r"trainer_mode=separate_async needs .*hybrid_engine=False \(got True\)"):
        validate_config(cfg("trainer.v1.trainer_mode=separate_async"))


@pytest.mark.slow  # the corpus of the trainer.v1 checks
def test_separate_async_is_checked_as_upstream_checks_it():
    base = (*SEPARATE, "trainer.v1.trainer_mode=separate_async")
    # upstream: train_batch_size == parameter_sync_step x ppo_mini_batch_size (4 x 32 here)
    with pytest.raises(ValueError, match=r"train_batch_size=32 must equal .*parameter_sync_step=4 x .*=32 \(= 128\)"):
        validate_config(cfg(*base))
    v = validate_config(cfg(*base, "trainer.v1.separate_async.parameter_sync_step=1"))
    assert (v.async_plan.lookahead, v.async_plan.max_staleness) == (1, 7)
    with pytest.raises(ValueError, match=r"num_warmup_batches=1 .*drop every batch from step 2 on would be evicted"):
        validate_config(
            cfg(
                *base,
                "trainer.v1.separate_async.parameter_sync_step=1",
                "trainer.v1.sampler.max_off_policy_threshold=1",
            )
        )
    v = validate_config(
        cfg(
            *base,
            "trainer.v1.separate_async.parameter_sync_step=1",
            "trainer.v1.sampler.max_off_policy_threshold=1",
            "trainer.v1.sampler.max_off_policy_strategy=wait",
        )
    )
    assert (v.async_plan.lookahead, v.async_plan.max_staleness) == (0, 0)
    ahead = (*base, "trainer.v1.separate_async.parameter_sync_step=1")
    for extra, words in (
        ("algorithm.filter_groups.enable=True", r"filter_groups\.enable=True with batches generated ahead"),
        ("algorithm.adv_estimator=remax", r"adv_estimator=remax with batches generated ahead .* greedy baseline"),
        ("trainer.save_freq=5", r"save_freq=5 with batches generated ahead .* batches in flight are not available"),
    ):
        with pytest.raises(ValueError, match=words):
            validate_config(cfg(*ahead, extra))
    with pytest.raises(ValueError, match=r"max_off_policy_threshold=0 must be an integer greater than 0"):
        validate_config(cfg("trainer.v1.sampler.max_off_policy_threshold=0"))
    with pytest.raises(ValueError, match=r"max_off_policy_strategy='keep' .*drop.*wait"):
        validate_config(cfg("trainer.v1.sampler.max_off_policy_strategy=keep"))
    with pytest.raises(
        ValueError, match=r"trainer_mode=colocate_async: the colocated asynchronous trainer .* not available"
    ):
        validate_config(cfg("trainer.v1.trainer_mode=colocate_async"))


def test_reward_kwargs_are_checked_against_the_function_and_the_manager(tmp_path):
    f = tmp_path / "reward_for_kwargs_test.py"
    f.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):\n    return 0.0\n"
    )
    validate_config(cfg(f"custom_reward_function.path={f}", "+custom_reward_function.reward_kwargs.scale=2"))
    with pytest.raises(
        ValueError,
        match=r"custom_reward_function\.reward_kwargs\.sclae: compute_score\(\) .* accepted keys: \['scale'\]",
    ):
        validate_config(cfg(f"custom_reward_function.path={f}", "+custom_reward_function.reward_kwargs.sclae=2"))
    with pytest.raises(
        ValueError, match=r"custom_reward_function\.reward_kwargs\.x: the shipped default_compute_score reads no"
    ):
        validate_config(cfg("+custom_reward_function.reward_kwargs.x=1"))
    with pytest.raises(ValueError, match=r"reward\.reward_kwargs\.overlong: .*'naive'.* does not accept"):
        validate_config(cfg("+reward_model.reward_kwargs.overlong=1"))
    with pytest.raises(AttributeError, match=r"custom_reward_function\.name='nope'.*defines no 'nope'"):
        validate_config(cfg(f"custom_reward_function.path={f}", "custom_reward_function.name=nope"))


def test_resume_path_is_checked_before_ray(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"trainer\.resume_from_path='/no/such/global_step_2' does not exist"):
        validate_config(cfg("trainer.resume_mode=resume_path", "trainer.resume_from_path=/no/such/global_step_2"))
    step = tmp_path / "global_step_2"
    step.mkdir()
    with pytest.raises(FileNotFoundError, match=r"is not a complete checkpoint \(no trainer_state\.pt\)"):
        validate_config(cfg("trainer.resume_mode=resume_path", f"trainer.resume_from_path={step}"))
