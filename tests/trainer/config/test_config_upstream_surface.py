"""Upstream verl's config surface: every upstream key is accepted, each with one behaviour here
(implemented / no effect, logged / not available, refused before Ray), older spellings are
aliases, `+key=value` appends work, and the embedded toy job keeps its settings via a preset."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from verl.trainer.config import upstream_keys as uk
from verl.trainer.main_ppo import load_default_config
from verl.trainer.ppo.utils import validate_config

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
UPSTREAM_KEYS = [
    line.strip()
    for line in (FIXTURES / "upstream_ppo_trainer_keys.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]


@pytest.fixture(autouse=True)
def _hub_ids_resolve(monkeypatch):
    """`real()` names a hub id: treat the hub as reachable (validate_config refuses ids it cannot fetch)."""
    import verl.trainer.ppo.source_checks as source_checks

    monkeypatch.setattr(source_checks, "_offline_reason", lambda repo_id: None)


def yaml_tree() -> dict:
    return OmegaConf.to_container(OmegaConf.load(uk.YAML_PATH), resolve=False)


def real(*overrides: str) -> list[str]:
    """A run with a local model: upstream's defaults, plus what upstream's examples always set."""
    return [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "trainer.logger=[console]",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
        *overrides,
    ]


# ----------------------------------------------------------------------------- key set
def test_yaml_holds_every_upstream_key():
    tree = yaml_tree()
    missing = []
    for key in UPSTREAM_KEYS:
        node, parts = tree, key.split(".")
        for i, part in enumerate(parts):
            if isinstance(node, str) and node.startswith("${"):
                break  # an interpolated subtree (e.g. rollout.mtp follows model.mtp)
            if not isinstance(node, dict) or part not in node:
                missing.append(key)
                break
            node = node[part]
    assert len(UPSTREAM_KEYS) > 600
    assert not missing, f"upstream keys missing from ppo_trainer.yaml: {missing[:20]} ({len(missing)})"


def test_every_yaml_key_has_one_decided_behaviour():
    """Each yaml key is implemented by a dataclass field, or has a (b)/(c) rule, or is an alias,
    or is a legacy reward key moved into upstream's `reward` section."""
    from verl.trainer.config.reward import LEGACY_REWARD_KEYS

    held = uk.dataclass_keys() | uk.KEPT_KEYS | {old for old, _ in LEGACY_REWARD_KEYS}
    dict_fields = [h for h in held if uk._is_dict_field(h)]
    reward_mapped = {
        "reward.custom_reward_function.path",
        "reward.custom_reward_function.name",
        "reward.reward_manager.source",
        "reward.reward_manager.name",
        "reward.reward_model.enable",
        "reward.reward_model.model_path",
    }
    undecided = []
    for key, _ in uk._leaves({k: v for k, v in yaml_tree().items() if k != "hydra"}):
        if uk.rule_for(key) or key in held or key in reward_mapped:
            continue
        if any(key.startswith(h + ".") for h in dict_fields):
            continue
        if any(key == a.old or key.startswith(a.old + ".") for a in uk.ALIASES):
            continue
        undecided.append(key)
    assert not undecided, undecided


def test_upstream_config_names_compose():
    assert load_default_config(["algorithm.adv_estimator=grpo"], config_name="ppo_trainer")
    cfg = load_default_config([], config_name="ppo_megatron_trainer")
    with pytest.raises(
        ValueError,
        match=r"^actor_rollout_ref\.actor\.strategy=megatron: Megatron-LM training is not "
        r"available in this verl \(available: fsdp, fsdp2",
    ):
        validate_config(cfg)


# ----------------------------------------------------------------------------- (b) and (c)
def test_not_available_feature_fails_with_the_key_value_and_what_is_available():
    with pytest.raises(
        ValueError,
        match=r"^actor_rollout_ref\.rollout\.name=sglang: this rollout engine \(SGLang, "
        r"TensorRT-LLM\) is not available in this verl \(available: hf, vllm\)",
    ):
        validate_config(load_default_config(["actor_rollout_ref.rollout.name=sglang"]))
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.multi_turn\.num_repeat_rollouts=2: repeated"):
        validate_config(load_default_config(["actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=2"]))
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.ulysses_sequence_parallel_size=2: Ulysses"):
        validate_config(load_default_config(["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"]))
    with pytest.raises(ValueError, match=r"data\.image_key=pixels: multimodal"):
        validate_config(load_default_config(["data.image_key=pixels"]))
    # the default value of a (c) key, or a value listed as implemented, passes
    validate_config(
        load_default_config(
            [
                "actor_rollout_ref.rollout.multi_turn.enable=False",
                "actor_rollout_ref.actor.strategy=fsdp2",
                "data.image_key=images",
            ]
        )
    )


