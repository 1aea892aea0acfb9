"""End-to-end runs with a rollout of its own (`actor_rollout_ref.hybrid_engine=False`): the
synchronous mode equals the colocated trainer bit for bit, one-step-off equals its serial
emulation with exactly the promised staleness, and a killed rollout worker stops the run.

Every run uses the session Ray (tests/conftest.py), one actor process and one rollout process of
one CPU each, and the tiny model and data of test_e2e_ppo.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import test_e2e_ppo
import torch
from test_e2e_ppo import MACHINE, _same_numbers, base_overrides

from verl.trainer.main_ppo import load_default_config, run_ppo

pytestmark = [pytest.mark.slow, pytest.mark.ray]

assets = test_e2e_ppo.assets  # the tiny model and data (a module fixture)

SEPARATE = [
    "actor_rollout_ref.hybrid_engine=False",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
]
# the rows the async runs add to every step; everything else must equal the colocated run's
ASYNC_ONLY = ("training/off_policy/", "rollout/weight_sync_", "timing_s/update_weights")
STEPS = 4


def common(assets, run_dir) -> list[str]:
    return base_overrides(assets, run_dir) + [
        "algorithm.adv_estimator=grpo",
        f"trainer.total_training_steps={STEPS}",
        "trainer.test_freq=2",
        "trainer.save_freq=2",
        f"trainer.default_local_dir={run_dir}/ckpt",
    ]


def run_cfg(cfg, run_dir) -> dict[int, dict]:
    run_ppo(cfg)
    metrics: dict[int, dict] = {}
    with open(os.path.join(run_dir, "log", "metrics.jsonl")) as fh:
        for line in fh:
            rec = json.loads(line)
            metrics.setdefault(rec["step"], {}).update(rec["data"])
    return metrics


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    from verl.utils.checkpoint.dcp_shards import iter_full_tensors

    return dict(iter_full_tensors(os.path.join(run_dir, "ckpt", f"global_step_{STEPS}", "actor", "dcp")))


def without(metrics: dict[int, dict], prefixes) -> dict[int, dict]:
    return {s: {k: v for k, v in m.items() if not k.startswith(prefixes)} for s, m in metrics.items()}


def numbers(metrics: dict[int, dict]) -> dict[int, dict]:
    """Every metric but the machine's figures (timings, throughput, memory), which the same
    computation does not reproduce."""
    return {s: {k: v for k, v in m.items() if not any(x in k for x in MACHINE)} for s, m in metrics.items()}


def test_sync_mode_with_a_rollout_of_its_own_equals_the_colocated_trainer(ray_session, assets, tmp_path):
    colo, sep = str(tmp_path / "colocated"), str(tmp_path / "separate")
    m_colo = run_cfg(load_default_config(common(assets, colo), preset="always"), colo)
    m_sep = run_cfg(
        load_default_config(
            common(assets, sep)
            + SEPARATE
            + [
                "trainer.v1.trainer_mode=separate_async",
                "trainer.v1.separate_async.parameter_sync_step=1",
                "trainer.v1.separate_async.num_warmup_batches=0",
                "trainer.v1.sampler.max_off_policy_threshold=1",
            ],
            preset="always",
        ),
        sep,
    )
    assert _same_numbers(m_colo, without(m_sep, ASYNC_ONLY)) == []
    for step in range(1, STEPS + 1):
        assert m_sep[step]["training/off_policy/trajectory_staleness/max"] == 0
        assert m_sep[step]["rollout/weight_sync_max_logp_diff"] == 0.0
        assert m_sep[step]["timing_s/update_weights"] > 0
        assert m_sep[step]["rollout/weight_sync_buckets"] >= 1
    a, b = final_weights(colo), final_weights(sep)
    assert sorted(a) == sorted(b)
    assert all(torch.equal(a[k], b[k]) for k in a)


def one_step_off(assets, run_dir, *overrides):
    """The config of the one-step-off entry point on the tiny model; later overrides win."""
    from verl.experimental.one_step_off_policy.main_ppo import load_config
    from verl.trainer.config.upstream_keys import apply_embedded_preset

    by_key = {}
    for o in [*common(assets, run_dir), "trainer.save_freq=-1", "rollout.n_gpus_per_node=1", *overrides]:
        by_key[o.split("=", 1)[0]] = o
    over = list(by_key.values())
    return apply_embedded_preset(load_config(over), over, always=True)


def test_one_step_off_equals_its_serial_emulation_with_staleness_exactly_one(
    ray_session, assets, tmp_path, monkeypatch
):
    from verl.trainer.ppo.async_trainer import AsyncRayPPOTrainer

    versions: dict[str, dict[int, set]] = {"pipelined": {}, "serial": {}}
    mode = {"now": "pipelined"}
    collect = AsyncRayPPOTrainer.collect_batch

    def recording_collect(self, prompts, ctx):
        batch = collect(self, prompts, ctx)
        versions[mode["now"]][ctx.step] = set(batch.non_tensor_batch["min_global_steps"].tolist())
        return batch

    monkeypatch.setattr(AsyncRayPPOTrainer, "collect_batch", recording_collect)
    pipelined = str(tmp_path / "pipelined")
    m_pipe = run_cfg(one_step_off(assets, pipelined), pipelined)

    # the emulation: every generation is waited for as soon as it is submitted (nothing overlaps)
    submit = AsyncRayPPOTrainer._submit

    def serial_submit(self, batch_dict, for_step):
        item = submit(self, batch_dict, for_step)
        item[2].result()
        return item

    monkeypatch.setattr(AsyncRayPPOTrainer, "_submit", serial_submit)
    mode["now"] = "serial"
    serial = str(tmp_path / "serial")
    m_serial = run_cfg(one_step_off(assets, serial), serial)

    assert _same_numbers(numbers(m_pipe), numbers(m_serial)) == []
    # batch t was generated with the weights after step t - 2 (the initial ones for t <= 2)
    expected = {t: {max(0, t - 2)} for t in range(1, STEPS + 1)}
    assert versions["pipelined"] == versions["serial"] == expected
    staleness = [m_pipe[t]["training/off_policy/trajectory_staleness/max"] for t in range(1, STEPS + 1)]
    assert staleness == [0, 1, 1, 1]
    assert [m_pipe[t]["training/off_policy/trajectory_staleness/min"] for t in range(1, STEPS + 1)] == [0, 1, 1, 1]
    assert all(m_pipe[t]["rollout/weight_sync_max_logp_diff"] == 0.0 for t in range(1, STEPS + 1))


def test_a_killed_rollout_worker_stops_the_run_naming_role_and_rank(ray_session, assets, tmp_path, monkeypatch):
    import ray

    from verl.trainer.ppo.async_trainer import AsyncRayPPOTrainer

    killed = {}
    train_step = AsyncRayPPOTrainer.train_step

    def killing_train_step(self, batch, ctx):
        if ctx.step == 2:  # batch 3 is being generated: the rollout dies mid-run
            ray.kill(self.rollout_wg.workers[0], no_restart=True)
            killed["at"] = time.monotonic()
        return train_step(self, batch, ctx)

    monkeypatch.setattr(AsyncRayPPOTrainer, "train_step", killing_train_step)
    run_dir = str(tmp_path / "killed")
    with pytest.raises(RuntimeError, match=r"the rollout worker \(rank 0\) failed: .*died") as err:
        run_cfg(one_step_off(assets, run_dir), run_dir)
    assert time.monotonic() - killed["at"] < 30
    assert "step" in str(err.value)


def test_the_one_step_off_recipe_runs_a_few_steps_on_the_embedded_default(ray_session, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "one_step_off.sh"
    env = dict(os.environ, PYTHON=sys.executable, RAY_ADDRESS=ray_session.get_runtime_context().gcs_address)
    cmd = [
        "bash",
        str(recipe),
        "trainer.total_training_steps=3",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.logger=[file]",
        "trainer.plot=False",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.torch_threads_per_worker=1",
        f"trainer.log_dir={tmp_path}/log",
        f"trainer.default_local_dir={tmp_path}/ckpt",
        f"hydra.run.dir={tmp_path}/hydra",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"one_step_off.sh failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "backend=nccl runs here as the gloo broadcast engine (device cpu)" in proc.stderr
    metrics: dict[int, dict] = {}
    for line in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        metrics.setdefault(rec["step"], {}).update(rec["data"])
    stale = [metrics[t]["training/off_policy/trajectory_staleness/max"] for t in (1, 2, 3)]
    assert stale == [0, 1, 1]
    assert all(metrics[t]["rollout/weight_sync_max_logp_diff"] == 0.0 for t in (1, 2, 3))


def test_two_rollout_ranks_each_receive_every_sync(ray_session, assets, tmp_path):
    run_dir = str(tmp_path / "two")
    cfg = one_step_off(assets, run_dir, "trainer.total_training_steps=2", "rollout.n_gpus_per_node=2")
    assert cfg.actor_rollout_ref.rollout.n_gpus_per_node == 2
    metrics = run_cfg(cfg, run_dir)
    assert [metrics[t]["training/off_policy/trajectory_staleness/max"] for t in (1, 2)] == [0, 1]
    # the reported difference is the largest over both rollout ranks
    assert all(metrics[t]["rollout/weight_sync_max_logp_diff"] == 0.0 for t in (1, 2))
