"""Driver-side pieces of the loop, without workers: KL in reward, advantages through the
registry on DataProto, DAPO dynamic sampling, step metrics and validation metrics."""

import math

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.main_ppo import load_default_config
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_timing_metrics, process_validation_metrics
from verl.trainer.ppo.ray_trainer import (
    RayPPOTrainer,
    apply_kl_penalty,
    compute_advantage,
    select_groups_with_variance,
    trim_left_padding,
    trim_to_whole_groups,
)
from verl.trainer.ppo.step_context import StepContext
from verl.trainer.ppo.utils import validate_config


def kl_batch():
    return DataProto.from_dict(
        tensors={
            "old_log_probs": torch.tensor([[-1.0, -1.0, 0.0], [-2.0, -1.0, -1.0]]),
            "ref_log_prob": torch.tensor([[-1.5, -1.0, 0.0], [-2.0, -2.0, -1.0]]),
            "response_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),
            "token_level_scores": torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]]),
        }
    )


def test_apply_kl_penalty_fixed_and_adaptive():
    data = kl_batch()
    ctrl = core_algos.get_kl_controller({"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.1, "horizon": 10})
    data, m = apply_kl_penalty(data, ctrl, kl_penalty="kl")
    # k1 = old - ref, masked: row0 [0.5, 0, 0], row1 [0, 1, 0]
    torch.testing.assert_close(data.batch["token_level_rewards"], torch.tensor([[-0.05, 1.0, 0.0], [0.0, -0.1, 2.0]]))
    # per-sequence masked means 0.25 and 1/3, mean over sequences
    assert m["actor/reward_kl_penalty"] == pytest.approx((0.25 + 1 / 3) / 2)
    assert m["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    # adaptive: e = clip(0.2917/0.1 - 1, -0.2, 0.2) = 0.2; beta *= 1 + 0.2 * 2 / 10
    assert ctrl.value == pytest.approx(0.1 * 1.04)

    fixed = core_algos.get_kl_controller({"type": "fixed", "kl_coef": 0.1})
    apply_kl_penalty(kl_batch(), fixed)
    assert fixed.value == 0.1


def test_compute_advantage_grpo_groups_by_uid_not_position():
    # two groups interleaved out of order: a b a b
    scores = torch.zeros(4, 3)
    scores[:, 1] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    data = DataProto.from_dict(
        tensors={"token_level_rewards": scores, "response_mask": torch.tensor([[1, 1, 0]] * 4)},
        non_tensors={"uid": np.array(["a", "b", "a", "b"], dtype=object)},
    )
    data = compute_advantage(data, "grpo", norm_adv_by_std_in_grpo=True)
    adv = data.batch["advantages"]
    # group a: rewards (1, 0): mean 0.5, std (unbiased) 0.7071 -> +-0.7071; group b: all 0 -> 0
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.7071, 0.0, -0.7071, 0.0]), atol=1e-3, rtol=0)
    assert torch.all(adv[:, 2] == 0)  # padding gets nothing
    assert not adv.requires_grad


def test_compute_advantage_forwards_step_end_mask_for_process_supervision():
    # one response, three steps ending at tokens 1, 2, 4; the middle step's reward is exactly 0, so
    # only an explicit step_end_mask marks it (without it, non-zero rewards define the steps)
    rewards = torch.tensor([[0.0, 0.2, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0, 0.0]])
    ends = torch.tensor([[0, 1, 1, 0, 1], [0, 1, 0, 0, 0]], dtype=torch.bool)
    mask = torch.ones(2, 5)
    uid = np.array(["g", "g"], dtype=object)
    with_mask = compute_advantage(
        DataProto.from_dict(
            tensors={"token_level_rewards": rewards, "response_mask": mask, "step_end_mask": ends},
            non_tensors={"uid": uid},
        ),
        "grpo_process",
        norm_adv_by_std_in_grpo=False,
    )
    without = compute_advantage(
        DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": uid}),
        "grpo_process",
        norm_adv_by_std_in_grpo=False,
    )
    expected = core_algos.get_adv_estimator_fn("grpo_process")(
        token_level_rewards=rewards, response_mask=mask, index=uid, step_end_mask=ends, norm_adv_by_std_in_grpo=False
    )[0]
    torch.testing.assert_close(with_mask.batch["advantages"], expected)
    # the zero-reward step counts in the group mean only when the mask says it is a step
    assert not torch.allclose(with_mask.batch["advantages"], without.batch["advantages"])


