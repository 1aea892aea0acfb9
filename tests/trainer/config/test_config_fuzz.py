"""A fuzz corpus of bad single-key (and a few two-key) mutations of the default config.

Every mutation goes through the real entry path up to the point where Ray would start:
`load_default_config(overrides)` (Hydra composition, where override typos are caught) and then
`run_ppo(config)` with `main_ppo._init_ray` replaced by a sentinel. A mutation passes when it
raises before the sentinel is reached, Ray is not initialised, and the message names the key and
says what is accepted (checked per kind of mutation with the `ACCEPTED` patterns below).

The valid mutations at the end must reach the sentinel: validation must not refuse what works.
"""

from __future__ import annotations

import re

import pytest

from verl.trainer import main_ppo

BAD_REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
KW_REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n    return 0.0\n"
NAMED_REWARD = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):\n    return 0.0 * scale\n"
)

A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"
M = "actor_rollout_ref.model"

# what the message must contain besides the key, per kind of mutation
# a run with a model of its own gets upstream's defaults, which leave the micro-batch size to the user
REAL_MODEL = (
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "critic.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.n=4",
    "trainer.logger=[console]",
)

ACCEPTED = {
    # a key of a feature this verl lacks names the one accepted value instead: "(available: 1)"
    "type": r"expected (a|an|one of)|\(available: ",
    "enum": r"expected one of|registered|accepted:|available",
    "range": r"out of range|expected a value|must be|use |needs",
    "typo": r"did you mean|accepted keys",
    "combo": r"set |use |needs|must|cannot|not supported|refused|never|leave ",
    "file": r"no such file|not found|config\.json|does not exist|cannot be fetched|not a local",
    "unread": r"accepted|accepts|did you mean|reads|expected",
}

