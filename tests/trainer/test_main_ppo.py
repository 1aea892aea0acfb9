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


def _run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(REPO), timeout=timeout
    )


def test_the_entry_point_and_config_composition_do_not_import_torch():
    # the driver composes its config before torch loads, and verl.utils' re-exports stay reachable
    proc = _run_python(
        "import sys\n"
        "import verl.trainer.main_ppo as m\n"
        "cfg = m.load_default_config(['algorithm.adv_estimator=grpo'])\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
        "import verl.utils\n"
        "print(callable(verl.utils.hf_tokenizer), callable(m.create_rl_dataset), 'torch' in sys.modules)\n"
        "print('group_mean_std' in dir(verl.utils))\n"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:3] == ["False False", "True True True", "True"]


def test_verl_utils_unknown_attribute_raises_attribute_error():
    import verl.utils

    with pytest.raises(AttributeError, match="no_such_name"):
        verl.utils.no_such_name  # noqa: B018


def test_exit_now_runs_atexit_flushes_and_keeps_the_code(tmp_path):
    marker = tmp_path / "atexit.txt"
    proc = _run_python(
        "import atexit, sys\n"
        "from verl.trainer.main_ppo import exit_now\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
        "sys.stdout.write('buffered, no newline')\n"
        "sys.stderr.write('err text')\n"
        "exit_now(3)\n"
        "print('not reached')\n"
    )
    assert proc.returncode == 3
    assert proc.stdout == "buffered, no newline" and "err text" in proc.stderr
    assert marker.read_text() == "ran"


def test_prefetch_imports_can_be_switched_off_and_loads_the_modules(monkeypatch):
    from verl.trainer import main_ppo

    monkeypatch.setenv(main_ppo.PREFETCH_ENV, "0")
    assert main_ppo._prefetch_imports() is None
    monkeypatch.setenv(main_ppo.PREFETCH_ENV, "1")
    thread = main_ppo._prefetch_imports()
    thread.join(timeout=120)
    assert not thread.is_alive() and thread.daemon
    assert all(name in sys.modules for name in main_ppo.PREFETCH_MODULES)


SMALL_RUN = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.rollout.n=2",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.logger=[file]",
    "+trainer.torch_threads_per_worker=2",
]


def _run_cli(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("RAY_ADDRESS", None)  # its own private Ray, as a user's first run
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "verl.trainer.main_ppo",
            *args,
            f"trainer.log_dir={tmp_path}/log",
            f"trainer.default_local_dir={tmp_path}/ckpt",
            f"hydra.run.dir={tmp_path}/hydra",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=600,
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "ray"])
def test_cli_run_exits_zero_after_the_fast_exit(tmp_path, backend):
    proc = _run_cli([*SMALL_RUN, f"trainer.worker_backend={backend}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) >= 1 and '"step": 1' in lines[-1]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "ray"])
def test_cli_error_after_the_workers_started_exits_one_with_its_traceback(tmp_path, backend):
    # the training file exists (the config check passes) but is no parquet: reading it fails after
    # Ray (or the in-process worker backend) started, and the normal exit path (Hydra's report,
    # exit code 1) runs, not the fast exit
    bad = tmp_path / "not_parquet.parquet"
    bad.write_text("this is not a parquet file\n")
    proc = _run_cli([*SMALL_RUN, f"data.train_files={bad}", f"trainer.worker_backend={backend}"], tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Error executing job" in proc.stderr and "not_parquet.parquet" in proc.stderr
    assert "ray_trainer.py" in proc.stderr  # raised by the trainer, after the backend started
    assert not (tmp_path / "log" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_shutdown_ray_stops_every_process_of_the_private_session():
    # the monitor is SIGKILLed up front (its SIGTERM handler waits on the stopped GCS for Ray's full
    # 1 s grace); every other process goes Ray's own way; none is left
    proc = _run_python(
        "import psutil, ray\n"
        "from verl.trainer import main_ppo\n"
        "assert main_ppo._init_ray({'num_cpus': 1})\n"
        "node = ray._private.worker._global_node\n"
        "procs = {t: [i.process for i in v] for t, v in node.all_processes.items()}\n"
        "main_ppo._shutdown_ray()\n"
        "print(sorted(procs))\n"
        "print([p.returncode for p in procs['monitor']])\n"
        "print([t for t, ps in procs.items() for p in ps if p.poll() is None])\n"
        "print(ray.is_initialized())\n",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    kinds, monitor_codes, alive, initialized = proc.stdout.strip().split("\n")[-4:]
    assert "'monitor'" in kinds and "'gcs_server'" in kinds and "'raylet'" in kinds
    assert monitor_codes == "[-9]"
    assert alive == "[]" and initialized == "False"