def test_grpo_process_with_kl_in_reward_is_rejected():
    with pytest.raises(ValueError, match=r"grpo_process.*use_kl_in_reward=True"):
        validate_config(
            load_default_config(["algorithm.adv_estimator=grpo_process", "algorithm.use_kl_in_reward=True"])
        )


def test_compute_advantage_gae_reference_numbers():
    # ALGORITHMS.md reference: raw advantages [[2.160025, 0.655, 1.0], [0.945, -1.0, 0.0]], then whitened
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.tensor([[1.0, 2, 3], [2, 1, 0]]),
            "values": torch.tensor([[3.0, 4, 2], [2, 2, 0]]),
            "response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
        },
        non_tensors={"uid": np.array(["x", "y"], dtype=object)},
    )
    algo = validate_config(load_default_config([])).algorithm
    data = compute_advantage(data, "gae", gamma=0.9, lam=0.95, config=algo)
    raw = torch.tensor([2.160025, 0.655, 1.0, 0.945, -1.0])
    torch.testing.assert_close(
        data.batch["returns"][data.batch["response_mask"].bool()],
        raw + torch.tensor([3.0, 4, 2, 2, 2]),
        atol=1e-5,
        rtol=0,
    )
    whitened = data.batch["advantages"][data.batch["response_mask"].bool()]
    assert whitened.mean().abs() < 1e-5 and data.batch["advantages"][1, 2] == 0


def group_batch(uids, scores, extra=None):
    non_tensors = {"uid": np.array(uids, dtype=object)}
    if extra:
        non_tensors.update({k: np.array(v, dtype=object) for k, v in extra.items()})
    t = torch.zeros(len(uids), 2)
    t[:, 0] = torch.tensor(scores, dtype=torch.float32)
    return DataProto.from_dict(tensors={"token_level_scores": t}, non_tensors=non_tensors)


def test_select_groups_with_variance_and_trim():
    b = group_batch(["a", "a", "b", "b", "c", "c"], [1, 1, 0, 1, 0, 0])
    kept, n_kept, n_drop = select_groups_with_variance(b, "acc")
    assert (n_kept, n_drop) == (1, 2) and list(kept.non_tensor_batch["uid"]) == ["b", "b"]
    # an extra-info column is used when present (here: variance in acc although scores are equal)
    b = group_batch(["a", "a"], [1, 1], extra={"acc": [True, False]})
    assert select_groups_with_variance(b, "acc")[1] == 1
    with pytest.raises(ValueError, match="filter_groups.metric='nope'"):
        select_groups_with_variance(b, "nope")
    b = group_batch(["a", "a"], [1, 1], extra={"acc": [True, None]})
    with pytest.raises(ValueError, match=r"metric='acc': row 1 holds None, not a number"):
        select_groups_with_variance(b, "acc")

    b = group_batch(["a", "a", "b", "b", "c", "c"], [0] * 6)
    assert list(trim_to_whole_groups(b, 2, n=2, divisor=1).non_tensor_batch["uid"]) == ["a", "a", "b", "b"]
    # 3 groups * 2 rows = 6 rows do not split over 4 workers: 2 groups (4 rows) do
    assert len(trim_to_whole_groups(b, 3, n=2, divisor=4)) == 4
    assert trim_to_whole_groups(b.select_idxs([0, 1]), 3, n=2, divisor=4) is None


class StubGenTrainer(RayPPOTrainer):
    """The real `collect_batch` loop with generation and reward replaced by scripted scores."""

    dp_size = 1

    def __init__(self, overrides, rounds):
        self.config = load_default_config(overrides)
        self.cfg = validate_config(self.config)
        self.callbacks = []
        self.use_critic = self.cfg.use_critic
        self.global_steps = 1
        self.rounds = iter(rounds)
        self.tokenizer = type("Tok", (), {"eos_token_id": 1, "pad_token_id": 0})()

    def generate(self, batch, ctx):
        return batch.repeat(self.cfg.rollout.n, interleave=True)

    def compute_reward(self, batch, ctx):
        s = torch.zeros(len(batch), 2)
        s[:, 0] = torch.tensor(next(self.rounds), dtype=torch.float32)
        batch.batch["token_level_scores"] = s
        return batch


def prompts(n_batches, bs=2):
    for b in range(n_batches):
        yield {
            "input_ids": torch.arange(bs * 3).view(bs, 3) + 100 * b,
            "data_source": np.array(["t"] * bs, dtype=object),
        }


