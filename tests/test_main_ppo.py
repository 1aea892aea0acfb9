"""The entry point without training: Hydra CLI errors, resource-pool layout, CPU shares."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl.trainer.main_ppo import resource_pool_layout
from verl.trainer.ppo.ray_trainer import ResourcePoolManager
from verl.trainer.ppo.utils import Role

REPO = Path(__file__).resolve().parents[1]


def test_cli_rejects_a_bad_value_naming_the_key():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"],
        capture_output=True, text=True, env=env, cwd=str(REPO), timeout=120,
    )
    assert proc.returncode != 0
    assert "actor_rollout_ref.rollout.n=1" in proc.stderr and "adv_estimator='grpo'" in proc.stderr
    assert "_init_ray" not in proc.stderr  # failed in validation, before Ray was started


def test_cli_rejects_an_unknown_key():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", "+trainer.totl_epochs=3"],
        capture_output=True, text=True, env=env, cwd=str(REPO), timeout=120,
    )
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
