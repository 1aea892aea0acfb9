"""The reward loop in this process: per-sample scoring (sync and async functions), score placement,
errors counted per sample, DAPO's overlong penalty, rate limits, config keys and their legacy
spellings, and the choice between the reward loop and the driver-side managers."""

import asyncio
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.experimental.reward_loop import RewardLoopManager, RewardLoopWorker, uses_reward_loop
from verl.experimental.reward_loop.reward_manager import RewardManagerBase, get_reward_manager_cls, register
from verl.experimental.reward_loop.reward_manager.limited import AsyncTokenBucket
from verl.protocol import DataProto
from verl.workers.reward_manager import NaiveRewardManager as DriverNaive

PAD, EOS = 0, 1


class DigitTokenizer:
    """ids 2..11 are the digits 0..9; 0 = pad, 1 = eos (special: skipped when decoding)."""

    eos_token_id = EOS
    pad_token_id = PAD

    def encode(self, s):
        return [int(c) + 2 for c in s]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(str(t - 2) for t in ids if t >= 2 or not skip_special_tokens)

    def batch_decode(self, seqs, skip_special_tokens=True):
        return [self.decode(s, skip_special_tokens) for s in seqs]


def make_batch(responses, answers, resp_width=6, data_source="toy"):
    """Prompts '12' left-padded to width 4; responses right-padded (an EOS when ending in '$')."""
    tok = DigitTokenizer()
    prompts, resps, attn, rmask = [], [], [], []
    for r in responses:
        ids = (tok.encode(r.rstrip("$")) + ([EOS] if r.endswith("$") else []))[:resp_width]
        prompts.append([PAD, PAD, 3, 4])
        resps.append(ids + [PAD] * (resp_width - len(ids)))
        rm = [1] * len(ids) + [0] * (resp_width - len(ids))
        attn.append([0, 0, 1, 1] + rm)
        rmask.append(rm)
    n = len(responses)
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor(prompts),
            "responses": torch.tensor(resps),
            "attention_mask": torch.tensor(attn),
            "response_mask": torch.tensor(rmask),
        },
        non_tensors={
            "data_source": np.array([data_source] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": a} for a in answers], dtype=object),
            "extra_info": np.array([{"index": i} for i in range(n)], dtype=object),
        },
    )


def config(**reward):
    return OmegaConf.create({"reward": {"num_workers": 1, **reward}, "data": {"reward_fn_key": "data_source"}})


def exact(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)


def manager(fn, **reward):
    cfg = config(**reward)
    worker = RewardLoopWorker(cfg, tokenizer=DigitTokenizer())
    worker.reward_manager.compute_score = fn
    worker.reward_manager.is_async_reward_score = asyncio.iscoroutinefunction(fn)
    return worker.reward_manager


def run(coro):
    return asyncio.run(coro)


def test_local_manager_places_scores_and_equals_the_driver_side_manager():
    data = make_batch(["3$", "45$", "7", ""], ["3", "4", "7", "1"])
    loop = RewardLoopManager(config(), tokenizer=DigitTokenizer(), backend="local")
    loop._local.reward_manager.compute_score = exact
    out = loop(data, return_dict=True)
    expected = torch.zeros(4, 6)
    expected[0, 1] = 1.0  # "3" + eos: last valid token at 1
    expected[2, 0] = 1.0  # "7" without eos: position 0
    assert torch.equal(out["reward_tensor"], expected)
    assert out["reward_extra_info"]["acc"] == [1.0, 0.0, 1.0, 0.0]
    assert out["reward_extra_info"]["score_error"] == [False] * 4
    assert out["reward_extra_info"]["truncated"] == [False, False, True, True]
    driver = DriverNaive(DigitTokenizer(), compute_score=exact, timeout=None)
    assert torch.equal(driver(data), out["reward_tensor"])
    scored = loop.compute_rm_score(data)
    assert torch.equal(scored.batch["rm_scores"], expected)
    assert "acc" in scored.meta_info["reward_extra_keys"]
    loop.close()
    loop.close()  # idempotent