DAPO = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    "actor_rollout_ref.rollout.n=2",
    "algorithm.filter_groups.enable=True",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
]


def test_dynamic_sampling_keeps_generating_until_enough_groups():
    # round 1: group 0 all right (dropped), group 1 mixed; round 2: both mixed -> 3 kept, trimmed to 2
    t = StubGenTrainer(DAPO, rounds=[[1, 1, 0, 1], [0, 1, 1, 0]])
    metrics = {}
    batch = t.collect_batch(prompts(5), StepContext(1, metrics=metrics))
    assert len(batch) == 4 and len(set(batch.non_tensor_batch["uid"])) == 2
    assert batch.non_tensor_batch["uid"][0] == "1-0-1"  # the surviving group of round 0 comes first
    assert metrics["filter_groups/num_gen_batches"] == 2
    assert (metrics["filter_groups/kept_groups"], metrics["filter_groups/dropped_groups"]) == (3, 1)


def test_dynamic_sampling_cap_and_dynamic_batch():
    t = StubGenTrainer(DAPO + ["algorithm.filter_groups.max_num_gen_batches=1"], rounds=[[1, 1, 0, 1]])
    batch = t.collect_batch(prompts(5), StepContext(1))
    assert len(batch) == 2  # capped after one round: train on the one group collected
    t = StubGenTrainer(DAPO + ["algorithm.filter_groups.keep_generating=False"], rounds=[[1, 1, 0, 1]])
    assert len(t.collect_batch(prompts(5), StepContext(1))) == 2
    t = StubGenTrainer(DAPO + ["algorithm.filter_groups.keep_generating=False"], rounds=[[1, 1, 0, 0]])
    assert t.collect_batch(prompts(5), StepContext(1)) is None  # nothing to learn from: the step is skipped
    # with mini-batches of 2 prompts a single surviving group cannot fill one: skipped too
    t = StubGenTrainer(
        DAPO + ["algorithm.filter_groups.keep_generating=False", "actor_rollout_ref.actor.ppo_mini_batch_size=2"],
        rounds=[[1, 1, 0, 1]],
    )
    assert t.collect_batch(prompts(5), StepContext(1)) is None


def test_partial_batches_are_cut_to_whole_mini_batches():
    # 4 prompts per step, mini-batches of 2 prompts; one round keeps 3 groups -> 2 are trained
    over = [
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "algorithm.filter_groups.keep_generating=False",
    ]
    t = StubGenTrainer(DAPO + over, rounds=[[0, 1, 0, 1, 1, 0, 1, 1]])
    batch = t.collect_batch(prompts(5, bs=4), StepContext(1))
    assert len(set(batch.non_tensor_batch["uid"])) == 2 and len(batch) == 4


class PromptWidthTrainer(StubGenTrainer):
    """The real `generate` (prompt trimming included) against a fake rollout that answers 2 tokens."""

    generate = RayPPOTrainer.generate

    def __init__(self, overrides, rounds):
        from verl.workers.rollout.base import assemble_rollout_output

        super().__init__(overrides, rounds)

        class FakeRollout:
            world_size = 1

            def generate_sequences(self, p):
                resp = torch.full((len(p), 2), 5)
                return assemble_rollout_output(
                    p.batch["input_ids"], p.batch["attention_mask"], p.batch["position_ids"], resp, None, [], 0
                )

        self.actor_rollout_wg = FakeRollout()


def left_padded_prompts(lengths_per_round, width=4):
    for lens in lengths_per_round:
        mask = torch.tensor([[0] * (width - n) + [1] * n for n in lens])
        yield {
            "input_ids": mask * 7,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "data_source": np.array(["t"] * len(lens), dtype=object),
        }


def test_dynamic_sampling_concatenates_rounds_of_different_prompt_widths():
    # round 0 prompts are at most 2 tokens long, round 1 prompts 3: generation trims each round to
    # its own width, so the kept rows must be re-aligned before they are concatenated
    t = PromptWidthTrainer(DAPO, rounds=[[1, 1, 0, 1], [0, 1, 1, 0]])
    batch = t.collect_batch(left_padded_prompts([[2, 1], [3, 3]]), StepContext(1))
    assert list(batch.non_tensor_batch["uid"]) == ["1-0-1", "1-0-1", "1-1-0", "1-1-0"]
    assert batch.batch["prompts"].shape == (4, 3) and batch.batch["input_ids"].shape == (4, 5)
    assert batch.batch["attention_mask"].tolist() == [[0, 0, 1, 1, 1]] * 2 + [[1, 1, 1, 1, 1]] * 2
    assert batch.batch["input_ids"][0].tolist() == [0, 0, 7, 5, 5]
    assert batch.batch["position_ids"][0].tolist() == [0, 0, 0, 1, 2]