# (overrides, key the message must name (default: the first override's key), kind)
BAD: list[tuple[tuple[str, ...], str | None, str]] = [
    # ---- scalar types: data
    (("data.train_batch_size=abc",), None, "type"),
    (("data.train_batch_size=1.5",), None, "type"),
    (("data.train_batch_size=[32]",), None, "type"),
    (("data.max_prompt_length=1.5",), None, "type"),
    (("data.max_prompt_length=abc",), None, "type"),
    (("data.max_response_length=",), None, "type"),
    (("data.shuffle=maybe",), None, "type"),
    (("data.shuffle=Flase",), None, "type"),
    (("data.shuffle=1.5",), None, "type"),
    (("data.validation_shuffle=sometimes",), None, "type"),
    (("data.seed=abc",), None, "type"),
    (("data.filter_overlong_prompts=yes",), None, "type"),
    (("data.return_raw_chat=nope",), None, "type"),
    (("data.dataloader_num_workers=two",), None, "type"),
    (("data.val_batch_size=abc",), None, "type"),
    (("data.prompt_key=[a,b]",), None, "type"),
    (("data.truncation=[left]",), None, "type"),
    (("data.custom_cls={a:1}",), None, "typo"),
    # ---- scalar types: actor
    ((f"{A}.ppo_mini_batch_size=abc",), None, "type"),
    ((f"{A}.ppo_mini_batch_size=2.5",), None, "type"),
    ((f"{A}.ppo_micro_batch_size_per_gpu=x",), None, "type"),
    ((f"{A}.use_dynamic_bsz=sometimes",), None, "type"),
    ((f"{A}.ppo_epochs=1.5",), None, "type"),
    ((f"{A}.ppo_max_token_len_per_gpu=big",), None, "type"),
    ((f"{A}.clip_ratio={{low:0.2}}",), None, "type"),
    ((f"{A}.clip_ratio=abc",), None, "type"),
    ((f"{A}.clip_ratio_low=abc",), None, "type"),
    ((f"{A}.clip_ratio_c=[3]",), None, "type"),
    ((f"{A}.entropy_coeff=[0.1]",), None, "type"),
    ((f"{A}.use_kl_loss=maybe",), None, "type"),
    ((f"{A}.kl_loss_coef=abc",), None, "type"),
    ((f"{A}.grad_clip=abc",), None, "type"),
    ((f"{A}.shuffle=perhaps",), None, "type"),
    ((f"{A}.loss_scale_factor=big",), None, "type"),
    ((f"{A}.optim.lr=fast",), None, "type"),
    ((f"{A}.optim.lr=[1,2]",), None, "type"),
    ((f"{A}.optim.betas=0.9",), None, "type"),
    ((f"{A}.optim.betas=[a,b]",), None, "type"),
    ((f"{A}.optim.weight_decay=abc",), None, "type"),
    ((f"{A}.optim.lr_warmup_steps=1.5",), None, "type"),
    ((f"{A}.optim.eps=tiny",), None, "type"),
    ((f"{A}.policy_loss.clip_cov_ratio=abc",), None, "type"),
    ((f"{A}.policy_loss.pg_use_ratio=maybe",), None, "type"),
    ((f"{A}.fsdp_config.param_offload=maybe",), None, "type"),
    ((f"{A}.fsdp_config.fsdp_size=abc",), None, "type"),
    ((f"{A}.ulysses_sequence_parallel_size=abc",), None, "type"),
    ((f"{A}.checkpoint=abc",), None, "type"),
    # ---- scalar types: rollout, ref, model
    ((f"{R}.n=two",), None, "type"),
    ((f"{R}.n=1.5",), None, "type"),
    ((f"{R}.temperature=hot",), None, "type"),
    ((f"{R}.top_p=abc",), None, "type"),
    ((f"{R}.top_k=1.5",), None, "type"),
    ((f"{R}.do_sample=maybe",), None, "type"),
    ((f"{R}.calculate_log_probs=sometimes",), None, "type"),
    ((f"{R}.micro_batch_size=abc",), None, "type"),
    ((f"{R}.gpu_memory_utilization=lots",), None, "type"),
    ((f"{R}.log_prob_max_token_len_per_gpu=abc",), None, "type"),
    ((f"{R}.val_kwargs.temperature=cold",), None, "type"),
    ((f"{R}.val_kwargs.n=two",), None, "type"),
    ((f"{R}.val_kwargs.do_sample=maybe",), None, "type"),
    ((f"{R}.engine_kwargs=abc",), None, "type"),
    (("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=abc",), None, "type"),
    (("actor_rollout_ref.ref.log_prob_use_dynamic_bsz=maybe",), None, "type"),
    (("actor_rollout_ref.ref.fsdp_config.param_offload=maybe",), None, "type"),
    ((f"{M}.enable_gradient_checkpointing=maybe",), None, "type"),
    ((f"{M}.use_remove_padding=sometimes",), None, "type"),
    ((f"{M}.trust_remote_code=perhaps",), None, "type"),
    ((f"{M}.override_config=abc",), None, "type"),
    (("actor_rollout_ref.hybrid_engine=maybe",), None, "type"),
    # ---- scalar types: critic, reward model, algorithm, trainer, ray
    (("critic.enable=maybe",), None, "type"),
    (("critic.optim.lr=fast",), None, "type"),
    (("critic.ppo_max_token_len_per_gpu=abc",), None, "type"),
    (("critic.cliprange_value=abc",), None, "type"),
    (("critic.grad_clip=[1]",), None, "type"),
    (("reward_model.enable=maybe",), None, "type"),
    (("reward_model.micro_batch_size_per_gpu=abc",), None, "type"),
    (("custom_reward_function.name=[a]",), None, "type"),
    (("algorithm.gamma=one",), None, "type"),
    (("algorithm.lam=abc",), None, "enum"),
    (("algorithm.use_kl_in_reward=maybe",), None, "type"),
    (("algorithm.norm_adv_by_std_in_grpo=sometimes",), None, "type"),
    (("algorithm.kl_ctrl.kl_coef=abc",), None, "type"),
    (("algorithm.kl_ctrl.horizon=1.5",), None, "type"),
    (("algorithm.filter_groups.enable=maybe",), None, "type"),
    (("algorithm.filter_groups.max_num_gen_batches=abc",), None, "type"),
    (("algorithm.rollout_correction.rollout_is_threshold=abc",), None, "type"),
    (("trainer.nnodes=",), None, "type"),
    (("trainer.nnodes=abc",), None, "type"),
    (("trainer.n_gpus_per_node=1.5",), None, "type"),
    (("trainer.total_epochs=[1]",), None, "type"),
    (("trainer.save_freq=often",), None, "type"),
    (("trainer.test_freq=sometimes",), None, "type"),
    (("trainer.val_before_train=maybe",), None, "type"),
    (("trainer.critic_warmup=abc",), None, "type"),
    (("trainer.seed=abc",), None, "type"),
    (("trainer.balance_batch=maybe",), None, "type"),
    (("trainer.time_budget_s=soon",), None, "type"),
    (("trainer.total_training_steps=1.5",), None, "type"),
    (("trainer.plot=sometimes",), None, "type"),
    (("ray_kwargs.ray_init=abc",), None, "type"),
    (("++ray_kwargs.timeline_json_file=[a]",), None, "type"),
    # ---- enums and registries
    (("data.truncation=sideways",), None, "enum"),
    ((f"{A}.loss_agg_mode=mean",), None, "enum"),
    ((f"{A}.strategy=megatron",), None, "enum"),
    ((f"{A}.kl_loss_type=kl9",), None, "enum"),
    ((f"{A}.optim.lr_scheduler_type=linearr",), None, "enum"),
    ((f"{A}.policy_loss.loss_mode=vanila",), None, "enum"),
    ((f"{A}.fsdp_config.model_dtype=fp12",), None, "enum"),
    ((f"{R}.name=vllmm",), None, "enum"),
    ((f"{R}.dtype=float12",), None, "enum"),
    ((f"{R}.mode=asyncc",), None, "enum"),
    (("reward_model.reward_manager=naiv",), None, "enum"),
    (("algorithm.adv_estimator=grpoo",), None, "enum"),
    (("algorithm.kl_penalty=kll",), None, "enum"),
    (("algorithm.kl_ctrl.type=pid",), None, "enum"),
    (("algorithm.gae_timestep_unit=word",), None, "enum"),
    (("algorithm.rollout_correction.rollout_is=tokenn",), None, "enum"),
    (("trainer.resume_mode=resumee",), None, "enum"),
    (("trainer.device=tpu",), None, "enum"),
    (("trainer.logger=[consol]",), "trainer.logger", "enum"),
    (("trainer.role_pools={actr: [1]}",), "trainer.role_pools", "enum"),
    # ---- ranges
    (("algorithm.gamma=2.0",), None, "range"),
    (("trainer.n_gpus_per_node=0",), None, "range"),
    (("trainer.total_epochs=0",), None, "range"),
    (("trainer.max_actor_ckpt_to_keep=0",), None, "range"),
    (("data.train_batch_size=0",), None, "range"),
    ((f"{R}.top_p=1.5",), None, "range"),
    ((f"{A}.clip_ratio_c=0.5",), None, "range"),
    ((f"{A}.optim.lr_warmup_steps_ratio=2.0",), None, "range"),
    (("trainer.role_pools={critic: [0]}",), "trainer.role_pools", "range"),
    # ---- typos at every depth (Hydra override of a key that does not exist)
    (("data.train_batch=32",), None, "typo"),
    ((f"{A}.ppo_mini_batchsize=16",), None, "typo"),
    (("trainer.total_epoch=1",), None, "typo"),
    ((f"{R}.temprature=1.0",), None, "typo"),
    ((f"{A}.optim.lrr=1e-6",), None, "typo"),
    (("algorithm.kl_ctrl.kl_cof=0.1",), None, "typo"),
    ((f"{R}.val_kwargs.top_pp=1",), None, "typo"),
    (("critic.optim.betas1=1",), None, "typo"),
    (("actor_rollout_ref.modle.path=x",), None, "typo"),
    (("trainerr.nnodes=1",), None, "typo"),
    ((f"{A}.fsdp_config.mixed_precision.param_dtyp=bf16",), None, "typo"),
    # appended with + (a key nothing reads)
    (("+trainer.totl_epochs=3",), None, "typo"),
    ((f"+{A}.optim.lr_warmup=1",), None, "typo"),
    (("+algorithm.filter_groups.metrc=acc",), None, "typo"),
    (("+data.custom_cls.nam=x",), None, "typo"),
    ((f"+{R}.engine_kwargs.hf.seperate_copy=true",), f"{R}.engine_kwargs.hf.seperate_copy", "unread"),
    ((f"+{R}.engine_kwargs.hf.anything=1",), f"{R}.engine_kwargs.hf.anything", "unread"),
    ((f"+{A}.checkpoint.save_contens=[model]",), f"{A}.checkpoint.save_contens", "unread"),
    ((f"{A}.checkpoint.save_contents=[modle]",), f"{A}.checkpoint.save_contents", "enum"),
    (
        ("custom_reward_function.path={bad_reward}", "+custom_reward_function.reward_kwargs.scale=2"),
        "custom_reward_function.reward_kwargs.scale",
        "unread",
    ),
    # ---- contradictory combinations
    (("algorithm.adv_estimator=grpo", f"{R}.n=1"), f"{R}.n", "combo"),
    (("critic.enable=False",), "critic.enable", "combo"),
    (("algorithm.adv_estimator=grpo", "trainer.critic_warmup=2"), "trainer.critic_warmup", "combo"),
    ((f"{R}.response_length=16",), None, "combo"),
    (
        ("algorithm.rollout_correction.rollout_is=token", f"{R}.calculate_log_probs=False"),
        f"{R}.calculate_log_probs",
        "combo",
    ),
    (("algorithm.kl_penalty=full", "algorithm.use_kl_in_reward=True"), "algorithm.kl_penalty", "combo"),
    (("algorithm.adv_estimator=remax", f"{R}.do_sample=False"), f"{R}.do_sample", "combo"),
    ((f"{R}.val_kwargs.do_sample=True",), f"{R}.val_kwargs.temperature", "combo"),
    ((f"{R}.temperature=0",), f"{R}.temperature", "combo"),
    ((f"{A}.ppo_mini_batch_size=12",), f"{A}.ppo_mini_batch_size", "combo"),
    (("trainer.n_gpus_per_node=3",), "data.train_batch_size", "combo"),
    ((f"{A}.use_dynamic_bsz=False",), f"{A}.ppo_micro_batch_size_per_gpu", "combo"),
    (("actor_rollout_ref.hybrid_engine=False",), "actor_rollout_ref.hybrid_engine", "combo"),
    (("trainer.role_pools={rollout: [1]}",), "trainer.role_pools", "combo"),
    (("reward_model.enable=True",), "reward_model.model.path", "combo"),
    (("trainer.resume_mode=resume_path",), "trainer.resume_from_path", "combo"),
    (
        ("algorithm.filter_groups.enable=True", f"{R}.n=1", "algorithm.adv_estimator=reinforce_plus_plus"),
        "algorithm.filter_groups.enable",
        "combo",
    ),
    # ---- missing files and models
    (("data.train_files=/nonexistent/train.parquet",), None, "file"),
    (("data.val_files=[/nonexistent/val.parquet]",), None, "file"),
    (("custom_reward_function.path=/nonexistent/reward.py",), None, "file"),
    ((f"{M}.path={{empty_dir}}", *REAL_MODEL), f"{M}.path", "file"),
    ((f"{M}.path=some-org/some-model", *REAL_MODEL), f"{M}.path", "file"),
    ((f"{M}.path=/nonexistent/model", *REAL_MODEL), None, "file"),
    ((f"{M}.tokenizer_path=/nonexistent/tok",), None, "file"),
    (
        ("trainer.resume_mode=resume_path", "trainer.resume_from_path=/nonexistent/global_step_3"),
        "trainer.resume_from_path",
        "file",
    ),
    (("trainer.external_modules=[/nonexistent/mod.py]",), "trainer.external_modules", "file"),
    (("data.custom_cls.path=/nonexistent/ds.py", "data.custom_cls.name=X"), "data.custom_cls.path", "file"),
    (("reward_model.enable=True", "reward_model.model.path=/nonexistent/rm"), "reward_model.model.path", "file"),
]

