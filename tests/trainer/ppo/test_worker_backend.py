"""`trainer.worker_backend`: which jobs run their worker inside the driver (`local`) and which need
Ray, and the errors of an explicit `local` that cannot hold the job."""

from __future__ import annotations

import pytest

from verl.trainer.main_ppo import load_default_config
from verl.trainer.ppo.utils import validate_config
from verl.trainer.ppo.worker_groups import resolve_worker_backend


def _backend(*overrides: str) -> str:
    cfg = load_default_config(["algorithm.adv_estimator=grpo", "trainer.device=cpu", *overrides])
    return resolve_worker_backend(validate_config(cfg))


def test_the_default_cpu_job_runs_in_process(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert _backend() == "local"
    assert _backend("trainer.worker_backend=local") == "local"
    assert _backend("trainer.worker_backend=ray") == "ray"


@pytest.mark.parametrize(
    "override, reason",
    [
        ("trainer.n_gpus_per_node=2", "n_gpus_per_node=2"),
        ("trainer.nnodes=2", "nnodes=2"),
        ("+trainer.role_pools={critic: [1]}", "role_pools"),
        ("+ray_kwargs.ray_init.address=auto", "cluster address"),
        ("ray_kwargs.timeline_json_file=/tmp/t.json", "timeline_json_file"),
        ("+ray_kwargs.ray_init.runtime_env.env_vars={A: b}", "runtime_env"),
    ],
)
def test_what_needs_ray_picks_ray_and_refuses_local(monkeypatch, override, reason):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    extra = ["algorithm.adv_estimator=gae"] if "role_pools" in override else []
    assert _backend(override, *extra) == "ray"
    with pytest.raises(ValueError, match=r"trainer.worker_backend=local runs one CPU worker .*" + reason):
        _backend(override, "trainer.worker_backend=local", *extra)


def test_a_ray_address_in_the_environment_picks_ray(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert _backend() == "ray"


def test_a_ray_already_started_in_this_process_is_used(monkeypatch):
    import sys
    import types

    fake_ray = types.SimpleNamespace(is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert _backend() == "ray"
    assert _backend("trainer.worker_backend=local") == "local"  # asked for explicitly


def test_an_unknown_backend_names_the_accepted_values():
    with pytest.raises(ValueError, match=r"trainer.worker_backend='threads' is not allowed.*'auto', 'ray', 'local'"):
        _backend("trainer.worker_backend=threads")