def test_no_dynamic_sampling_is_one_round():
    t = StubGenTrainer([o for o in DAPO if "filter_groups" not in o], rounds=[[1, 1, 1, 1]])
    assert len(t.collect_batch(prompts(5), StepContext(1))) == 4


def step_batch():
    # 2 responses of width 4 (limit 4), prompts of width 3
    attn = torch.tensor([[0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]])
    rmask = attn[:, 3:].clone()
    return DataProto.from_dict(
        tensors={
            "responses": torch.ones(2, 4, dtype=torch.long),
            "attention_mask": attn,
            "response_mask": rmask,
            "token_level_scores": torch.tensor([[0, 1.0, 0, 0], [0, 0, 0, 0.0]]),
            "token_level_rewards": torch.tensor([[0, 0.5, 0, 0], [0, 0, 0, -0.5]]),
            "advantages": torch.tensor([[1.0, 1.0, 1.0, 9], [-1, -1, -1, -1]]),
            "returns": torch.tensor([[1.0, 1.0, 0, 0], [0, 0, 0, 0]]),
            "values": torch.tensor([[0.5, 0.5, 0, 0], [0, 0, 0, 0]]),
        }
    )


def test_compute_data_metrics_numbers():
    m = compute_data_metrics(step_batch(), use_critic=True, max_response_length=4, max_prompt_length=3)
    assert m["critic/score/mean"] == pytest.approx(0.5) and m["critic/score/max"] == 1.0
    assert m["critic/rewards/mean"] == 0.0 and m["critic/rewards/min"] == -0.5
    assert m["critic/advantages/max"] == 1.0  # the 9 sits on padding and is excluded
    assert m["response_length/mean"] == 3.5 and m["response_length/clip_ratio"] == 0.5
    assert m["prompt_length/mean"] == 2.5 and m["prompt_length/clip_ratio"] == 0.5
    assert "critic/vf_explained_var" in m and "critic/values/mean" in m
    t = compute_timing_metrics(step_batch(), {"gen": 0.6, "update_actor": 1.3, "step": 2.0})
    assert t["timing_s/gen"] == 0.6 and t["timing_per_token_ms/gen"] == pytest.approx(1000 * 0.6 / 7)
    assert t["timing_per_token_ms/update_actor"] == pytest.approx(1000 * 1.3 / 12)


def test_process_validation_metrics():
    out = process_validation_metrics(
        ["ds"] * 4 + ["other"] * 2,
        ["p1", "p1", "p2", "p2", "q", "q"],
        {"reward": [1.0, 0.0, 1.0, 1.0, 0.0, 0.0], "pred": ["7", "8", "3", "3", "1", "2"]},
    )
    ds = out["ds"]["reward"]
    assert ds["mean@2"] == pytest.approx(0.75)
    # best of 2 draws with replacement from (1, 0) is 1 with probability 3/4; from (1, 1) always 1
    assert ds["best@2/mean"] == pytest.approx((0.75 + 1.0) / 2, abs=0.05)
    assert ds["worst@2/mean"] == pytest.approx((0.25 + 1.0) / 2, abs=0.05)
    assert "maj@2/mean" in ds
    assert out["other"]["reward"]["mean@2"] == 0.0
    single = process_validation_metrics(["d", "d"], ["a", "b"], {"reward": [1.0, 0.0]})
    assert single == {"d": {"reward": {"mean@1": 0.5, "std@1": 0.0}}}


