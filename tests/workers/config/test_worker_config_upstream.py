"""Upstream main's worker config classes: FSDPOptimizerConfig, the Mcore* classes (validate, and
are refused by the workers), ActorConfig's upstream fields and checks, the config-group yaml
files under verl/trainer/config/{actor,engine,optim}/ (composed with Hydra, equal to
ppo_trainer.yaml's values)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import (
    ActorConfig,
    FSDPActorConfig,
    FSDPEngineConfig,
    FSDPOptimizerConfig,
    McoreActorConfig,
    McoreEngineConfig,
    McoreOptimizerConfig,
    OptimizerConfig,
)
from verl.workers.config.megatron import refuse_megatron

CONFIG = Path(__file__).resolve().parents[3] / "verl" / "trainer" / "config"


def test_mcore_configs_validate():
    assert McoreEngineConfig().sequence_parallel is False  # no tensor parallelism: nothing to split
    assert McoreEngineConfig(tensor_model_parallel_size=2).sequence_parallel is True
    with pytest.raises(ValueError, match="megatron.pipeline_model_parallel_size"):
        McoreEngineConfig(pipeline_model_parallel_size=0)
    with pytest.raises(ValueError, match="megatron.dtype='fp32'"):
        McoreEngineConfig(dtype="fp32")
    assert McoreOptimizerConfig(lr=0.1).optimizer == "adam" and McoreOptimizerConfig().muon_num_ns_steps == 5
    actor = McoreActorConfig(ppo_micro_batch_size_per_gpu=2)
    assert isinstance(actor, ActorConfig) and actor.strategy == "megatron" and actor.engine is actor.megatron
    with pytest.raises(ValueError, match="strategy='megatron'"):
        ActorConfig(strategy="megatron")


@pytest.mark.parametrize(
    "section",
    [McoreActorConfig(), McoreEngineConfig(), McoreOptimizerConfig(), {"strategy": "megatron"}],
    ids=["actor", "engine", "optim", "dict"],
)
def test_megatron_configs_are_refused_by_the_workers(section):
    with pytest.raises(NotImplementedError, match="^Megatron is not available"):
        refuse_megatron(section)
    refuse_megatron(ActorConfig())  # FSDP passes


def test_a_worker_built_from_a_megatron_actor_fails_first():
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    with pytest.raises(NotImplementedError, match="Megatron is not available"):
        ActorRolloutRefWorker(config={"actor": McoreActorConfig()}, role="actor")


def test_fsdp_optimizer_config_fields_and_refusals():
    cfg = FSDPOptimizerConfig(lr=0.1, warmup_style="cosine")
    assert cfg.lr_scheduler_type == "cosine" and cfg.min_lr_ratio is None and isinstance(cfg, OptimizerConfig)
    assert (cfg.optimizer, cfg.optimizer_impl, cfg.clip_grad, cfg.zero_indexed_step) == (
        "AdamW",
        "torch.optim",
        1.0,
        True,
    )
    for kwargs, match in (
        ({"warmup_style": "linear"}, "optim.warmup_style='linear'"),
        ({"optimizer": "SGD"}, "optim.optimizer='SGD'"),
        ({"clip_grad": 0.5}, "grad_clip"),
        ({"zero_indexed_step": False}, "zero_indexed_step"),
        ({"override_optimizer_config": {"x": 1}}, "override_optimizer_config"),
    ):
        with pytest.raises(ValueError, match=match):
            FSDPOptimizerConfig(**kwargs)


def test_actor_config_upstream_fields_and_checks():
    with pytest.raises(ValueError, match="freeze_vision_tower=True is not available"):
        ActorConfig(freeze_vision_tower=True)
    with pytest.raises(ValueError, match="qat.enable=True is not available"):
        ActorConfig(qat={"enable": True, "mode": "w4a16"})
    with pytest.raises(ValueError, match="^Invalid loss_agg_mode"):
        ActorConfig(loss_agg_mode="nope")
    with pytest.raises(ValueError, match="You have set both"):
        ActorConfig(use_dynamic_bsz=False, ppo_micro_batch_size=4, ppo_micro_batch_size_per_gpu=2)
    with pytest.raises(ValueError, match="ppo_infer_micro_batch_size_per_gpu"):
        ActorConfig(ppo_infer_micro_batch_size_per_gpu=0)
    cfg = ActorConfig(use_dynamic_bsz=False, ppo_mini_batch_size=256, ppo_micro_batch_size=8)
    with pytest.raises(ValueError, match="train_batch_size \\(128\\) must be >="):
        cfg.validate(n_gpus=8, train_batch_size=128)
    with pytest.raises(ValueError, match="must be >= n_gpus \\(16\\)"):
        cfg.validate(n_gpus=16, train_batch_size=512)
    cfg.validate(n_gpus=8, train_batch_size=256)
    assert FSDPActorConfig is ActorConfig


def test_ppo_infer_sizes_drive_the_actor_log_prob_pass():
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    rollout = SimpleNamespace(
        log_prob_micro_batch_size_per_gpu=4, log_prob_use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=1000
    )
    worker = SimpleNamespace(actor_config=ActorConfig(), rollout_config=rollout)
    micro = ActorRolloutRefWorker._actor_log_prob_micro(worker)
    assert (micro.log_prob_micro_batch_size_per_gpu, micro.log_prob_max_token_len_per_gpu) == (4, 1000)
    worker.actor_config = ActorConfig(ppo_infer_micro_batch_size_per_gpu=2, ppo_infer_max_token_len_per_gpu=64)
    micro = ActorRolloutRefWorker._actor_log_prob_micro(worker)
    assert (micro.log_prob_micro_batch_size_per_gpu, micro.log_prob_max_token_len_per_gpu) == (2, 64)
    assert micro.log_prob_use_dynamic_bsz is True


def test_nested_target_selects_a_subclass_and_unknown_targets_are_ignored():
    cfg = omega_conf_to_dataclass(
        {"optim": {"_target_": "verl.workers.config.FSDPOptimizerConfig", "lr": 0.1}}, ActorConfig
    )
    assert type(cfg.optim) is FSDPOptimizerConfig
    cfg = omega_conf_to_dataclass({"optim": {"_target_": "elsewhere.NoSuchConfig", "lr": 0.1}}, ActorConfig)
    assert type(cfg.optim) is OptimizerConfig  # as before: the field's own type


def _compose(name: str, overrides=()):
    with initialize_config_dir(config_dir=str(CONFIG / "actor"), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


@pytest.mark.parametrize(
    ("name", "cls", "optim_cls"),
    [
        ("actor", ActorConfig, OptimizerConfig),
        ("dp_actor", ActorConfig, FSDPOptimizerConfig),
        ("megatron_actor", McoreActorConfig, McoreOptimizerConfig),
    ],
)
def test_config_group_yamls_compose_into_the_classes(name, cls, optim_cls):
    cfg = omega_conf_to_dataclass(_compose(name, ["ppo_micro_batch_size_per_gpu=8"]))
    assert type(cfg) is cls and type(cfg.optim) is optim_cls and cfg.ppo_micro_batch_size_per_gpu == 8
    assert cfg.optim.lr == 1e-6  # actor.yaml's lr wins over the optimizer group's


def test_config_group_yamls_hold_ppo_trainer_yaml_values():
    trainer = OmegaConf.load(CONFIG / "ppo_trainer.yaml").actor_rollout_ref.actor
    composed = _compose("dp_actor")
    for section, keys in (
        (None, [f.name for f in dataclasses.fields(ActorConfig)]),
        ("optim", [f.name for f in dataclasses.fields(FSDPOptimizerConfig)]),
        ("fsdp_config", [f.name for f in dataclasses.fields(FSDPEngineConfig)]),
    ):
        ours = composed if section is None else composed[section]
        theirs = trainer if section is None else trainer[section]
        shared = [k for k in keys if k in ours and k in theirs and not OmegaConf.is_config(ours[k])]
        assert len(shared) >= 5, section
        for key in shared:
            a, b = OmegaConf.to_container(ours, resolve=False)[key], OmegaConf.to_container(theirs, resolve=False)[key]
            assert a == b, f"{section or 'actor'}.{key}: group yaml {a!r} != ppo_trainer.yaml {b!r}"


def test_rollout_group_yaml_builds_the_rollout_config_with_ppo_trainer_values():
    from verl.workers.config import RolloutConfig

    group = OmegaConf.load(CONFIG / "rollout" / "rollout.yaml")
    trainer = OmegaConf.to_container(OmegaConf.load(CONFIG / "ppo_trainer.yaml").actor_rollout_ref.rollout)
    ours = OmegaConf.to_container(group)
    ours.pop("_target_")

    def same(a: dict, b: dict, where: str) -> None:
        for key, value in a.items():
            assert key in b, f"{where}{key} is not in ppo_trainer.yaml's rollout section"
            if isinstance(value, dict):
                same(value, b[key], f"{where}{key}.")
            else:
                assert value == b[key], f"{where}{key}: group yaml {value!r} != ppo_trainer.yaml {b[key]!r}"

    same(ours, trainer, "rollout.")
    assert group.multi_turn.function_tool_path is None
    built = omega_conf_to_dataclass(OmegaConf.merge(group, {"prompt_length": 64, "response_length": 32}))
    assert type(built) is RolloutConfig and built.multi_turn.format == "hermes" and built.response_length == 32