def test_refusal_happens_before_ray_starts(monkeypatch):
    import ray

    from verl.trainer.main_ppo import run_ppo

    def no_ray(*a, **k):
        raise AssertionError("ray.init must not be reached")

    monkeypatch.setattr(ray, "init", no_ray)
    with pytest.raises(ValueError, match="TensorRT-LLM"):
        run_ppo(load_default_config(["actor_rollout_ref.rollout.name=trtllm"]))


def test_no_effect_keys_are_logged_once_with_the_reason(caplog):
    uk._logged_b.clear()
    cfg = load_default_config(
        [
            "actor_rollout_ref.model.use_fused_kernels=True",
            "trainer.v1.colocate_async.num_warmup_batches=2",
        ]
    )
    with caplog.at_level(logging.WARNING, logger=uk.__name__):
        validate_config(cfg)
        validate_config(cfg)
    lines = [r.getMessage() for r in caplog.records if "has no effect here" in r.getMessage()]
    assert any(m.startswith("actor_rollout_ref.model.use_fused_kernels=true has no effect here: ") for m in lines)
    assert any("num_warmup_batches=2 has no effect here: used only by trainer_mode=colocate_async" in m for m in lines)
    # actor.use_fused_kernels follows model.use_fused_kernels: logged too, but each key once
    assert len(lines) == len(set(lines)) == 3, lines
    # nothing is logged for a default run
    caplog.clear()
    uk._logged_b.clear()
    with caplog.at_level(logging.WARNING, logger=uk.__name__):
        validate_config(load_default_config(["algorithm.adv_estimator=grpo"]))
    assert not [r for r in caplog.records if "has no effect" in r.getMessage()]


def test_vllm_only_keys_are_logged_with_the_hf_engine(caplog):
    uk._logged_b.clear()
    with caplog.at_level(logging.WARNING, logger=uk.__name__):
        validate_config(load_default_config(["actor_rollout_ref.rollout.gpu_memory_utilization=0.7"]))
    assert any(
        "gpu_memory_utilization=0.7 has no effect here: only the vllm rollout reads it" in r.getMessage()
        for r in caplog.records
    )


def test_reference_has_a_here_column_for_every_kind():
    text = (Path(__file__).resolve().parents[3] / "docs" / "config_reference.md").read_text()
    assert "| key | default | here | meaning |" in text
    assert "| `actor_rollout_ref.rollout.multi_turn.enable` | `false` | implemented |" in text
    assert "| `actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts` | `null` | not available: repeated" in text
    assert "| `actor_rollout_ref.actor.fsdp_config.forward_prefetch` | `false` | no effect: " in text
    assert "| `critic.model.fsdp_config.param_offload` | `null` | alias of `critic.fsdp.param_offload`" in text
    assert "| `data.train_batch_size` | `1024` | implemented |" in text


# ----------------------------------------------------------------------------- aliases
def test_older_spellings_move_to_the_current_key_with_one_warning():
    cfg = load_default_config(
        real(
            "critic.model.fsdp_config.param_offload=True",
            "algorithm.adv_estimator=gae",
            "critic.ppo_micro_batch_size_per_gpu=4",
        )
    )
    with pytest.warns(
        DeprecationWarning, match=r"critic\.model\.fsdp_config is deprecated .*: use critic\.fsdp"
    ) as rec:
        v = validate_config(cfg)
    assert v.critic.fsdp.param_offload is True and v.critic.fsdp_config.param_offload is True
    assert len([w for w in rec if "critic.model.fsdp_config" in str(w.message)]) == 1
    # this project's former spelling (not in the yaml: main_ppo adds the `+`)
    v = validate_config(load_default_config(["critic.fsdp_config.fsdp_size=2"]))
    assert v.critic.fsdp.fsdp_size == 2
    # an alias and its current key set to different values: refused, naming both
    with pytest.raises(
        ValueError, match=r"critic\.model\.fsdp_config\.fsdp_size=4 conflicts with critic\.fsdp\.fsdp_size=2"
    ):
        validate_config(load_default_config(["critic.model.fsdp_config.fsdp_size=4", "critic.fsdp.fsdp_size=2"]))