def test_trim_left_padding_keeps_every_valid_token():
    mask = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]])
    ids = torch.tensor([[0, 0, 0, 7, 8], [0, 0, 5, 6, 7]])
    pos = torch.tensor([[0, 0, 0, 0, 1], [0, 0, 0, 1, 2]])
    d = trim_left_padding(DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos}))
    assert d.batch["input_ids"].tolist() == [[0, 7, 8], [5, 6, 7]]
    assert d.batch["attention_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert d.batch["position_ids"].tolist() == [[0, 0, 1], [0, 1, 2]]
    full = DataProto.from_dict(tensors={"input_ids": ids[:, 2:], "attention_mask": mask[:, 2:]})
    assert trim_left_padding(full).batch["input_ids"].shape == (2, 3)  # nothing to trim


def test_cpu_peak_flops_measurement_leaves_the_global_rng_alone():
    # fit() measures it at every start, also right after a resume restored the driver's RNG
    from verl.trainer.ppo.metric_utils import peak_flops_per_worker

    before = torch.get_rng_state()
    assert peak_flops_per_worker("cpu") > 0
    assert torch.equal(torch.get_rng_state(), before)


def test_dp_compute_lets_the_dispatcher_pad_to_the_group_size_and_drop_the_padding():
    from verl.protocol import DataProtoConfig, unpad_dataproto
    from verl.single_controller.base.decorator import (
        _padding_size_key,
        collect_dp_compute_data_proto,
        dispatch_dp_compute_data_proto,
    )
    from verl.trainer.ppo.ray_trainer import dp_compute

    class ThreeWorkers:
        """Dispatch -> one call per rank -> collect -> unpad, as the Ray proxy does."""

        world_size = 3

        def compute_ref_log_prob(self, data):
            self.received = len(data)
            args, kwargs = dispatch_dp_compute_data_proto(self, data)
            pad = kwargs.pop(_padding_size_key, 0)
            self.rows = [len(chunk) for chunk in args[0]]
            outs = [DataProto.from_dict(tensors={"ref_log_prob": chunk.batch["x"] * 2.0}) for chunk in args[0]]
            return unpad_dataproto(collect_dp_compute_data_proto(self, outs), pad)

    data = DataProto.from_dict(tensors={"x": torch.arange(8.0).unsqueeze(1)})
    group = ThreeWorkers()
    out = dp_compute(group, "compute_ref_log_prob", data)
    assert group.received == 8 and group.rows == [3, 3, 3]  # the dispatcher, not the trainer, pads to 9
    assert out.batch["ref_log_prob"].squeeze(1).tolist() == [2.0 * i for i in range(8)]
    # the caller's batch does not turn padding on (a later update of it must never be padded)
    assert DataProtoConfig.auto_padding_key not in data.meta_info and not data.is_padding_enabled()
    assert DataProtoConfig.auto_padding_key not in out.meta_info


def test_validation_metrics_match_the_per_prompt_bootstrap():
    # the vectorised statistics equal bootstrap_metric + calc_maj_val prompt by prompt (ties in
    # the vote included: 4 answers over 3-5 samples), for groups of different sizes
    from verl.trainer.ppo.metric_utils import bootstrap_metric, calc_maj_val

    rng = np.random.default_rng(3)
    sizes = [5, 3, 4, 1]
    uids = [u for u, n in enumerate(sizes) for _ in range(n)]
    reward = rng.random(len(uids)).round(2).tolist()
    pred = rng.integers(0, 4, len(uids)).tolist()
    out = process_validation_metrics(["d"] * len(uids), uids, {"reward": reward, "pred": pred}, n_bootstrap=200)["d"][
        "reward"
    ]

    expected: dict[str, list[float]] = {}
    for u, n in enumerate(sizes):
        rows = [i for i, x in enumerate(uids) if x == u]
        vals = np.array([reward[i] for i in rows])
        expected.setdefault(f"mean@{n}", []).append(vals.mean())
        for k in sorted({2**p for p in range(1, int(np.log2(n)) + 1)} | {n}) if n > 1 else []:
            (best, _), (worst, _) = bootstrap_metric(vals, k, [np.max, np.min], n_bootstrap=200)
            samples = [{"pred": pred[i], "val": reward[i]} for i in rows]
            [(maj, maj_std)] = bootstrap_metric(samples, k, [lambda d: calc_maj_val(d, "pred", "val")], n_bootstrap=200)
            for name, v in (
                (f"best@{k}/mean", best),
                (f"worst@{k}/mean", worst),
                (f"maj@{k}/mean", maj),
                (f"maj@{k}/std", maj_std),
            ):
                expected.setdefault(name, []).append(v)
    assert "maj@4/mean" in out and "best@5/mean" in out and "mean@1" in out
    for name, vs in expected.items():
        assert out[name] == pytest.approx(float(np.mean(vs)), abs=1e-12), name


def test_reward_extra_info_columns_hold_one_object_per_row():
    # a scorer returning a list per response (equal lengths in one round, other lengths in the
    # next): the column stays 1-D, so rounds of dynamic sampling can be concatenated
    t = StubGenTrainer(DAPO, rounds=[])
    t.use_rm = False

    def batch_with_steps(steps):
        t.reward_fn = lambda data, return_dict: {
            "reward_tensor": torch.zeros(len(data), 2),
            "reward_extra_info": {"steps": steps, "acc": [1.0] * len(data)},
        }
        b = DataProto.from_dict(tensors={"responses": torch.zeros(len(steps), 2)})
        return RayPPOTrainer.compute_reward(t, b, StepContext(1))

    a, b = batch_with_steps([[1, 2], [3, 4]]), batch_with_steps([[5, 6, 7], [8, 9, 0]])
    assert a.non_tensor_batch["steps"].shape == (2,) and a.non_tensor_batch["steps"][1] == [3, 4]
    assert DataProto.concat([a, b]).non_tensor_batch["steps"][3] == [8, 9, 0]


def test_remax_baseline_is_scored_by_the_reward_model_when_there_is_one():
    t = PromptWidthTrainer(["algorithm.adv_estimator=remax", "actor_rollout_ref.rollout.n=2"], rounds=[])
    t.use_rm = True

    class FakeRM:
        world_size = 1

        def compute_rm_score(self, data):
            return DataProto.from_dict(tensors={"rm_scores": torch.full(data.batch["responses"].shape, 0.5)})

    t.rm_wg = FakeRM()
    t.reward_fn = lambda data, return_dict: {
        "reward_tensor": data.batch["rm_scores"] if "rm_scores" in data.batch.keys() else torch.zeros(len(data), 2)
    }
    gen_in = DataProto.from_single_dict(next(left_padded_prompts([[2, 2, 3, 3]])))
    gen_in.non_tensor_batch.pop("data_source")
    batch = DataProto.from_dict(
        tensors={"x": torch.zeros(4)}, non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)}
    )
    out = RayPPOTrainer.greedy_baseline(t, batch, gen_in)
    assert out.batch["reward_baselines"].tolist() == [1.0] * 4  # 0.5 on each of the 2 response tokens


