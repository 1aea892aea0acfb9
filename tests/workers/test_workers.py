"""Worker classes in one process (world size 1), driven like the trainer drives them: generate ->
log-probs -> ref -> values -> updates -> checkpoints, with the data contracts checked."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from test_workers_common import PROMPTS, build_tiny_llama, reference_log_probs

from verl.protocol import DataProto
from verl.utils.model import build_reward_model, compute_position_id_with_mask

YAML = Path(__file__).resolve().parents[2] / "verl" / "trainer" / "config" / "ppo_trainer.yaml"


def make_config(model_path: str, **overrides):
    """The default trainer config with a tiny model and small batches, resolved: the embedded job's
    settings (as the default run has them), upstream's keys mapped onto ours (what workers get)."""
    from verl.trainer.config.upstream_keys import apply_embedded_preset, check_upstream_surface

    cfg = OmegaConf.load(YAML)
    base = {
        "actor_rollout_ref.model.path": model_path,
        "data.max_prompt_length": 8,
        "data.max_response_length": 6,
        "data.train_batch_size": 4,
        "actor_rollout_ref.rollout.n": 2,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
        "actor_rollout_ref.actor.use_dynamic_bsz": False,
        "actor_rollout_ref.actor.optim.lr": 1e-3,
        "critic.ppo_micro_batch_size_per_gpu": 2,
        "critic.optim.lr": 1e-3,
    }
    base.update(overrides)
    apply_embedded_preset(cfg, [f"{key}=" for key in base], always=True)
    for key, value in base.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return OmegaConf.create(OmegaConf.to_container(check_upstream_surface(cfg), resolve=True))


def prompt_batch(tok, prompts=PROMPTS[:4], n=2, prompt_len=8):
    enc = tok(prompts, add_special_tokens=False, padding="max_length", max_length=prompt_len, return_tensors="pt")
    mask = enc["attention_mask"]
    data = DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": compute_position_id_with_mask(mask),
        },
        non_tensors={"uid": np.array([f"u{i}" for i in range(len(prompts))], dtype=object)},
        meta_info={"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id},
    )
    return data.repeat(n, interleave=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    path = build_tiny_llama(str(tmp_path_factory.mktemp("tiny_workers")))
    return path, AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)


def _grpo_like_advantages(batch: DataProto) -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(len(batch), generator=g)
    batch.batch["advantages"] = scores.unsqueeze(1) * batch.batch["response_mask"]