def test_legacy_reward_model_spellings_and_the_new_reward_section():
    v = validate_config(load_default_config(["reward.reward_manager.name=dapo"]))
    assert v.reward_model.reward_manager == "dapo"
    v = validate_config(load_default_config(["reward_model.reward_manager=batch", "reward.reward_manager.name=dapo"]))
    assert v.reward_model.reward_manager == "batch"  # the legacy key wins when set
    v = validate_config(load_default_config(["reward.custom_reward_function.name=my_score"]))
    assert v.custom_reward_function.name == "my_score"
    cfg = load_default_config(
        real("reward_model.model_path=some/rm", "reward_model.enable=True", "reward_model.use_reward_loop=True")
    )
    with pytest.warns(DeprecationWarning, match=r"reward_model\.model_path is deprecated"):
        v = validate_config(cfg)
    assert v.reward_model.model.path == "some/rm" and v.use_rm
    v = validate_config(
        load_default_config(real("reward.reward_model.enable=True", "reward.reward_model.model_path=other/rm"))
    )
    assert v.reward_model.enable is True and v.reward_model.model.path == "other/rm"


def test_global_micro_batch_sizes_are_divided_by_the_data_parallel_size():
    cfg = load_default_config(
        real(
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
            "actor_rollout_ref.actor.ppo_micro_batch_size=8",
            "trainer.n_gpus_per_node=2",
        )
    )
    with pytest.warns(DeprecationWarning, match=r"actor_rollout_ref\.actor\.ppo_micro_batch_size is deprecated"):
        v = validate_config(cfg)
    assert v.actor.ppo_micro_batch_size_per_gpu == 4


def test_sapo_temperatures_from_either_place():
    v = validate_config(load_default_config(["actor_rollout_ref.actor.tau_pos=1.3"]))
    assert v.actor.policy_loss.tau_pos == 1.3 and v.actor.tau_pos == 1.3
    v = validate_config(
        load_default_config(["actor_rollout_ref.actor.tau_pos=1.3", "+actor_rollout_ref.actor.policy_loss.tau_pos=2.0"])
    )
    assert v.actor.policy_loss.tau_pos == 2.0