class FitStub(RayPPOTrainer):
    """The real `fit()` with checkpoint loading, validation and batch collection scripted."""

    def __init__(self, tmp_path, overrides, resumed_step=0):
        self.config = load_default_config(
            [
                "trainer.logger=[file]",
                f"trainer.log_dir={tmp_path}",
                "trainer.plot=False",
                "trainer.peak_flops_per_worker=1e9",
                "trainer.total_training_steps=3",
            ]
            + overrides
        )
        self.cfg = validate_config(self.config)
        self.callbacks, self.global_steps, self.epoch, self.total_training_steps = [], 0, 0, 3
        self.val_reward_fn, self.device_name, self.resumed_step, self.trained = object(), "cpu", resumed_step, 0

    def _load_checkpoint(self):
        self.global_steps = self.resumed_step
        return self.global_steps

    def _validate(self):
        return {"val-core/t/reward/mean@1": float(self.global_steps)}

    def collect_batch(self, prompts, ctx):
        self.trained += 1
        return None  # a skipped step: nothing else of the loop runs

    def _prompt_stream(self):
        return iter(())


@pytest.mark.parametrize("overrides, resumed", [([], 0), (["trainer.val_before_train=False"], 0), ([], 2)])
def test_val_only_validates_the_restored_policy_and_never_trains(tmp_path, overrides, resumed):
    t = FitStub(tmp_path, ["trainer.val_only=True"] + overrides, resumed_step=resumed)
    assert t.fit() == {"val-core/t/reward/mean@1": float(resumed)}
    assert t.trained == 0 and t.global_steps == resumed


def test_an_empty_validation_set_is_named():
    from verl.trainer.ppo.ray_trainer import ResourcePoolManager
    from verl.trainer.ppo.utils import Role

    config = load_default_config(["algorithm.adv_estimator=grpo"])
    pools = ResourcePoolManager({"global_pool": [1]}, {Role.ActorRollout: "global_pool"}, use_gpu=False)
    with pytest.raises(ValueError, match=r"the validation set data\.val_files=None has no prompts"):
        RayPPOTrainer(config, None, {Role.ActorRollout: object}, pools, train_dataset=[{"x": 1}] * 32, val_dataset=[])


# ---------------------------------------------------------------------------------------------
# issue 10: compute_advantage's defaults never override the config; one explained variance
# ---------------------------------------------------------------------------------------------


