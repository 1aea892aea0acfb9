"""A real two-node Ray cluster on this machine, as docs/gpu_and_multinode.md starts one: `ray
start --head` and `ray start --address`, one CPU each, token authentication (Ray 2.60's
`RAY_AUTH_MODE=token` with a token file shared by every node and the driver). The driver joins
through `RAY_ADDRESS`; GRPO with `trainer.nnodes=2 trainer.n_gpus_per_node=1` and a critic in its
own pool trains with one actor rank on each node, saves, and a second run resumes. A driver
without the token is refused with `InvalidAuthToken`. The nodes are ended by their pids."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
from test_e2e_ppo import REWARD_FN, rl_rows, write_parquet
from test_workers_common import build_tiny_llama

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RECORD_NODES = """
import json, os

import ray._private.state as state

from verl.trainer.ppo.ray_trainer import TrainerCallback


class RecordNodes(TrainerCallback):
    def on_fit_start(self, trainer):
        alive = {a["Name"]: a["Address"]["NodeID"] for a in state.actors().values() if a["State"] == "ALIVE"}
        groups = {"actor": trainer.actor_rollout_wg.worker_names, "critic": trainer.critic_wg.worker_names}
        with open(os.environ["VERL_TEST_NODES_FILE"], "w") as fh:
            json.dump({g: [alive[n] for n in names] for g, names in groups.items()}, fh)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(path: str, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}:\n{open(path, errors='replace').read()}")
        time.sleep(0.5)
    raise TimeoutError(f"{path} never said {text!r}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray_cluster")
    token = root / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = dict(
        os.environ,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token),
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
    )
    port = _free_port()
    # Ray's own directory for these nodes: `ray start` records the cluster address in
    # <temp-dir>/ray_current_cluster, and a stale one in the default /tmp/ray would make every later
    # plain ray.init() on this machine try to join this (by then ended) cluster. Short: socket paths
    temp_dir = tempfile.mkdtemp(prefix="vrc", dir="/tmp")
    procs = []
    try:
        for i, args in enumerate(
            (
                ["--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp_dir}"],
                [f"--address=127.0.0.1:{port}"],
            )
        ):
            log = str(root / f"node{i}.log")
            cmd = ["ray", "start", *args, "--num-cpus=1", "--node-ip-address=127.0.0.1", "--block"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT))
            _wait_for(log, "block forever", procs[-1])
        yield {"address": f"127.0.0.1:{port}", "env": env, "root": root}
    finally:
        for proc in reversed(procs):  # by pid: never `ray stop`, which ends every Ray on the machine
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _driver(cluster, run_dir, *overrides, auth: bool = True) -> subprocess.CompletedProcess:
    root = cluster["root"]
    model = build_tiny_llama(str(root / "model")) if not (root / "model").exists() else str(root / "model")
    train = write_parquet(rl_rows(8, "train"), str(root / "train.parquet"))
    val = write_parquet(rl_rows(4, "test", seed=5), str(root / "val.parquet"))
    (root / "reward_fn.py").write_text(REWARD_FN)
    (root / "record_nodes.py").write_text(RECORD_NODES)
    env = dict(cluster["env"], RAY_ADDRESS=cluster["address"], VERL_TEST_NODES_FILE=str(run_dir / "nodes.json"))
    if not auth:
        env.pop("RAY_AUTH_MODE")
        env.pop("RAY_AUTH_TOKEN_PATH")
    args = [
        "algorithm.adv_estimator=grpo",
        "critic.enable=True",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        "trainer.role_pools={critic: [1]}",
        "trainer.cpus_per_worker=0.5",
        "trainer.torch_threads_per_worker=1",
        f"actor_rollout_ref.model.path={model}",
        f"critic.model.path={model}",
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.max_prompt_length=16",
        "data.max_response_length=6",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "critic.ppo_micro_batch_size_per_gpu=4",
        f"custom_reward_function.path={root / 'reward_fn.py'}",
        f"trainer.callbacks=[{root / 'record_nodes.py'}:RecordNodes]",
        "trainer.logger=[file]",
        f"trainer.log_dir={run_dir}/log",
        f"trainer.default_local_dir={run_dir}/ckpt",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.save_freq=1",
        "trainer.placement_timeout_s=60",
        *overrides,
    ]
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *args]
    return subprocess.run(cmd, env=env, cwd=str(run_dir), capture_output=True, text=True, timeout=600)


def _steps(run_dir) -> list[int]:
    with open(run_dir / "log" / "metrics.jsonl") as fh:
        return [json.loads(line)["step"] for line in fh]


def test_grpo_trains_saves_and_resumes_on_a_two_node_cluster(cluster, tmp_path):
    first = _driver(cluster, tmp_path, "trainer.total_training_steps=2")
    assert first.returncode == 0, first.stderr[-4000:]
    nodes = json.load(open(tmp_path / "nodes.json"))
    assert len(nodes["actor"]) == 2 and len(set(nodes["actor"])) == 2  # one actor rank on each node
    assert len(nodes["critic"]) == 1 and nodes["critic"][0] in nodes["actor"]  # its own pool, on a node
    assert _steps(tmp_path) == [1, 2]
    shards = sorted(os.listdir(tmp_path / "ckpt" / "global_step_2" / "actor" / "dcp"))
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # each node's rank wrote its shard
    second = _driver(cluster, tmp_path, "trainer.total_training_steps=3")
    assert second.returncode == 0, second.stderr[-4000:]
    assert _steps(tmp_path) == [1, 2, 3]  # resumed after step 2


def test_a_driver_without_the_token_is_refused(cluster, tmp_path):
    out = _driver(cluster, tmp_path, "trainer.total_training_steps=1", auth=False)
    assert out.returncode != 0 and "InvalidAuthToken" in out.stdout + out.stderr