def test_sync_function_runs_off_the_event_loop_and_async_functions_are_awaited():
    threads = []

    def sync_fn(data_source, solution_str, ground_truth, extra_info=None):
        threads.append(threading.get_ident())
        return {"score": 0.5, "pred": solution_str}

    async def async_fn(data_source, solution_str, ground_truth, extra_info=None):
        await asyncio.sleep(0)
        return 2.0

    data = make_batch(["3$", "4$"], ["3", "3"])
    m = manager(sync_fn)
    out = run(RewardLoopWorker.compute_score_batch(_worker_of(m), data))
    assert [o["reward_score"] for o in out] == [0.5, 0.5]
    assert out[0]["reward_extra_info"]["pred"] == "3"
    assert threading.get_ident() not in threads  # the loop ran here; the function in the pool
    m = manager(async_fn)
    assert m.is_async_reward_score
    assert [o["reward_score"] for o in run(_worker_of(m).compute_score_batch(data))] == [2.0, 2.0]


def _worker_of(reward_manager):
    worker = RewardLoopWorker.__new__(RewardLoopWorker)
    worker.reward_manager = reward_manager
    return worker


def test_samples_of_a_batch_are_scored_concurrently():
    """Every call waits until all 6 have started: sequential scoring would time out (error)."""
    started = []

    async def gate(data_source, solution_str, ground_truth, extra_info=None):
        started.append(1)
        while len(started) < 6:
            await asyncio.sleep(0.01)
        return 1.0

    data = make_batch(["3$"] * 6, ["3"] * 6)
    out = run(_worker_of(manager(gate, reward_kwargs={"timeout": 20})).compute_score_batch(data))
    assert [o["reward_score"] for o in out] == [1.0] * 6
    assert not any(o["reward_extra_info"]["score_error"] for o in out)


def test_errors_are_counted_per_sample_and_never_silent():
    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        return {"0": lambda: 1 / 0, "1": lambda: float("nan"), "2": lambda: "high", "3": lambda: 0.25}[solution_str]()

    data = make_batch(["0$", "1$", "2$", "3$"], ["x"] * 4)
    out = run(_worker_of(manager(scorer, reward_kwargs={"error_score": -1.0})).compute_score_batch(data))
    assert [o["reward_score"] for o in out] == [-1.0, -1.0, -1.0, 0.25]
    assert [o["reward_extra_info"]["score_error"] for o in out] == [True, True, True, False]
    assert not any(o["reward_extra_info"]["score_timeout"] for o in out)

    with pytest.raises(RuntimeError, match=r"scoring function .*scorer failed on a sample.*ZeroDivisionError"):
        run(_worker_of(manager(scorer, reward_kwargs={"error_score": None})).compute_score_batch(data[:1]))

    def unknown_source(data_source, solution_str, ground_truth, extra_info=None):
        raise NotImplementedError(f"no scorer for {data_source}")

    with pytest.raises(NotImplementedError, match="no scorer for toy"):
        run(_worker_of(manager(unknown_source)).compute_score_batch(data[:1]))


def test_a_call_past_its_timeout_is_a_counted_timeout():
    async def slow(data_source, solution_str, ground_truth, extra_info=None):
        await asyncio.sleep(30)

    def slow_sync(data_source, solution_str, ground_truth, extra_info=None):
        time.sleep(1.0)
        return 1.0

    data = make_batch(["3$"], ["3"])
    for fn in (slow, slow_sync):
        (out,) = run(_worker_of(manager(fn, reward_kwargs={"timeout": 0.05})).compute_score_batch(data))
        assert out["reward_score"] == 0.0
        assert out["reward_extra_info"]["score_timeout"] and out["reward_extra_info"]["score_error"]


def test_truncation_penalty_replaces_the_score_of_a_response_without_eos():
    data = make_batch(["3$", "3"], ["3", "3"])
    m = manager(exact, reward_kwargs={"truncation_penalty": -0.5})
    assert [o["reward_score"] for o in run(_worker_of(m).compute_score_batch(data))] == [1.0, -0.5]


def test_dapo_overlong_penalty_by_hand():
    # max_resp_len 6, buffer 4: safe length 2; a 5-token response loses (5 - 2) / 4 = 0.75
    kwargs = {"overlong_buffer_cfg": {"enable": True, "len": 4, "penalty_factor": 1.0, "log": True}, "max_resp_len": 6}
    cfg = config(reward_kwargs=kwargs, reward_manager={"name": "dapo"})
    m = RewardLoopWorker(cfg, tokenizer=DigitTokenizer()).reward_manager
    m.compute_score = exact
    out = run(_worker_of(m).compute_score_batch(make_batch(["3$", "3333$"], ["3", "3333"])))
    assert [o["reward_score"] for o in out] == [1.0, 1.0 - 0.75]
    assert out[1]["reward_extra_info"]["overlong"] is True
    with pytest.raises(ValueError, match="max_resp_len must be provided"):
        get_reward_manager_cls("dapo")(
            config(reward_kwargs={"overlong_buffer_cfg": {"enable": True, "len": 2}}), None, exact
        )


