"""End-to-end runs of `run_ppo` (the code path of `python -m verl.trainer.main_ppo`) on CPU with a
tiny model and data made here: a few steps of each algorithm family, user extensions from files,
exact resume across an epoch boundary, and the promised error messages.

Every run uses the session Ray (tests/conftest.py) with one worker process of one CPU.
"""

from __future__ import annotations

import json
import math
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_workers_common import build_tiny_llama

from verl.trainer.main_ppo import load_default_config, run_ppo

pytestmark = [pytest.mark.slow, pytest.mark.ray]

DATA_SOURCE = "e2e_toy"

REWARD_FN = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    """Partial credit (digits in the response) so that groups have reward variance."""
    digits = sum(c.isdigit() for c in solution_str)
    score = digits / 6 + bonus
    return {"score": score, "acc": float(digits >= 2)}
'''

MARKER_LOSS = """
import os

from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, register_policy_loss

MARKER = {marker!r}


@register_policy_loss("e2e_marker_loss")
def marker_loss(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    with open(MARKER, "a") as fh:
        fh.write(f"{{os.getpid()}}\\n")
    return compute_policy_loss_vanilla(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )
"""


def rl_rows(n: int, split: str, data_source: str = DATA_SOURCE, seed: int = 0) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = (i * 7 + seed) % 10, (i * 3 + 1 + seed) % 10
        rows.append(
            {
                "data_source": data_source,
                "prompt": [{"role": "user", "content": f"{a}+{b}"}],
                "ability": "arithmetic",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": split, "index": i},
            }
        )
    return rows


def write_parquet(rows: list[dict], path: str) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e_assets")
    model = build_tiny_llama(str(root / "model"))
    files = {
        "model": model,
        "train": write_parquet(rl_rows(8, "train"), str(root / "train.parquet")),
        "val": write_parquet(rl_rows(4, "test", seed=5), str(root / "val.parquet")),
        "reward": str(root / "reward_fn.py"),
    }
    (root / "reward_fn.py").write_text(REWARD_FN)
    return files


# the runs below use a tiny model of their own with the embedded job's settings:
# load_default_config(..., preset="always") (a model path alone would give upstream's defaults)
def base_overrides(assets, run_dir) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={assets['model']}",
        f"data.train_files={assets['train']}",
        f"data.val_files={assets['val']}",
        "data.max_prompt_length=16",
        "data.max_response_length=6",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "critic.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "critic.optim.lr=1e-3",
        f"custom_reward_function.path={assets['reward']}",
        "trainer.cpus_per_worker=1",
        "trainer.torch_threads_per_worker=2",
        "trainer.logger=[file]",
        f"trainer.log_dir={run_dir}/log",
        f"trainer.default_local_dir={run_dir}/ckpt",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "trainer.save_freq=-1",
        "trainer.peak_flops_per_worker=1e11",
    ]


def run(assets, run_dir, *overrides) -> tuple[dict, dict[int, dict]]:
    cfg = load_default_config(base_overrides(assets, run_dir) + list(overrides), preset="always")
    out = run_ppo(cfg)
    metrics: dict[int, dict] = {}
    with open(os.path.join(run_dir, "log", "metrics.jsonl")) as fh:
        for line in fh:
            rec = json.loads(line)
            metrics.setdefault(rec["step"], {}).update(rec["data"])
    return out, metrics


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def test_grpo_with_kl_loss_custom_reward_checkpoint_and_plot(ray_session, assets, tmp_path):
    out, m = run(
        assets,
        tmp_path,
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "+custom_reward_function.reward_kwargs.bonus=0.5",
        "trainer.save_freq=2",
    )
    assert sorted(m) == [0, 1, 2]
    s2 = m[2]
    assert finite(s2["actor/kl_loss"]) and finite(s2["actor/pg_loss"]) and finite(s2["actor/grad_norm"])
    assert s2["critic/score/min"] >= 0.5  # the reward_kwargs bonus reached the user function
    for key in (
        "timing_s/gen",
        "timing_s/ref",
        "timing_s/update_actor",
        "timing_s/step",
        "perf/throughput",
        "perf/mfu/step",
        "response_length/clip_ratio",
        "critic/advantages/mean",
        "val-core/e2e_toy/reward/mean@1",
        "val-core/e2e_toy/acc/mean@1",
        "reward/score_errors",
        "reward/score_timeouts",
        "reward/math_verify_fallbacks",
    ):
        assert key in s2, key
    # one mini-batch x one epoch: the separate old-log-prob pass is skipped
    assert "timing_s/old_log_prob" not in s2
    assert out["val-core/e2e_toy/reward/mean@1"] == s2["val-core/e2e_toy/reward/mean@1"]
    ckpt = tmp_path / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert sorted(os.listdir(ckpt / "global_step_2")) == [
        "actor",
        "data.pt",
        "manifest.json",
        "run_record.json",
        "trainer_state.pt",
    ]
    png = tmp_path / "log" / "curves.png"
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_ppo_with_critic_and_adaptive_kl_in_reward(ray_session, assets, tmp_path):
    _, m = run(
        assets,
        tmp_path,
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=True",
        "algorithm.kl_ctrl.type=adaptive",
        "algorithm.kl_ctrl.kl_coef=0.05",
        "algorithm.kl_ctrl.horizon=10",
        "trainer.total_training_steps=3",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
    )
    assert sorted(m) == [1, 2, 3]
    for step in (1, 2, 3):
        for key in (
            "critic/vf_loss",
            "critic/values/mean",
            "critic/vf_explained_var",
            "actor/reward_kl_penalty",
            "timing_s/values",
            "timing_s/update_critic",
            "timing_s/old_log_prob",
            "timing_s/ref",
        ):
            assert key in m[step], (step, key)
    coef = [m[s]["actor/reward_kl_penalty_coeff"] for s in (1, 2, 3)]
    assert coef[0] == pytest.approx(0.05)
    assert coef[1] != coef[0] or coef[2] != coef[1]  # the adaptive controller moved beta


def test_dapo_filter_groups_and_overlong_penalty(ray_session, assets, tmp_path):
    _, m = run(
        assets,
        tmp_path,
        "algorithm.adv_estimator=grpo",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=acc",
        "algorithm.filter_groups.max_num_gen_batches=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "reward_model.reward_manager=dapo",
        "+reward_model.reward_kwargs.overlong_buffer_cfg={enable: true, len: 3, penalty_factor: 1.0, log: true}",
        "trainer.val_before_train=False",
    )
    for step in (1, 2):
        s = m[step]
        if s.get("train/skipped_step"):
            continue
        assert s["filter_groups/num_gen_batches"] >= 1
        assert (
            s["filter_groups/kept_groups"] + s["filter_groups/dropped_groups"] == 4 * s["filter_groups/num_gen_batches"]
        )
    assert "val-aux/e2e_toy/overlong_reward/mean@1" in m[2]
    assert m[2]["val-aux/e2e_toy/overlong_reward/mean@1"] <= 0


CALLBACK = """
import json

from verl.trainer.ppo.ray_trainer import TrainerCallback


class RecordSteps(TrainerCallback):
    def on_advantages(self, trainer, batch, metrics):
        metrics["callback/adv_rows"] = len(batch)

    def on_step_end(self, trainer, metrics):
        with open({path!r}, "a") as fh:
            row = {{"step": trainer.global_steps, "has_adv_rows": "callback/adv_rows" in metrics}}
            fh.write(json.dumps(row) + "\\n")
"""


def test_gspo_with_the_shipped_scorer_and_a_callback(ray_session, assets, tmp_path):
    # the default scorer of the embedded toy task grades "a+b" prompts of data_source verl_toy/addition
    from verl.utils.dataset.toy_tasks import ADDITION_DATA_SOURCE

    cb_file = tmp_path / "cb.py"
    cb_file.write_text(CALLBACK.format(path=str(tmp_path / "steps.jsonl")))
    train = write_parquet(rl_rows(8, "train", data_source=ADDITION_DATA_SOURCE), str(tmp_path / "train.parquet"))
    val = write_parquet(rl_rows(4, "test", data_source=ADDITION_DATA_SOURCE, seed=5), str(tmp_path / "val.parquet"))
    _, m = run(
        assets,
        tmp_path,
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "custom_reward_function.path=null",
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"trainer.callbacks=[{cb_file}:RecordSteps]",
    )
    assert finite(m[2]["actor/pg_loss"]) and finite(m[2]["critic/score/mean"])
    assert m[2]["callback/adv_rows"] == 8
    seen = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert seen == [{"step": 1, "has_adv_rows": True}, {"step": 2, "has_adv_rows": True}]
    assert f"val-core/{ADDITION_DATA_SOURCE}/reward/mean@1" in m[2]


def test_custom_policy_loss_from_a_user_file_runs_in_the_workers(ray_session, assets, tmp_path):
    marker = tmp_path / "calls.txt"
    loss_file = tmp_path / "my_losses.py"
    loss_file.write_text(MARKER_LOSS.format(marker=str(marker)))
    _, m = run(
        assets,
        tmp_path,
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.policy_loss.loss_mode=e2e_marker_loss",
        f"trainer.external_modules=[{loss_file}]",
        "trainer.total_training_steps=5",
        "trainer.time_budget_s=1e-9",  # spent before step 1 starts: step 1 is the last one
        "trainer.val_before_train=False",
    )
    assert sorted(m) == [1] and "val-core/e2e_toy/reward/mean@1" in m[1]
    pids = {int(p) for p in marker.read_text().split()}
    assert pids and os.getpid() not in pids  # called inside the worker process, selected by name
    assert finite(m[1]["actor/pg_loss"])


def comparable(step_metrics: dict) -> dict:
    skip = ("timing", "perf/", "training/")
    return {k: v for k, v in step_metrics.items() if not k.startswith(skip) and "timing" not in k}


@pytest.mark.parametrize("backend", ["ray", "local"])
def test_resume_is_exact_across_an_epoch_boundary(ray_session, assets, tmp_path, backend):
    # 8 prompts, 4 per step: an epoch is 2 steps; the interrupted run stops at the epoch boundary
    common = (
        f"trainer.worker_backend={backend}",
        "algorithm.adv_estimator=grpo",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.save_freq=2",
        "trainer.total_epochs=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    )
    _, straight = run(assets, tmp_path / "a", *common, "trainer.total_training_steps=4")
    _, first = run(assets, tmp_path / "b", *common, "trainer.total_training_steps=2")
    _, resumed = run(assets, tmp_path / "b", *common, "trainer.total_training_steps=4")
    assert sorted(straight) == [1, 2, 3, 4] and sorted(resumed) == [1, 2, 3, 4]
    for step in (1, 2):
        assert comparable(first[step]) == comparable(straight[step])
    for step in (3, 4):
        assert comparable(resumed[step]) == comparable(straight[step]), step
        assert resumed[step]["training/epoch"] == 1


def test_bad_config_value_fails_before_anything_starts(assets, tmp_path):
    cfg = load_default_config(
        base_overrides(assets, tmp_path) + ["actor_rollout_ref.actor.policy_loss.loss_mode=nope"], preset="always"
    )
    t0 = time.time()
    with pytest.raises(ValueError, match=r"loss_mode='nope' is not a registered policy loss; registered: \["):
        run_ppo(cfg)
    assert time.time() - t0 < 10
    cfg = load_default_config(base_overrides(assets, tmp_path) + ["data.train_batch_size=3"], preset="always")
    with pytest.raises(
        ValueError, match=r"data\.train_batch_size \* actor_rollout_ref\.rollout\.n|ppo_mini_batch_size=4 is larger"
    ):
        run_ppo(cfg)


def test_bad_data_row_names_the_file_and_row(ray_session, assets, tmp_path):
    rows = rl_rows(8, "train")
    rows[5]["prompt"] = "not a list of messages"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_default_config(
        base_overrides(assets, tmp_path) + ["algorithm.adv_estimator=grpo", f"data.train_files={bad}"], preset="always"
    )
    with pytest.raises(Exception, match=r"bad\.jsonl.*row 5") as info:
        run_ppo(cfg)
    assert "prompt" in str(info.value)


ALGORITHMS = {
    "rloo": ["algorithm.adv_estimator=rloo"],
    "dr_grpo": [
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=False",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
    ],
    "lite_ppo": ["algorithm.adv_estimator=norm", "algorithm.adv_norm={mean_level: group, std_level: batch}"],
    "grpo_passk": ["algorithm.adv_estimator=grpo_passk"],
    "reinforce_plus_plus": ["algorithm.adv_estimator=reinforce_plus_plus", "algorithm.use_kl_in_reward=True"],
    "reinforce_plus_plus_baseline": ["algorithm.adv_estimator=reinforce_plus_plus_baseline"],
    "remax": ["algorithm.adv_estimator=remax"],
    "opo": ["algorithm.adv_estimator=opo"],
    "gpg": ["algorithm.adv_estimator=gpg", "actor_rollout_ref.actor.policy_loss.loss_mode=gpg"],
    "sapo": ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=sapo"],
    "cispo": ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=cispo"],
    "dppo_tv": ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=dppo_tv"],
    "dro": ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=dro"],
    "grpo_multi_rule_rs": [
        "algorithm.adv_estimator=grpo",
        "algorithm.rollout_correction.rollout_rs='token_k1,seq_max_k2'",
        "algorithm.rollout_correction.rollout_rs_threshold='2.0,1.0'",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
    ],
    "grpo_tis": [
        "algorithm.adv_estimator=grpo",
        "algorithm.rollout_correction.rollout_is=token",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    ],
}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_runs_a_step(ray_session, assets, tmp_path, name):
    _, m = run(
        assets,
        tmp_path,
        *ALGORITHMS[name],
        "trainer.total_training_steps=1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
    )
    s = m[1]
    assert finite(s["actor/pg_loss"]) and finite(s["actor/grad_norm"]), s
    assert finite(s["critic/advantages/mean"])
    if name == "grpo_multi_rule_rs":  # both rules reached the actor and reported under upstream's names
        for key in (
            "rollout_rs_token_k1_masked_fraction",
            "rollout_rs_seq_max_k2_masked_fraction",
            "rollout_rs_masked_fraction",
            "kl",
        ):
            assert finite(s[f"rollout_corr/{key}"]), key


def test_reward_model_worker_scores_the_responses(ray_session, assets, tmp_path):
    from transformers import AutoTokenizer

    from verl.utils.model import build_reward_model

    rm_dir = str(tmp_path / "rm")
    build_reward_model(assets["model"]).save_pretrained(rm_dir)
    AutoTokenizer.from_pretrained(assets["model"]).save_pretrained(rm_dir)
    _, m = run(
        assets,
        tmp_path,
        "algorithm.adv_estimator=grpo",
        "reward_model.enable=True",
        f"reward_model.model.path={rm_dir}",
        "reward_model.micro_batch_size_per_gpu=4",
        f"trainer.rollout_data_dir={tmp_path}/rollouts",
        "trainer.total_training_steps=1",
        "actor_rollout_ref.rollout.val_kwargs.n=2",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    )
    rows = [json.loads(line) for line in (tmp_path / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and {"input", "output", "score", "ground_truth"} <= set(rows[0])
    rule = [sum(c.isdigit() for c in r["output"]) / 6 for r in rows]
    # the reward model's scores, not the rule's
    assert any(abs(r["score"] - x) > 1e-6 for r, x in zip(rows, rule, strict=False))
    # validation with n=2 samples per prompt: best@2 and maj@2 (vote over the response texts)
    assert {
        "val-core/e2e_toy/reward/mean@2",
        "val-core/e2e_toy/reward/best@2/mean",
        "val-core/e2e_toy/reward/maj@2/mean",
    } <= set(m[1])


def test_two_data_parallel_workers(ray_session, assets, tmp_path):
    # 4 prompts x 2 responses split over 2 worker processes (FSDP over gloo); validation pads 4 prompts
    _, m = run(
        assets,
        tmp_path,
        "algorithm.adv_estimator=grpo",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "trainer.total_training_steps=1",
        "trainer.balance_batch=True",
    )
    assert finite(m[1]["actor/pg_loss"]) and "val-core/e2e_toy/reward/mean@1" in m[1]
    assert m[1]["perf/throughput"] == pytest.approx(m[1]["perf/total_num_tokens"] / (2 * m[1]["perf/time_per_step"]))


def test_trainer_seed_reaches_the_workers_sampling(assets, tmp_path, ray_session):
    """Two runs that differ only in trainer.seed sample different responses (the seed is passed
    to the workers as VERL_SEED); the same seed gives the same responses (see the resume test)."""
    outputs = []
    for seed in (1, 2):
        run_dir = tmp_path / f"seed{seed}"
        run(
            assets,
            str(run_dir),
            f"trainer.seed={seed}",
            "trainer.total_training_steps=1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=False",
            "algorithm.adv_estimator=grpo",
            f"trainer.rollout_data_dir={run_dir}/dump",
        )
        with open(run_dir / "dump" / "1.jsonl") as fh:
            outputs.append([json.loads(line)["output"] for line in fh])
    assert len(outputs[0]) == len(outputs[1]) > 0
    assert outputs[0] != outputs[1]


# metrics whose last bits differ between two runs of the same code on either backend (the order
# of a reduction over threads); everything else must be equal
# health/entropy_* come from the mean of the rollout log-probs, which (as rollout_mismatch/*) round
# differently when generation runs in another process or backend
NOISY = ("grad_norm", "rollout_mismatch/", "health/entropy")
MACHINE = ("timing", "time", "throughput", "perf/", "memory", "rss")


def _same_numbers(a: dict[int, dict], b: dict[int, dict]) -> list[str]:
    diffs = []
    assert sorted(a) == sorted(b)
    for step in a:
        assert sorted(a[step]) == sorted(b[step]), step
        for key, x in a[step].items():
            y = b[step][key]
            if any(m in key for m in MACHINE) or x == y:
                continue
            if any(n in key for n in NOISY) and math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6):
                continue
            diffs.append(f"step {step} {key}: ray {x} local {y}")
    return diffs


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.adv_estimator=grpo"],
        # critic and a separate reference worker colocated with the actor in one worker
        ["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=True"],
    ],
    ids=["grpo", "gae_critic_ref"],
)
def test_in_process_worker_gives_the_ray_workers_numbers(ray_session, assets, tmp_path, overrides):
    import torch
    import torch.distributed as dist

    threads, env_before = torch.get_num_threads(), dict(os.environ)
    _, ray_metrics = run(assets, str(tmp_path / "ray"), *overrides, "trainer.worker_backend=ray")
    _, local_metrics = run(assets, str(tmp_path / "local"), *overrides, "trainer.worker_backend=local")
    assert _same_numbers(ray_metrics, local_metrics) == []
    assert "critic/vf_loss" in local_metrics[1] or overrides[0].endswith("grpo")
    # the host process is left as it was: no process group, its environment (no rank variables)
    assert not dist.is_initialized()
    assert {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"} == {
        k: v for k, v in env_before.items() if k != "PYTEST_CURRENT_TEST"
    }
    torch.set_num_threads(threads)
