"""World size 2 on CPU through Ray: FSDP2 over a gloo group, actor + critic colocated in the same
two processes, compared with plain transformers and with the single-process worker."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_workers import make_config, prompt_batch
from test_workers_common import PROMPTS, RESPONSES, build_tiny_llama, make_batch, reference_log_probs

from verl.protocol import DataProto

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# uids: the group "a" straddles the two ranks (rows 0-3 go to rank 0, rows 4-7 to rank 1)
UIDS = np.array(["a", "a", "b", "b", "c", "c", "a", "d"], dtype=object)
OVERRIDES = {
    "actor_rollout_ref.actor.loss_agg_mode": "prompt-mean",
    "actor_rollout_ref.actor.use_dynamic_bsz": True,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 24,
    "critic.use_dynamic_bsz": False,
    # small enough that clipping is active: clipping DTensor gradients is exercised too
    "actor_rollout_ref.actor.grad_clip": 0.05,
    "critic.grad_clip": 0.05,
}


@pytest.fixture(scope="module")
def setup(ray_session, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.single_controller.ray.base import create_colocated_worker_cls
    from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    path = build_tiny_llama(str(tmp_path_factory.mktemp("tiny_ray")))
    tok = AutoTokenizer.from_pretrained(path)
    plain = AutoModelForCausalLM.from_pretrained(path)
    cfg = make_config(path, **OVERRIDES)
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    class_dict = {
        "actor_rollout": RayClassWithInitArgs(
            cls=ActorRolloutRefWorker, config=cfg.actor_rollout_ref, role="actor_rollout"
        ),
        "critic": RayClassWithInitArgs(cls=CriticWorker, config=cfg.critic),
    }
    wg = RayWorkerGroup(pool, create_colocated_worker_cls(class_dict), num_threads_per_worker=1)
    groups = wg.spawn(prefix_set=class_dict.keys())
    groups["actor_rollout"].init_model()
    groups["critic"].init_model()
    yield path, tok, plain, cfg, groups
    wg.kill_workers()
    pool.release()


def _train_batch(tok):
    tensors = make_batch(tok, PROMPTS, RESPONSES, prompt_len=8, resp_len=6)
    g = torch.Generator().manual_seed(0)
    tensors["advantages"] = torch.randn(tensors["responses"].shape, generator=g) * tensors["response_mask"]
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": UIDS})


def test_world_size_2_log_probs_generation_update_and_checkpoint(setup, tmp_path):
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    path, tok, plain, cfg, groups = setup
    actor = groups["actor_rollout"]
    assert actor.world_size == 2

    # compute_log_prob over 2 FSDP shards equals one plain transformers forward
    batch = _train_batch(tok)
    old = actor.compute_log_prob(batch).batch["old_log_probs"]
    expected = reference_log_probs(
        plain,
        {k: batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")},
    )
    torch.testing.assert_close(old, expected, atol=1e-5, rtol=0)

    # generation with full parameters gathered; rollout log-probs equal the learner's
    gen = actor.generate_sequences(prompt_batch(tok))
    mask = gen.batch["response_mask"].bool()
    lp = actor.compute_log_prob(DataProto.from_dict(tensors=dict(gen.batch.items()))).batch["old_log_probs"]
    assert (lp - gen.batch["rollout_log_probs"])[mask].abs().max() < 1e-5
    greedy2 = actor.generate_sequences(prompt_batch(tok, n=1).union(DataProto(meta_info={"validate": True}))).batch[
        "responses"
    ]

    # one update at world size 2 (prompt-mean with a group split across ranks, token budgets that
    # give the ranks different micro-batch counts) equals the same update in one process
    batch.batch["old_log_probs"] = old
    m2 = actor.update_actor(batch).meta_info["metrics"]
    single = ActorRolloutRefWorker(config=make_config(path, **OVERRIDES).actor_rollout_ref, role="actor_rollout")
    single.init_model()
    greedy1 = single.generate_sequences(prompt_batch(tok, n=1).union(DataProto(meta_info={"validate": True}))).batch[
        "responses"
    ]
    assert torch.equal(greedy1, greedy2)
    m1 = single.update_actor(batch).meta_info["metrics"]
    assert m2["actor/pg_loss"][0][0] == pytest.approx(m1["actor/pg_loss"][0], rel=1e-5, abs=1e-7)
    assert m2["actor/grad_norm"][0][0] == pytest.approx(m1["actor/grad_norm"][0], rel=1e-5)
    assert m2["actor/grad_norm"][0][0] > 0.05  # the update was clipped
    after2 = actor.compute_log_prob(batch).batch["old_log_probs"]
    after1 = single.compute_log_prob(batch).batch["old_log_probs"]
    torch.testing.assert_close(after2, after1, atol=1e-5, rtol=0)

    # a checkpoint written by 2 ranks resumes in 1 process (weights, optimizer, schedule)
    ckpt = str(tmp_path / "ws2_ckpt")
    actor.save_checkpoint(ckpt, None, 1, max_ckpt_to_keep=None)
    fresh = ActorRolloutRefWorker(config=make_config(path, **OVERRIDES).actor_rollout_ref, role="actor_rollout")
    fresh.init_model()
    with pytest.warns(UserWarning, match="RNG streams are not"):
        fresh.load_checkpoint(ckpt)
    torch.testing.assert_close(fresh.compute_log_prob(batch).batch["old_log_probs"], after2, atol=1e-5, rtol=0)
    # the next update continues from the same optimizer state on both
    batch.batch["old_log_probs"] = after2
    n2 = actor.update_actor(batch).meta_info["metrics"]
    n1 = fresh.update_actor(batch).meta_info["metrics"]
    assert n2["actor/grad_norm"][0][0] == pytest.approx(n1["actor/grad_norm"][0], rel=1e-5)
    torch.testing.assert_close(
        actor.compute_log_prob(batch).batch["old_log_probs"],
        fresh.compute_log_prob(batch).batch["old_log_probs"],
        atol=1e-5,
        rtol=0,
    )


def test_world_size_2_critic_matches_single_process(setup):
    from verl.workers.fsdp_workers import CriticWorker

    path, tok, _, cfg, groups = setup
    critic = groups["critic"]
    batch = _train_batch(tok)
    v2 = critic.compute_values(batch).batch["values"]
    single = CriticWorker(config=make_config(path, **OVERRIDES).critic)
    single.init_model()
    v1 = single.compute_values(batch).batch["values"]
    torch.testing.assert_close(v2, v1, atol=1e-5, rtol=0)
    batch.batch["values"] = v1
    batch.batch["returns"] = torch.ones_like(v1) * batch.batch["response_mask"]
    m2 = critic.update_critic(batch).meta_info["metrics"]
    m1 = single.update_critic(batch).meta_info["metrics"]
    assert m2["critic/vf_loss"][0][0] == pytest.approx(m1["critic/vf_loss"][0], rel=1e-5)
    assert m2["critic/grad_norm"][0][0] == pytest.approx(m1["critic/grad_norm"][0], rel=1e-5)
    assert m2["critic/grad_norm"][0][0] > 0.05
    # the clipped step landed identically
    torch.testing.assert_close(
        critic.compute_values(batch).batch["values"], single.compute_values(batch).batch["values"], atol=1e-5, rtol=0
    )


def test_world_size_2_non_finite_loss_on_one_rank_is_skipped_everywhere(setup):
    path, tok, _, cfg, groups = setup
    actor = groups["actor_rollout"]
    batch = _train_batch(tok)
    batch.batch["old_log_probs"] = actor.compute_log_prob(batch).batch["old_log_probs"]
    batch.batch["advantages"][6, 0] = float("nan")  # row 6 lives on rank 1 only
    metrics = actor.update_actor(batch).meta_info["metrics"]  # must not hang: both ranks skip together
    assert metrics["actor/nonfinite_loss_skipped"] == [
        [1.0],
        [1.0],
    ]  # one entry (list) per rank, as upstream; same count
    lp = actor.compute_log_prob(batch).batch["old_log_probs"]
    assert torch.isfinite(lp).all()