def _adv_batch(rewards, uids):
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": torch.ones_like(rewards)},
        non_tensors={"uid": np.array(uids, dtype=object)},
    )


def test_compute_advantage_reinforce_pp_uses_config_gamma_not_the_default():
    from verl.trainer.config.algorithm import AlgoConfig

    # reward 1 on the last of 3 tokens, config gamma 0.5: returns (0.25, 0.5, 1) (the default
    # argument gamma=1.0 would give (1, 1, 1))
    data = compute_advantage(
        _adv_batch([[0.0, 0.0, 1.0]], ["a"]),
        "reinforce_plus_plus",
        config=AlgoConfig(adv_estimator="reinforce_plus_plus", gamma=0.5),
    )
    torch.testing.assert_close(data.batch["returns"], torch.tensor([[0.25, 0.5, 1.0]]))
    # without a config the explicit argument is used
    data = compute_advantage(_adv_batch([[0.0, 0.0, 1.0]], ["a"]), "reinforce_plus_plus", gamma=0.5)
    torch.testing.assert_close(data.batch["returns"], torch.tensor([[0.25, 0.5, 1.0]]))


def test_compute_advantage_grpo_passk_uses_config_norm_flag_not_the_default():
    from verl.trainer.config.algorithm import AlgoConfig

    # group rewards (1, 0.25): the best gets r_max - r_second = 0.75; divided by the unbiased std
    # 0.530330 only when normalising (1.414211)
    uids = ["g", "g"]
    off = compute_advantage(
        _adv_batch([[1.0], [0.25]], uids),
        "grpo_passk",
        config=AlgoConfig(adv_estimator="grpo_passk", norm_adv_by_std_in_grpo=False),
    )
    torch.testing.assert_close(off.batch["advantages"], torch.tensor([[0.75], [0.0]]))
    on = compute_advantage(
        _adv_batch([[1.0], [0.25]], uids),
        "grpo_passk",
        norm_adv_by_std_in_grpo=False,
        config=AlgoConfig(adv_estimator="grpo_passk", norm_adv_by_std_in_grpo=True),
    )
    assert on.batch["advantages"][0, 0].item() == pytest.approx(0.75 / (0.530330 + 1e-6), abs=1e-5)
    # grpo itself takes the explicit argument (upstream's precedence)
    grpo = compute_advantage(
        _adv_batch([[1.0], [0.25]], uids),
        "grpo",
        norm_adv_by_std_in_grpo=False,
        config=AlgoConfig(norm_adv_by_std_in_grpo=True),
    )
    torch.testing.assert_close(grpo.batch["advantages"], torch.tensor([[0.375], [-0.375]]))


def test_compute_advantage_calls_an_upstream_style_estimator_without_kwargs():
    @core_algos.register_adv_est("test_fixed_signature_tmp")
    def fixed(token_level_rewards, response_mask, index, config=None):
        return token_level_rewards * 2, token_level_rewards

    try:
        data = compute_advantage(_adv_batch([[1.0, 2.0]], ["a"]), "test_fixed_signature_tmp", config={"gamma": 1.0})
        torch.testing.assert_close(data.batch["advantages"], torch.tensor([[2.0, 4.0]]))
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY.pop("test_fixed_signature_tmp")