def test_actor_rollout_ref_round_trip(tiny, tmp_path):
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    path, tok, plain = tiny
    cfg = make_config(path, **{"actor_rollout_ref.actor.use_kl_loss": True})
    worker = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="actor_rollout_ref")
    worker.init_model()
    assert worker.rollout.shares_weights_with(worker.actor_module)  # world size 1: no copy
    assert worker.actor_config.ppo_mini_batch_size == 8  # 4 prompts x n=2 / 1 rank

    gen_in = prompt_batch(tok)
    out = worker.generate_sequences(gen_in)
    for key in (
        "prompts",
        "responses",
        "response_mask",
        "input_ids",
        "attention_mask",
        "position_ids",
        "rollout_log_probs",
    ):
        assert key in out.batch.keys(), key
    assert out.batch["responses"].shape == (8, 6) and out.batch["input_ids"].shape == (8, 14)
    assert out.meta_info["timing"]["generate_sequences"] > 0

    batch = DataProto.from_dict(tensors=dict(out.batch.items()), non_tensors={"uid": gen_in.non_tensor_batch["uid"]})
    old = worker.compute_log_prob(batch)
    expected = reference_log_probs(
        plain,
        {k: batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")},
    )
    torch.testing.assert_close(old.batch["old_log_probs"], expected, atol=1e-5, rtol=0)
    mask = batch.batch["response_mask"].bool()
    # rollout log-probs are the learner's (same weights, same temperature, fp32)
    assert (old.batch["old_log_probs"] - batch.batch["rollout_log_probs"])[mask].abs().max() < 1e-5
    assert old.meta_info["metrics"]["rollout_mismatch/kl_k3"] < 1e-9
    ref = worker.compute_ref_log_prob(batch)
    torch.testing.assert_close(ref.batch["ref_log_prob"], expected, atol=1e-5, rtol=0)

    batch = batch.union(
        DataProto.from_dict(
            tensors={"old_log_probs": old.batch["old_log_probs"], "ref_log_prob": ref.batch["ref_log_prob"]}
        )
    )
    _grpo_like_advantages(batch)
    result = worker.update_actor(batch)
    metrics = result.meta_info["metrics"]
    # first update: ratio 1 (to float rounding: the prefix grouper batches the prompt differently
    # in the log-prob pass and in the update, ~1e-8)
    assert metrics["actor/pg_clipfrac"] == [0.0] and metrics["actor/ppo_kl"][0] == pytest.approx(0.0, abs=1e-6)
    assert metrics["actor/kl_loss"][0] == pytest.approx(0.0, abs=1e-6)  # actor == ref before the step
    assert metrics["actor/lr"] == [1e-3]
    rss = metrics["perf/actor_memory/max_rss_gb"][0]
    assert 0.05 < rss < 64  # a real reading of this process (python + torch alone exceed 50 MB)
    after = worker.compute_log_prob(batch).batch["old_log_probs"]
    assert (after - old.batch["old_log_probs"])[mask].abs().max() > 1e-4  # the policy moved
    # ... and the shared rollout generates with the updated weights, no sync needed
    regen = worker.generate_sequences(prompt_batch(tok))
    assert "metrics" not in regen.meta_info

    ckpt = str(tmp_path / "actor_ckpt")
    worker.save_checkpoint(ckpt, global_step=1)
    assert sorted(os.listdir(os.path.join(ckpt, "dcp"))) == [".metadata", "__0_0.distcp"]  # the sharded state
    worker.update_actor(batch)  # move away, then restore
    worker.load_checkpoint(ckpt)
    torch.testing.assert_close(worker.compute_log_prob(batch).batch["old_log_probs"], after, atol=0, rtol=0)


def test_use_current_as_old_log_prob_returns_old_log_probs(tiny):
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    path, tok, plain = tiny
    worker = ActorRolloutRefWorker(config=make_config(path).actor_rollout_ref, role="actor_rollout")
    worker.init_model()
    out = worker.generate_sequences(prompt_batch(tok))
    batch = DataProto.from_dict(
        tensors=dict(out.batch.items()), non_tensors={"uid": np.array([f"u{i // 2}" for i in range(8)], dtype=object)}
    )
    _grpo_like_advantages(batch)
    batch.meta_info["use_current_as_old_log_prob"] = True
    result = worker.update_actor(batch)
    expected = reference_log_probs(
        plain,
        {k: batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")},
    )
    torch.testing.assert_close(result.batch["old_log_probs"], expected, atol=1e-5, rtol=0)
    assert result.meta_info["metrics"]["actor/ppo_kl"] == [0.0]


def test_batch_size_divisibility_is_reported(tiny):
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    path, _, _ = tiny
    cfg = make_config(path, **{"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 3})
    # the one message of the batch-size rules (verl/trainer/config/derived.py), as at validation
    with pytest.raises(
        ValueError,
        match=r"actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu=3 does not divide the per-worker mini-batch "
        r".* = 8 sequences; use a divisor of 8",
    ):
        ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="actor")


def test_workers_do_not_modify_a_config_dataclass_passed_in(tiny):
    from verl.workers.config import ActorConfig, CriticConfig
    from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    path, _, _ = tiny
    cfg = make_config(path)
    actor_cfg = ActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, use_dynamic_bsz=False)
    sections = {
        "model": cfg.actor_rollout_ref.model,
        "rollout": cfg.actor_rollout_ref.rollout,
        "ref": cfg.actor_rollout_ref.ref,
        "actor": actor_cfg,
    }
    first = ActorRolloutRefWorker(config=sections, role="actor")
    second = ActorRolloutRefWorker(config=sections, role="actor")
    assert actor_cfg.ppo_mini_batch_size == 4 and actor_cfg.loss_scale_factor is None
    assert first.actor_config.ppo_mini_batch_size == second.actor_config.ppo_mini_batch_size == 8  # 4 prompts x n=2
    critic_cfg = CriticConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, rollout_n=2)
    CriticWorker(config=critic_cfg)
    assert CriticWorker(config=critic_cfg).config.ppo_mini_batch_size == 8 and critic_cfg.ppo_mini_batch_size == 4


def test_separate_rollout_copy_is_synced_and_checked(tiny):
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    path, tok, _ = tiny
    cfg = make_config(path, **{"actor_rollout_ref.rollout.engine_kwargs": {"hf": {"separate_copy": True}}})
    worker = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="actor_rollout")
    worker.init_model()
    assert not worker.rollout.shares_weights_with(worker.actor_module)
    out = worker.generate_sequences(prompt_batch(tok))
    assert out.meta_info["metrics"]["rollout/weight_sync_max_logp_diff"] < 1e-5
    batch = DataProto.from_dict(
        tensors=dict(out.batch.items()), non_tensors={"uid": np.array([f"u{i // 2}" for i in range(8)], dtype=object)}
    )
    _grpo_like_advantages(batch)
    batch.meta_info["use_current_as_old_log_prob"] = True
    worker.update_actor(batch)
    out = worker.generate_sequences(prompt_batch(tok))  # re-synced after the update
    assert out.meta_info["metrics"]["rollout/weight_sync_max_logp_diff"] < 1e-5
    lp = worker.compute_log_prob(DataProto.from_dict(tensors=dict(out.batch.items()))).batch["old_log_probs"]
    mask = out.batch["response_mask"].bool()
    assert (lp - out.batch["rollout_log_probs"])[mask].abs().max() < 1e-5

    # a sync that silently loads wrong weights is caught by the probe check
    worker.update_actor(batch)
    real_update = worker.rollout.update_weights

    def corrupt(state):
        real_update({k: v + 0.05 * torch.randn_like(v) for k, v in state.items()})

    worker.rollout.update_weights = corrupt
    with pytest.raises(RuntimeError, match="weight sync check failed"):
        worker.generate_sequences(prompt_batch(tok))