GOOD: list[tuple[str, ...]] = [
    (),
    ("algorithm.adv_estimator=grpo",),
    ("data.shuffle=false",),
    ("data.shuffle=True",),
    (f"{A}.optim.lr=1e-6",),
    (f"{A}.optim.lr=1",),  # an int where a float is expected is fine
    (f"{A}.optim.betas=[0.9,0.95]",),
    ("trainer.experiment_name=2024",),  # a number where a string is expected is fine
    ("trainer.logger=console",),
    ("trainer.nnodes=1",),
    ("data.max_prompt_length=32", f"{R}.prompt_length=32"),
    (f"{R}.name=hf", f"{R}.dtype=float16"),
    (f"+{R}.engine_kwargs.hf.separate_copy=true",),
    (f"+{R}.engine_kwargs.hf.dtype=fp32",),
    (f"{A}.checkpoint.save_contents=[model]",),
    ("custom_reward_function.path={kw_reward}", "+custom_reward_function.reward_kwargs.anything=2"),
    ("custom_reward_function.path={named_reward}", "+custom_reward_function.reward_kwargs.scale=2"),
    ("trainer.resume_mode=resume_path", "trainer.resume_from_path={ckpt_dir}"),
    ("trainer.role_pools={critic: [1]}",),
]


class _ReachedRay(Exception):
    """Raised by the stand-in of `main_ppo._init_ray`: validation let the config through."""


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    (root / "empty_model").mkdir()
    ckpt = root / "global_step_3"
    ckpt.mkdir()
    (ckpt / "trainer_state.pt").write_bytes(b"")  # only its presence is checked before Ray
    out = {"empty_dir": str(root / "empty_model"), "ckpt_dir": str(ckpt)}
    for name, text in (("bad_reward", BAD_REWARD), ("kw_reward", KW_REWARD), ("named_reward", NAMED_REWARD)):
        f = root / f"{name}.py"
        f.write_text(text)
        out[name] = str(f)
    return out