def test_unknown_reward_kwargs_and_manager_names_fail_naming_what_is_accepted():
    with pytest.raises(ValueError, match=r"reward.reward_kwargs has key\(s\) \['num_processes'\].*accepted"):
        manager(exact, reward_kwargs={"num_processes": 4})
    with pytest.raises(ValueError, match=r"Unknown reward manager: nope.*reward-loop managers: .*naive.*prime"):
        uses_reward_loop(config(reward_manager={"name": "nope"}))
    assert uses_reward_loop(config(reward_manager={"name": "naive"}))
    assert not uses_reward_loop(config(reward_manager={"name": "prime"}))


def test_a_registered_user_manager_is_selected_by_name():
    @register("test_reward_loop_constant")
    class Constant(RewardManagerBase):
        async def run_single(self, data):
            return {"reward_score": 3.0, "reward_extra_info": {"constant": True}}

    cfg = config(reward_manager={"name": "test_reward_loop_constant"})
    loop = RewardLoopManager(cfg, tokenizer=DigitTokenizer(), backend="local")
    out = loop(make_batch(["3$", "44$"], ["3", "3"]), return_dict=True)
    assert out["reward_tensor"][0, 1] == 3.0 and out["reward_tensor"][1, 2] == 3.0
    assert out["reward_extra_info"]["constant"] == [True, True]


def test_rate_limited_manager_bounds_concurrency():
    in_flight, peak = [0], [0]

    async def probe(data_source, solution_str, ground_truth, extra_info=None):
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await asyncio.sleep(0.01)
        in_flight[0] -= 1
        return 1.0

    cfg = config(reward_manager={"name": "rate_limited"}, max_concurrent=2, timeout=10.0)
    m = RewardLoopWorker(cfg, tokenizer=DigitTokenizer()).reward_manager
    m.compute_score = probe
    out = run(_worker_of(m).compute_score_batch(make_batch(["3$"] * 7, ["3"] * 7)))
    assert [o["reward_score"] for o in out] == [1.0] * 7
    assert peak[0] == 2


def test_token_bucket_takes_an_oversized_request_on_credit():
    async def go():
        bucket = AsyncTokenBucket(rate_limit=1000.0, max_tokens=10.0)
        await bucket.acquire(4.0)
        assert bucket.tokens == pytest.approx(6.0, abs=0.1)
        await bucket.acquire(15.0)  # 9 tokens short: waits ~9 ms, then owes them
        assert bucket.tokens < 0

    run(go())


def test_legacy_reward_keys_move_into_the_reward_section_with_one_warning():
    from verl.trainer.config.upstream_keys import check_upstream_surface
    from verl.trainer.main_ppo import load_default_config

    cfg = load_default_config(
        ["custom_reward_function.path=/tmp/fn.py", "reward_model.reward_manager=dapo", "+reward_model.num_workers=3"]
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = check_upstream_surface(cfg)
        again = check_upstream_surface(out)
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning) and "reward" in str(w.message)]
    assert len(deprecations) == 1
    text = str(deprecations[0].message)
    assert "custom_reward_function.path" in text and "reward.custom_reward_function.path" in text
    for c in (out, again):
        assert c.reward.custom_reward_function.path == "/tmp/fn.py"
        assert c.reward.reward_manager.name == "dapo" and c.reward.num_workers == 3
        assert c.custom_reward_function.path == "/tmp/fn.py"  # what the driver-side code reads


def test_reward_section_defaults_are_upstreams():
    from verl.trainer.config.reward import RewardConfig
    from verl.trainer.config.upstream_keys import check_upstream_surface
    from verl.trainer.main_ppo import load_default_config
    from verl.utils.config import omega_conf_to_dataclass

    r = omega_conf_to_dataclass(check_upstream_surface(load_default_config([], preset=False)).reward, RewardConfig)
    assert (r.num_workers, r.reward_manager.source, r.reward_manager.name) == (8, "register", "naive")
    assert (r.custom_reward_function.path, r.custom_reward_function.name) == (None, "compute_score")
    assert (r.reward_model.enable, r.reward_model.n_gpus_per_node, r.reward_model.nnodes) == (False, 8, 0)
    assert (r.sandbox_fusion.url, r.sandbox_fusion.max_concurrent, r.sandbox_fusion.memory_limit_mb) == (None, 64, 1024)
    with pytest.raises(ValueError, match=r"reward.num_workers=0 must be an integer >= 1"):
        RewardConfig(num_workers=0)
    with pytest.raises(ValueError, match=r"reward.reward_manager.source='pip' is not allowed"):
        omega_conf_to_dataclass({"reward_manager": {"source": "pip"}}, RewardConfig)