def test_critic_worker_values_and_update(tiny):
    from verl.workers.fsdp_workers import CriticWorker

    path, tok, _ = tiny
    cfg = make_config(path)
    worker = CriticWorker(config=cfg.critic)
    worker.init_model()
    assert worker.config.ppo_mini_batch_size == 8
    from test_workers_common import RESPONSES, make_batch

    tensors = make_batch(tok, PROMPTS, RESPONSES, prompt_len=8, resp_len=6)
    batch = DataProto.from_dict(tensors=tensors)
    values = worker.compute_values(batch).batch["values"]
    assert values.shape == (8, 6) and torch.all(values[tensors["response_mask"] == 0] == 0)
    batch.batch["values"] = values
    batch.batch["returns"] = torch.ones_like(values) * tensors["response_mask"]
    losses = [worker.update_critic(batch).meta_info["metrics"]["critic/vf_loss"][0] for _ in range(5)]
    assert losses[-1] < losses[0]


def test_reward_model_worker_scores_last_token(tiny, tmp_path):
    from verl.workers.fsdp_workers import RewardModelWorker

    path, tok, _ = tiny
    rm_dir = str(tmp_path / "rm")
    model = build_reward_model(path)
    model.save_pretrained(rm_dir)
    tok.save_pretrained(rm_dir)
    cfg = make_config(
        path,
        **{"reward_model.enable": True, "reward_model.model.path": rm_dir, "reward_model.micro_batch_size_per_gpu": 4},
    )
    worker = RewardModelWorker(config=cfg.reward_model)
    worker.init_model()
    assert worker.reward_model.input_tokenizer is None  # same tokenizer: no re-templating
    from test_workers_common import RESPONSES, make_batch

    tensors = make_batch(tok, PROMPTS, RESPONSES, prompt_len=8, resp_len=6)
    scores = worker.compute_rm_score(DataProto.from_dict(tensors=tensors)).batch["rm_scores"]
    for i in range(8):
        n = int(tensors["response_mask"][i].sum())
        valid = tensors["input_ids"][i][tensors["attention_mask"][i].bool()]
        with torch.no_grad():
            expected = float(model(input_ids=valid.unsqueeze(0)).logits[0, 0])
        assert scores[i, n - 1].item() == pytest.approx(expected, abs=1e-5)