@pytest.fixture
def no_ray(monkeypatch):
    import ray

    # the stand-in replaces the one place Ray starts (or is joined, when an earlier test of the
    # session left it running): a config that gets there raises _ReachedRay
    ray_was_running = ray.is_initialized()

    def stand_in(*_args, **_kwargs):
        raise _ReachedRay

    monkeypatch.setattr(main_ppo, "_init_ray", stand_in)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub-id mutation must not depend on this machine's network
    yield ray
    assert ray.is_initialized() == ray_was_running  # the check itself never started Ray


def _run_until_ray(overrides: tuple[str, ...], paths: dict) -> None:
    for name, value in paths.items():
        overrides = tuple(o.replace("{" + name + "}", value) for o in overrides)
    config = main_ppo.load_default_config(overrides)
    main_ppo.run_ppo(config)


def _key_of(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def _ids(entries):
    return ["|".join(e[0]) or "default" for e in entries]


def test_corpus_is_large_enough():
    assert len(BAD) >= 120
    assert len({e[0] for e in BAD}) == len(BAD), "duplicate mutations"


def _outcome(entry, paths) -> str | None:
    """None when the mutation failed properly before Ray, else what went wrong."""
    overrides, key, kind = entry
    key = key or _key_of(overrides[0])
    try:
        _run_until_ray(overrides, paths)
    except _ReachedRay:
        return "accepted: reached ray.init"
    except Exception as exc:  # noqa: BLE001 - any exception type is fine, the message is what is checked
        msg = str(exc)
        if key not in msg:
            return f"message does not name {key}: {type(exc).__name__}: {msg[:300]}"
        if not re.search(ACCEPTED[kind], msg):
            return f"message does not say what is accepted ({ACCEPTED[kind]}): {type(exc).__name__}: {msg[:300]}"
        return None
    return "no error"


@pytest.mark.slow
@pytest.mark.parametrize("entry", BAD, ids=_ids(BAD))
def test_bad_mutation_fails_before_ray_naming_key_and_accepted(entry, paths, no_ray):
    problem = _outcome(entry, paths)
    assert problem is None, problem


@pytest.mark.slow
@pytest.mark.parametrize("overrides", GOOD, ids=["|".join(g) or "default" for g in GOOD])
def test_valid_mutation_reaches_ray(overrides, paths, no_ray):
    with pytest.raises(_ReachedRay):
        _run_until_ray(overrides, paths)