def test_vf_explained_var_has_upstream_definition():
    from verl.trainer.ppo.metric_utils import compute_vf_explained_var

    # returns (1, 2, 3, 4), values (1, 2, 3, 3): R - V = (0, 0, 0, 1)
    # unbiased Var(R - V) = 0.75 / 3 = 0.25, Var(R) = 5 / 3 = 1.666667
    # 1 - 0.25 / (1.666667 + 1e-5) = 0.8500015 (biased variances without eps would give 0.85)
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0, 9.0]])
    values = torch.tensor([[1.0, 2.0, 3.0, 3.0, -9.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    assert compute_vf_explained_var(values, returns, mask) == pytest.approx(1 - 0.25 / (5 / 3 + 1e-5), abs=1e-9)
    assert math.isnan(compute_vf_explained_var(values, returns, torch.tensor([[1, 0, 0, 0, 0]])))


def test_variance_proxy_metrics_numbers():
    from verl.trainer.ppo.metric_utils import compute_variance_proxy_metrics

    # pi = 0.5, sum_pi_squared = 0.5: w = 1 - 1 + 0.5 = 0.5 per token, W = 1 per response;
    # A = (1, -2): proxy2 = mean(1 * 1, 4 * 1) = 2.5; gradient norm 1: proxy3 = (2.5 - 1) / (2 - 1)
    tensors = {
        "old_log_probs": torch.full((2, 2), math.log(0.5)),
        "sum_pi_squared": torch.full((2, 2), 0.5),
        "advantages": torch.tensor([[1.0, 1.0], [-2.0, -2.0]]),
        "response_mask": torch.ones(2, 2),
    }
    m = compute_variance_proxy_metrics(DataProto.from_dict(tensors=dict(tensors)), gradient_norm=1.0)
    assert m["variance_proxy/proxy2_total_power"] == pytest.approx(2.5)
    assert m["variance_proxy/proxy1_signal_strength"] == pytest.approx(1.0)
    assert m["variance_proxy/proxy3_pure_noise"] == pytest.approx(1.5)
    assert m["variance_proxy/expected_a_squared"] == pytest.approx(2.5) and m[
        "variance_proxy/expected_w"
    ] == pytest.approx(1.0)
    # IS weights (2, 1) per response: proxy2 = mean(4 * 1 * 1, 1 * 4 * 1) = 4; W scaled by w^2: mean(4, 1)
    m = compute_variance_proxy_metrics(
        DataProto.from_dict(tensors=dict(tensors, rollout_is_weights=torch.tensor([[2.0, 2.0], [1.0, 1.0]])))
    )
    assert m["variance_proxy/proxy2_total_power"] == pytest.approx(4.0)
    assert m["variance_proxy/expected_w"] == pytest.approx(2.5) and m["variance_proxy/proxy3_pure_noise"] == 0.0
    tensors.pop("sum_pi_squared")
    assert compute_variance_proxy_metrics(DataProto.from_dict(tensors=tensors)) == {}


def test_data_metrics_report_aborted_responses_and_turns():
    attn = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    rmask = attn[:, 2:]
    data = DataProto.from_dict(
        tensors={
            "responses": torch.zeros(3, 2, dtype=torch.long),
            "attention_mask": attn,
            "response_mask": rmask,
            "token_level_scores": torch.zeros(3, 2),
            "token_level_rewards": torch.zeros(3, 2),
        },
        non_tensors={"__num_turns__": np.array([1, 3, 2]), "tool_call_counts": np.array([0, 2, 1])},
    )
    m = compute_data_metrics(data, use_critic=False, max_response_length=2)
    # response lengths (1, 0, 2): one aborted; the others average 1.5, one of two at the limit
    assert m["response/aborted_ratio"] == pytest.approx(1 / 3)
    assert m["response_length_non_aborted/mean"] == pytest.approx(1.5) and m["response_length_non_aborted/min"] == 1.0
    assert m["response_length_non_aborted/clip_ratio"] == pytest.approx(0.5)
    assert (m["num_turns/min"], m["num_turns/max"], m["num_turns/mean"]) == (1.0, 3.0, 2.0)
    assert m["tool_call_counts/mean"] == pytest.approx(1.0)


def test_bypass_mode_uses_rollout_log_probs_as_old_and_turns_the_shortcut_off():
    from types import SimpleNamespace

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    rc = SimpleNamespace(bypass_mode=True, rollout_rs=None, rollout_is="token")
    cfg = SimpleNamespace(
        algorithm=SimpleNamespace(rollout_correction=rc, use_kl_in_reward=False, adv_estimator="grpo"),
        actor=SimpleNamespace(ppo_mini_batch_size=4, ppo_epochs=1),
        data=SimpleNamespace(train_batch_size=4),
    )
    fake = SimpleNamespace(cfg=cfg)
    fake.bypass_mode = lambda: RayPPOTrainer.bypass_mode(fake)
    roll = torch.tensor([[-1.0, -2.0]])
    batch = DataProto.from_dict(tensors={"rollout_log_probs": roll, "response_mask": torch.ones(1, 2)})
    out = RayPPOTrainer.compute_old_log_prob(fake, batch, StepContext(1))  # no worker call in bypass mode
    assert torch.equal(out.batch["old_log_probs"], roll) and "use_current_as_old_log_prob" not in out.meta_info
    assert RayPPOTrainer.can_skip_old_log_prob(fake) is False
    rc.bypass_mode = False
    assert RayPPOTrainer.can_skip_old_log_prob(fake) is True
    rc.rollout_is_batch_normalize = True  # the batch mean needs old_log_probs of the whole batch
    assert RayPPOTrainer.can_skip_old_log_prob(fake) is False