def test_weighted_components_are_summed_and_each_is_a_column(tmp_path):
    from verl.trainer.ppo.reward import reward_component_metrics

    example = str(__import__("pathlib").Path(__file__).resolve().parents[3] / "docs/examples/reward_components.py")
    components = [
        {"name": "correct", "path": example, "function": "correct", "weight": 1.0},
        {"name": "brevity", "path": example, "function": "brevity", "weight": 0.5, "reward_kwargs": {"limit": 2}},
    ]
    loop = RewardLoopManager(config(components=components), tokenizer=DigitTokenizer(), backend="local")
    # "3": correct, short (brevity 1); "456": wrong, 3 chars (brevity 2 - 3/2 = 0.5); "4444": wrong, brevity 0
    out = loop(make_batch(["3$", "456$", "4444$"], ["3", "4", "4"]), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0 + 0.5 * 1.0, 0.0 + 0.5 * 0.5, 0.0]
    assert out["reward_extra_info"]["correct"] == [1.0, 0.0, 0.0]
    assert out["reward_extra_info"]["brevity"] == [1.0, 0.5, 0.0]
    metrics = reward_component_metrics(loop, out["reward_extra_info"])
    assert metrics == {"reward/correct/mean": pytest.approx(1 / 3), "reward/brevity/mean": pytest.approx(0.5)}


def test_bad_components_fail_naming_the_entry():
    for bad, match in (
        ([{"name": "a", "wieght": 1}], r"reward.components\[0\] has unknown key\(s\) \['wieght'\]"),
        ([{"name": "a"}, {"name": "a"}], r"reward.components\[1\].name='a' must be a unique name"),
        ([{"name": "a", "weight": "high"}], r"reward.components\[0\].weight='high' must be a number"),
    ):
        with pytest.raises(ValueError, match=match):
            RewardLoopWorker(config(components=bad), tokenizer=DigitTokenizer())
    with pytest.raises(ValueError, match="reward.components and reward.custom_reward_function.path"):
        cfg = config(components=[{"name": "a"}], custom_reward_function={"path": "x.py"})
        RewardLoopWorker(cfg, tokenizer=DigitTokenizer())


def test_a_failing_component_is_a_counted_error_naming_it():
    from verl.experimental.reward_loop.components import Component, WeightedComponents

    def broken(data_source, solution_str, ground_truth, extra_info=None):
        return "n/a"

    fn = WeightedComponents([Component("ok", exact, 1.0), Component("broken", broken, 1.0)])
    m = manager(fn)
    (out,) = run(_worker_of(m).compute_score_batch(make_batch(["3$"], ["3"])))
    assert out["reward_extra_info"]["score_error"] and out["reward_score"] == 0.0


def test_importlib_source_picks_the_path_by_the_class(tmp_path):
    """`source: importlib` loads `module.path:name`; a `RewardManagerBase` runs in the reward loop,
    a driver-side `AbstractRewardManager` (the legacy `file.py:Class` spelling) keeps the driver."""
    loop_file = tmp_path / "loop_manager.py"
    loop_file.write_text(
        "from verl.experimental.reward_loop.reward_manager import RewardManagerBase\n\n"
        "class Half(RewardManagerBase):\n"
        "    async def run_single(self, data):\n"
        "        return {'reward_score': 0.5, 'reward_extra_info': {}}\n"
    )
    cfg = config(reward_manager={"source": "importlib", "name": "Half", "module": {"path": str(loop_file)}})
    assert uses_reward_loop(cfg)
    loop = RewardLoopManager(cfg, tokenizer=DigitTokenizer(), backend="local")
    assert loop(make_batch(["3$"], ["3"])).sum().item() == 0.5
    example = __import__("pathlib").Path(__file__).resolve().parents[3] / "docs/examples/custom_reward_manager.py"
    driver = {"source": "importlib", "name": "LengthPenalizedRewardManager", "module": {"path": str(example)}}
    assert not uses_reward_loop(config(reward_manager=driver))