# ----------------------------------------------------------------------------- `+` appends
def test_keys_upstream_lacks_are_appendable_with_plus_through_hydra_itself():
    """Plain Hydra compose (no normalisation): `+` works because our yaml does not list the key."""
    overrides = [
        "+actor_rollout_ref.actor.policy_loss.tau_pos=1.5",
        "+actor_rollout_ref.actor.policy_loss.tau_neg=1.2",
        "+actor_rollout_ref.model.torch_dtype=bfloat16",
        "+trainer.time_budget_s=30",
        "++actor_rollout_ref.rollout.n=3",
        "++algorithm.gamma=0.9",
        "+ray_kwargs.ray_init.num_gpus=0",
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    v = validate_config(uk.apply_embedded_preset(cfg, overrides))
    assert (v.actor.policy_loss.tau_pos, v.actor.policy_loss.tau_neg) == (1.5, 1.2)
    assert v.model.torch_dtype == "bfloat16" and v.trainer.time_budget_s == 30
    assert v.rollout.n == 3 and v.algorithm.gamma == 0.9 and v.ray_kwargs.ray_init["num_gpus"] == 0


@pytest.mark.slow
def test_every_dataclass_key_missing_from_the_yaml_is_appendable():
    tree = yaml_tree()
    only_ours = sorted(
        k
        for k in uk.dataclass_keys()
        if not uk._has_path(tree, k)
        and uk._has_path(tree, k.rsplit(".", 1)[0])
        and not uk._is_dict_field(k.rsplit(".", 1)[0])
    )
    assert "trainer.time_budget_s" in only_ours and "actor_rollout_ref.actor.policy_loss.tau_pos" in only_ours
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        for key in only_ours:
            compose(config_name="ppo_trainer", overrides=[f"+{key}=null"])  # no "already at" error


def test_our_keys_work_without_plus_on_the_command_line():
    assert uk.normalize_overrides(
        ["trainer.time_budget_s=5", "+data.max_prompt_length=4", "++x.y=1", "data.seed=3"]
    ) == ["+trainer.time_budget_s=5", "data.max_prompt_length=4", "++x.y=1", "data.seed=3"]
    v = validate_config(load_default_config(["trainer.time_budget_s=5", "+data.max_prompt_length=4"]))
    assert v.trainer.time_budget_s == 5 and v.data.max_prompt_length == 4


def test_cli_argv_keeps_flag_values_in_place():
    from verl.trainer.main_ppo import _normalized_argv

    assert _normalized_argv(["m", "--config-name", "ppo_trainer", "trainer.time_budget_s=3"]) == [
        "m",
        "--config-name",
        "ppo_trainer",
        "+trainer.time_budget_s=3",
    ]


# ----------------------------------------------------------------------------- values
def test_upstream_values_for_implemented_features():
    v = validate_config(load_default_config(["actor_rollout_ref.rollout.mode=async"]))
    assert v.rollout.mode == "async"
    v = validate_config(
        load_default_config(
            [
                "actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
                "actor_rollout_ref.actor.clip_ratio_low=10",
                "actor_rollout_ref.actor.clip_ratio_high=0.2",
            ]
        )
    )
    assert v.actor.clip_ratio_low == 10
    v = validate_config(load_default_config(["actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16"]))
    assert v.actor.fsdp_config.model_dtype == "bf16"
    from verl.trainer.config import RolloutCorrectionConfig

    rc = RolloutCorrectionConfig(
        rollout_is="token",
        rollout_is_threshold="0.5_2.0",
        rollout_rs="token_k1,seq_max_k2",
        rollout_rs_threshold="0.5_2.0,0.01",
    )
    assert rc.rollout_rs == "token_k1,seq_max_k2" and rc.rollout_is_threshold == "0.5_2.0"


def test_runtime_env_reaches_ray_init(monkeypatch):
    import ray

    from verl.trainer.main_ppo import _init_ray

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    _init_ray({"num_cpus": 2, "runtime_env": {"py_executable": None, "env_vars": {"A": "1"}}})
    assert seen["runtime_env"] == {"env_vars": {"A": "1"}} and seen["num_cpus"] == 2
    seen.clear()
    _init_ray({"runtime_env": {"py_executable": None}})
    assert "runtime_env" not in seen  # nothing set: not passed


def test_vllm_without_gpu_is_named_before_ray(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        ValueError,
        match=r"^actor_rollout_ref\.rollout\.name=vllm: the vllm rollout without a CUDA GPU "
        r"is not available in this verl \(available: actor_rollout_ref\.rollout\.name=hf",
    ):
        validate_config(load_default_config(["actor_rollout_ref.rollout.name=vllm"]))


def test_upstream_dataclass_fields_and_defaults():
    from verl.trainer.config import AlgoConfig, RolloutCorrectionConfig
    from verl.workers.config import ActorConfig
    from verl.workers.config.actor import PolicyLossConfig

    a = AlgoConfig()
    assert a.use_pf_ppo is False and a.pf_ppo == {"reweight_method": "pow", "weight_pow": 2.0}
    assert a.gdpo_reward_keys is None and a.gdpo_reward_weights is None
    act = ActorConfig()
    assert (act.rollout_n, act.tau_pos, act.tau_neg, act.ppo_micro_batch_size) == (1, 1.0, 1.05, None)
    assert (act.use_torch_compile, act.calculate_entropy, act.calculate_sum_pi_squared) == (True, False, False)
    # use_prefix_grouper: on here where it is exact (upstream: off), see docs/performance.md
    assert (act.use_fused_kernels, act.use_prefix_grouper, act.engine, act.model_config, act.profiler) == (
        False,
        True,
        None,
        None,
        {},
    )
    pl = PolicyLossConfig()
    assert pl.dro_beta is None and pl.rollout_correction is None
    rc = RolloutCorrectionConfig()
    assert (rc.rollout_is, rc.rollout_is_batch_normalize, rc.bypass_mode, rc.loss_type) == (
        "sequence",
        False,
        False,
        "ppo_clip",
    )
    # the run's values pass through to what the losses read
    v = validate_config(
        load_default_config(
            [
                "algorithm.rollout_correction.bypass_mode=True",
                "algorithm.rollout_correction.loss_type=reinforce",
                "algorithm.use_pf_ppo=True",
                "algorithm.pf_ppo.weight_pow=3.0",
                "actor_rollout_ref.actor.policy_loss.dro_beta=0.5",
            ]
        )
    )
    assert v.algorithm.rollout_correction.bypass_mode and v.algorithm.rollout_correction.loss_type == "reinforce"
    assert v.algorithm.use_pf_ppo and v.algorithm.pf_ppo["weight_pow"] == 3.0 and v.actor.policy_loss.dro_beta == 0.5


# ----------------------------------------------------------------------------- defaults and preset
def test_a_run_with_a_model_gets_upstream_defaults():
    v = validate_config(load_default_config(real()))
    assert (v.data.train_batch_size, v.data.max_prompt_length, v.data.max_response_length) == (1024, 512, 512)
    assert v.actor.optim.lr == 1e-6 and v.actor.ppo_mini_batch_size == 256 and v.actor.use_dynamic_bsz is False
    assert v.trainer.total_epochs == 30 and v.trainer.test_freq == -1 and v.rollout.mode == "async"


def _leaves_equal(old: dict, new: dict) -> list[str]:
    renamed = {"critic.fsdp_config": "critic.fsdp"}
    diffs = []
    for key, value in uk._leaves(old):
        target = key
        for a, b in renamed.items():
            if key.startswith(a + "."):
                target = b + key[len(a) :]
        got = uk._get(new, target, "<missing>")
        if key == "ray_kwargs.ray_init.address" and got == "<missing>":
            got = None  # an unset ray.init argument: absent and null mean the same
        if uk.behaviour(target)[0] == "b":
            continue  # a key without effect here (e.g. rollout.mode) cannot change the job
        if got != value:
            diffs.append(f"{key}: before={value!r} now={got!r}")
    return diffs


def test_embedded_default_keeps_todays_settings_exactly():
    """The default job (no model path) with the preset equals the config before the yaml took
    upstream's defaults, for every key that yaml had (a frozen copy in tests/fixtures)."""
    before = json.loads((FIXTURES / "embedded_default_config_before_upstream_defaults.json").read_text())
    now = OmegaConf.to_container(uk.check_upstream_surface(load_default_config([])), resolve=True)
    assert not _leaves_equal(before, now)
    grpo_before = dict(before, algorithm=dict(before["algorithm"], adv_estimator="grpo"))
    grpo_now = OmegaConf.to_container(
        uk.check_upstream_surface(load_default_config(["algorithm.adv_estimator=grpo"])), resolve=True
    )
    assert not _leaves_equal(grpo_before, grpo_now)


def test_preset_yields_to_every_value_the_user_set():
    v = validate_config(
        load_default_config(
            [
                "data.train_batch_size=64",
                "trainer.logger=[console]",
                "actor_rollout_ref.actor.optim.lr=1e-4",
                "actor_rollout_ref.rollout.n=4",
            ]
        )
    )
    assert (v.data.train_batch_size, v.trainer.logger, v.actor.optim.lr, v.rollout.n) == (64, ["console"], 1e-4, 4)
    assert v.data.max_response_length == 8 and v.trainer.total_epochs == 2  # the rest of the preset stays
    # a section set as a whole: its preset keys yield too
    cfg = load_default_config(["actor_rollout_ref.actor.optim={lr: 2e-4}"])
    assert cfg.actor_rollout_ref.actor.optim.lr == 2e-4
    # setting a key to upstream's default value is a choice too
    assert load_default_config(["data.train_batch_size=1024"]).data.train_batch_size == 1024
    # the preset only applies without a model
    assert load_default_config(real()).data.max_response_length == 512
    assert load_default_config([], preset=False).data.max_response_length == 512


def test_hydra_entry_point_applies_the_preset(monkeypatch):
    """`python -m verl.trainer.main_ppo`: the preset sees the command line's overrides."""
    import verl.trainer.main_ppo as mp

    seen = {}
    monkeypatch.setattr(mp, "run_ppo", lambda cfg: seen.setdefault("cfg", cfg))
    monkeypatch.setattr(
        "sys.argv", ["main_ppo", "data.train_batch_size=16", "hydra.run.dir=.", "hydra.output_subdir=null"]
    )
    mp.main()
    cfg = seen["cfg"]
    assert (
        cfg.data.train_batch_size == 16 and cfg.data.max_response_length == 8 and cfg.actor_rollout_ref.rollout.n == 8
    )


def test_yaml_keys_that_upstream_lacks_are_only_aliases_and_interpolated_keys_of_ours():
    """Such a key could break a `+key=value` upstream script under plain Hydra; main_ppo drops the
    `+` for them, and the list stays short and known."""
    upstream = set(UPSTREAM_KEYS)
    ours = [
        k
        for k, _ in uk._leaves({k: v for k, v in yaml_tree().items() if k != "hydra"})
        if k not in upstream and not any(k.startswith(u + ".") for u in upstream)
    ]
    aliases = [k for k in ours if any(k == a.old or k.startswith(a.old + ".") for a in uk.ALIASES)]
    rest = sorted(set(ours) - set(aliases))
    assert rest == [
        "reward_model.forward_max_token_len_per_gpu",
        "reward_model.model.input_tokenizer",
        "reward_model.use_dynamic_bsz",
        "reward_model.use_reward_loop",
        "trainer.log_dir",
        "trainer.use_legacy_worker_impl",
    ], rest
    v = validate_config(
        load_default_config(
            ["+reward_model.use_reward_loop=True", "+trainer.log_dir=/tmp/x", "+critic.model.fsdp_config.fsdp_size=2"]
        )
    )
    assert v.trainer.log_dir == "/tmp/x" and v.critic.fsdp.fsdp_size == 2