def test_cpu_bf16_autocast_runs_and_reports_the_mismatch(tiny):
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    path, tok, plain = tiny
    cfg = make_config(path, **{"actor_rollout_ref.actor.fsdp_config.cpu_autocast_bf16": True})
    worker = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="actor_rollout")
    worker.init_model()
    assert worker.compute_dtype is torch.bfloat16
    out = worker.generate_sequences(prompt_batch(tok))
    batch = DataProto.from_dict(tensors=dict(out.batch.items()))
    old = worker.compute_log_prob(batch)
    metrics = old.meta_info["metrics"]
    # rollout (KV-cached decoding) and learner (full forward) both in bf16: close, not identical
    assert 0 <= metrics["rollout_mismatch/kl_k3"] < 1e-2
    fp32 = reference_log_probs(
        plain,
        {k: batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")},
    )
    mask = batch.batch["response_mask"].bool()
    assert (old.batch["old_log_probs"] - fp32)[mask].abs().mean() < 0.1
    assert all(p.dtype == torch.float32 for p in worker.actor_module.parameters())  # fp32 master weights


def test_gradient_checkpointing_gives_the_same_update(tiny):
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    path, tok, _ = tiny
    results = []
    for flag in (False, True):
        cfg = make_config(path, **{"actor_rollout_ref.model.enable_gradient_checkpointing": flag})
        worker = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="actor")
        worker.init_model()
        layer = worker.actor_module.model.layers[0]
        assert getattr(layer, "gradient_checkpointing", False) == flag
        from test_workers_common import RESPONSES, make_batch

        tensors = make_batch(tok, PROMPTS, RESPONSES, prompt_len=8, resp_len=6)
        batch = DataProto.from_dict(
            tensors=tensors, non_tensors={"uid": np.array([f"u{i // 2}" for i in range(8)], dtype=object)}
        )
        _grpo_like_advantages(batch)
        batch.meta_info["use_current_as_old_log_prob"] = True
        metrics = worker.update_actor(batch).meta_info["metrics"]
        results.append((metrics["actor/grad_norm"][0], [p.detach().clone() for p in worker.actor_module.parameters()]))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6)
    for a, b in zip(results[0][1], results[1][1], strict=False):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_standalone_rollout_and_ref_roles(tiny):
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    path, tok, plain = tiny
    cfg = make_config(path)
    rollout = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="rollout")
    rollout.init_model()
    assert rollout.actor is None and rollout.rollout.owns_module  # its own (unsharded) model
    out = rollout.generate_sequences(prompt_batch(tok))
    assert out.batch["responses"].shape == (8, 6)
    with pytest.raises(RuntimeError, match="needs the actor role"):
        rollout.compute_log_prob(DataProto.from_dict(tensors=dict(out.batch.items())))
    ref = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="ref")
    ref.init_model()
    batch = DataProto.from_dict(tensors=dict(out.batch.items()))
    lp = ref.compute_ref_log_prob(batch).batch["ref_log_prob"]
    expected = reference_log_probs(
        plain,
        {k: batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")},
    )
    torch.testing.assert_close(lp, expected, atol=1e-5, rtol=0)
    assert not any(p.requires_grad for p in ref.ref_policy.actor_module.parameters())
    with pytest.raises(RuntimeError, match="needs a rollout role"):
        ref.generate_sequences(prompt_batch(tok))
    with pytest.raises(ValueError, match="role='critic'"):
        ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="critic")


def test_model_loading_keeps_the_per_rank_sampling_stream(tiny):
    """The worker seeds 1234 + rank before init_model; building the models must not reset the
    stream (it did: every rank sampled with the same seed-0 stream)."""
    from verl.utils.model import build_causal_lm, build_value_model
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    path, _, _ = tiny
    torch.manual_seed(7)
    state = torch.get_rng_state()
    build_causal_lm(path)
    build_value_model(path)
    assert torch.equal(torch.get_rng_state(), state)
    # and the value head of a fresh value model is still the same on every rank
    torch.testing.assert_close(
        build_value_model(path).score.weight, build_value_model(path).score.weight, atol=0, rtol=0
    )

    worker = ActorRolloutRefWorker(config=make_config(path).actor_rollout_ref, role="actor_rollout")
    worker.init_model()
    expected = torch.Generator().manual_seed(1234 + worker.rank).get_state()
    assert torch.equal(torch.get_rng_state(), expected)


