"""The entry point without training: Hydra CLI errors, resource-pool layout, CPU shares."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl.trainer.main_ppo import resource_pool_layout
from verl.trainer.ppo.ray_trainer import ResourcePoolManager
from verl.trainer.ppo.utils import Role

REPO = Path(__file__).resolve().parents[2]


def _main_ppo(*overrides: str) -> subprocess.CompletedProcess:
    """`python -m verl.trainer.main_ppo <overrides>` from the repository root (stdout/stderr captured)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", *overrides],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(REPO),
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_cli_rejects_a_bad_value_naming_the_key():
    proc = _main_ppo("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1")
    assert proc.returncode != 0
    assert "actor_rollout_ref.rollout.n=1" in proc.stderr and "adv_estimator='grpo'" in proc.stderr
    assert "_init_ray" not in proc.stderr  # failed in validation, before Ray was started


@pytest.mark.slow
def test_cli_rejects_an_unknown_key():
    proc = _main_ppo("+trainer.totl_epochs=3")
    assert proc.returncode != 0 and "trainer.totl_epochs" in proc.stderr


def test_resource_pool_layout_colocates_by_default_and_splits_on_request():
    mapping = {Role.ActorRollout: object, Role.Critic: object, Role.RefPolicy: object}
    spec, pools = resource_pool_layout(2, 4, None, mapping)
    assert spec == {"global_pool": [4, 4]} and set(pools.values()) == {"global_pool"}
    spec, pools = resource_pool_layout(1, 2, {"critic": [1], "rm": [1]}, mapping)
    assert spec == {"global_pool": [2], "critic_pool": [1]}  # no reward model in this run: no rm pool
    assert pools[Role.Critic] == "critic_pool" and pools[Role.RefPolicy] == "global_pool"
    mgr = ResourcePoolManager(spec, pools, use_gpu=False)
    assert mgr.get_n_gpus() == 3


@pytest.mark.slow
def test_cli_override_typo_names_the_closest_key():
    proc = _main_ppo("actor_rollout_ref.actor.ppo_mini_batchsize=16", "hydra.run.dir=/tmp/never_used")
    assert proc.returncode == 1
    assert "Could not override 'actor_rollout_ref.actor.ppo_mini_batchsize'" in proc.stderr
    assert "did you mean actor_rollout_ref.actor.ppo_mini_batch_size" in proc.stderr
    assert "would add a key that nothing reads" in proc.stderr


def test_a_field_the_yaml_omits_composes_with_or_without_plus():
    from hydra.errors import ConfigCompositionException

    from verl.trainer.main_ppo import load_default_config

    # a field of ours that upstream's yaml lacks is not in our yaml (so `+key=` works as in upstream's
    # scripts), and the plain spelling is appended for the user
    assert load_default_config(["ray_kwargs.timeline_json_file=t.json"]).ray_kwargs.timeline_json_file == "t.json"
    # a key under the wrong section: the same key name elsewhere is suggested
    with pytest.raises(ConfigCompositionException, match=r"did you mean actor_rollout_ref\.rollout\.temperature"):
        load_default_config(["actor_rollout_ref.actor.temperature=1.0"])
    cfg = load_default_config(["+ray_kwargs.timeline_json_file=t.json"])
    assert cfg.ray_kwargs.timeline_json_file == "t.json"
