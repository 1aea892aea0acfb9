"""A config with a bad model source reports the model source first (before any rule that
depends on the model), and every other config error found is reported with it."""

from __future__ import annotations

import pytest

from verl.trainer.main_ppo import load_default_config
from verl.trainer.ppo.utils import validate_config

# a second error, of a rule that depends on nothing about the model
GROUP_RULE = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"]


def _notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


def test_missing_model_path_is_named_first_and_the_other_error_is_listed(tmp_path):
    missing = tmp_path / "no_such_model"
    cfg = load_default_config([f"actor_rollout_ref.model.path={missing}", *GROUP_RULE])
    with pytest.raises(FileNotFoundError, match=r"actor_rollout_ref\.model\.path=.*no_such_model") as info:
        validate_config(cfg)
    assert "rollout.n=1" not in str(info.value)
    assert "actor_rollout_ref.rollout.n=1" in _notes(info.value)  # reported too, after the cause


def test_empty_model_directory_is_named_first(tmp_path):
    cfg = load_default_config([f"actor_rollout_ref.model.path={tmp_path}", *GROUP_RULE])
    with pytest.raises(FileNotFoundError, match=r"model\.path=.*config\.json missing"):
        validate_config(cfg)


def test_unknown_hub_id_offline_is_named_first(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_default_config(["actor_rollout_ref.model.path=no-such-org/no-such-model", *GROUP_RULE])
    with pytest.raises(FileNotFoundError, match=r"no-such-org/no-such-model.*Hub id"):
        validate_config(cfg)


def test_one_error_is_raised_as_it_is():
    with pytest.raises(ValueError, match=r"rollout\.n=1") as info:
        validate_config(load_default_config(GROUP_RULE))
    assert not _notes(info.value)


@pytest.mark.slow  # imports ray for the argument list (~2-3 s)
def test_unknown_ray_init_kwarg_is_named_at_validation_also_without_ray():
    cfg = load_default_config(["+ray_kwargs.ray_init.num_cpu=2", "trainer.worker_backend=local"])
    with pytest.raises(
        ValueError, match=r"ray_kwargs\.ray_init\.num_cpu: ray\.init has no argument 'num_cpu'.*num_cpus"
    ):
        validate_config(cfg)
    # ray.init's own arguments, public and private, pass
    ok = ["+ray_kwargs.ray_init.num_gpus=0", "+ray_kwargs.ray_init._temp_dir=/tmp/x", "+ray_kwargs.ray_init._memory=1"]
    validate_config(load_default_config(ok))