def test_ref_and_reward_model_param_offload_wraps_their_passes(tiny, tmp_path, monkeypatch):
    """Offload only acts on GPU; here the device is faked and the moves are recorded."""
    import verl.workers.fsdp_workers as fw
    import verl.workers.worker_common as worker_common

    path, tok, _ = tiny
    rm_dir = str(tmp_path / "rm")
    build_reward_model(path).save_pretrained(rm_dir)
    tok.save_pretrained(rm_dir)
    cfg = make_config(
        path,
        **{
            "actor_rollout_ref.ref.fsdp_config.param_offload": True,
            "reward_model.enable": True,
            "reward_model.model.path": rm_dir,
            "reward_model.fsdp_config.param_offload": True,
        },
    )
    ref = fw.ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="ref")
    ref.init_model()
    rm = fw.RewardModelWorker(config=cfg.reward_model)
    rm.init_model()
    calls = []
    monkeypatch.setattr(worker_common, "load_fsdp_model_to_gpu", lambda m: calls.append(("load", m)))
    monkeypatch.setattr(worker_common, "offload_fsdp_model_to_cpu", lambda m: calls.append(("offload", m)))
    ref.device_name = rm.device_name = "cuda"
    from test_workers_common import RESPONSES, make_batch

    batch = DataProto.from_dict(tensors=make_batch(tok, PROMPTS, RESPONSES, prompt_len=8, resp_len=6))
    ref.compute_ref_log_prob(batch)
    assert calls == [("load", ref.ref_module), ("offload", ref.ref_module)]
    calls.clear()
    rm.compute_rm_score(batch)
    assert calls == [("load", rm.rm_module), ("offload", rm.rm_module)]


def test_worker_seed_follows_verl_seed(monkeypatch):
    from verl.workers.fsdp_workers import worker_seed

    monkeypatch.delenv("VERL_SEED", raising=False)
    assert worker_seed(1) == 1235
    monkeypatch.setenv("VERL_SEED", "7")
    assert [worker_seed(r) for r in range(3)] == [7, 8, 9]
    monkeypatch.setenv("VERL_SEED", "seven")
    with pytest.raises(ValueError, match="VERL_SEED='seven'"):
        worker_seed(0)


def test_worker_seed_from_the_trainer_wins_over_verl_seed(monkeypatch):
    from verl.workers.fsdp_workers import worker_seed

    monkeypatch.setenv("VERL_SEED", "7")
    assert [worker_seed(r, seed=100) for r in range(2)] == [100, 101]


def test_batch_plan_from_the_trainer_is_applied_and_checked():
    from types import SimpleNamespace

    from verl.trainer.config.derived import WorkerSettings, role_batch_plan
    from verl.workers.fsdp_workers import _apply_batch_plan

    def cfg():
        return SimpleNamespace(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=2, use_dynamic_bsz=False)

    plan = role_batch_plan("critic", cfg(), rollout_n=4, world_size=2)
    c = cfg()
    _apply_batch_plan("critic", c, 4, 2, WorkerSettings(seed=1, batch_plan=plan))
    assert c.ppo_mini_batch_size == 16  # 8 prompts x 4 / 2 ranks
    c = cfg()
    _apply_batch_plan("critic", c, 4, 2, None)  # built by hand: the same rule, derived here
    assert c.ppo_mini_batch_size == 16
    with pytest.raises(ValueError, match=r"batch plan is for 2 workers.*this worker has 4 workers"):
        _apply_batch_plan("critic", cfg(), 4, 4, WorkerSettings(seed=1, batch_plan=plan))


def test_resident_offloads_again_when_the_body_raises(monkeypatch):
    """`_resident` is the one bracket around every worker method: the model (and optimizer) go back
    to the CPU on the way out, also when the method fails half-way."""
    import types

    import verl.workers.fsdp_workers as fw
    import verl.workers.worker_common as worker_common

    calls = []
    monkeypatch.setattr(worker_common, "load_fsdp_model_to_gpu", lambda m: calls.append(("load", m)))
    monkeypatch.setattr(worker_common, "offload_fsdp_model_to_cpu", lambda m: calls.append(("offload", m)))
    monkeypatch.setattr(worker_common, "offload_fsdp_optimizer", lambda o: calls.append(("offload_optim", o)))
    monkeypatch.setattr(worker_common, "load_fsdp_optimizer", lambda o, device: calls.append(("load_optim", o)))
    monkeypatch.setattr(fw.torch.cuda, "current_device", lambda: 0)
    owner = fw._OffloadMixin()
    owner.device_name = "cuda"
    cfg = types.SimpleNamespace(param_offload=True, optimizer_offload=True)
    with pytest.raises(RuntimeError, match="boom"):
        with owner._resident("model", "optim", cfg):
            assert calls == [("load", "model"), ("load_optim", "optim")]
            raise RuntimeError("boom")
    assert calls[2:] == [("offload", "model"), ("offload_optim", "optim")]
    # on CPU nothing moves
    calls.clear()
    owner.device_name = "cpu"
    with owner._resident("model", "optim", cfg):
        pass
    assert calls == []
