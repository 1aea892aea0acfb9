"""The prefix grouper (`actor.use_prefix_grouper`): each distinct prompt of a micro-batch is run
once and its KV cache shared by the rows that repeat it. Log-probs, entropies and the gradient of
the update must equal the plain per-row forward (on and off side by side), for every micro-batch
split and with two data-parallel ranks; rows that share nothing fall back to the plain path."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import end_spawned_rank, load_tiny_llama
from test_workers_common import make_batch, reference_log_probs

from verl.protocol import DataProto
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config import ActorConfig
from verl.workers.engine.padding_free import group_shared_prompts

# 4 prompts of different lengths x 4 samples each, responses of 1..6 tokens (grouped rows adjacent)
GROUP_PROMPTS = ["1+2=", "13+4=", "9=", "100+21="]
GROUP_RESPONSES = [
    ["3", "4", "33", "three"],
    ["17", "1", "177", "71"],
    ["nine", "9", "99", "n"],
    ["121", "12", "1211", "2"],
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_tiny_llama(str(tmp_path_factory.mktemp("tiny_pg")))


def _grouped_batch(tok, seed=0, interleave=True):
    prompts, responses, uid = [], [], []
    for g, p in enumerate(GROUP_PROMPTS):
        for r in GROUP_RESPONSES[g]:
            prompts.append(p)
            responses.append(r)
            uid.append(f"p{g}")
    batch = make_batch(tok, prompts, responses, prompt_len=9, resp_len=6)
    if not interleave:  # groups scattered over the batch (a b c d a b c d ...)
        order = torch.arange(16).view(4, 4).t().reshape(-1)
        batch = {k: v[order] for k, v in batch.items()}
        uid = [uid[i] for i in order.tolist()]
    gen = torch.Generator().manual_seed(seed)
    batch["advantages"] = torch.randn(batch["responses"].shape, generator=gen) * batch["response_mask"]
    return batch, np.array(uid, dtype=object)


def _actor(model, use_prefix_grouper, **cfg):
    model = copy.deepcopy(model)
    base = dict(
        ppo_mini_batch_size=16,
        ppo_micro_batch_size_per_gpu=16,
        use_dynamic_bsz=False,
        loss_scale_factor=6.0,
        grad_clip=1e9,
        clip_ratio=0.2,
        use_prefix_grouper=use_prefix_grouper,
    )
    base.update(cfg)
    return DataParallelPPOActor(ActorConfig(**base), model, torch.optim.SGD(model.parameters(), lr=1.0)), model


def _proto(batch, uid, **meta):
    return DataProto.from_dict(tensors=dict(batch), non_tensors={"uid": uid}, meta_info=meta)


def test_groups_found_in_order_of_first_appearance(tiny):
    _, tok, _ = tiny
    batch, _ = _grouped_batch(tok, interleave=False)
    groups = group_shared_prompts(batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1])
    assert groups.num_groups == 4
    assert groups.first.tolist() == [0, 1, 2, 3]
    assert groups.inverse.tolist() == [0, 1, 2, 3] * 4
    # the longest prompt "100+21=" is 7 characters (no bos in this tokenizer)
    assert groups.prompt_len == 7
    # distinct prompts only: nothing to share
    distinct = {k: v[[0, 4, 8, 12]] for k, v in _grouped_batch(tok)[0].items()}
    assert group_shared_prompts(distinct["input_ids"], distinct["attention_mask"], 6) is None


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("interleave", [True, False])
def test_log_probs_and_entropy_equal_the_plain_forward(tiny, temperature, interleave):
    _, tok, model = tiny
    batch, uid = _grouped_batch(tok, interleave=interleave)
    on, _ = _actor(model, True)
    off, _ = _actor(model, False)
    for micro in (16, 5, 4):
        data = _proto(batch, uid, micro_batch_size=micro, temperature=temperature)
        lp_on, ent_on = on.compute_log_prob(data, calculate_entropy=True)
        lp_off, ent_off = off.compute_log_prob(data, calculate_entropy=True)
        torch.testing.assert_close(lp_on, lp_off, atol=2e-6, rtol=0)
        torch.testing.assert_close(ent_on, ent_off, atol=2e-6, rtol=0)
    torch.testing.assert_close(lp_on, reference_log_probs(model, batch, temperature), atol=1e-5, rtol=0)
    assert on.prefix_groups_used > 0 and off.prefix_groups_used == 0
    # one micro-batch: 4 prompts of <= 7 tokens once each, then 16 rows x 5 response inputs ("three"+eos: 6)
    padding = on.infer(_proto(batch, uid, micro_batch_size=16), calculate_entropy=False).padding
    assert padding["token_slots"] == 4 * 7 + 16 * 5


def _grads(actor, model, batch, uid):
    actor.update_policy(_proto(batch, uid, temperature=1.0))
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "prompt-mean"])
def test_update_equals_plain_update_for_every_micro_batch_split(tiny, mode):
    _, tok, model = tiny
    batch, uid = _grouped_batch(tok, seed=1)
    batch["old_log_probs"] = reference_log_probs(model, batch) - 0.05 * batch["response_mask"]
    off, off_model = _actor(model, False, loss_agg_mode=mode)
    expected = _grads(off, off_model, batch, uid)
    moved = max(float((expected[n] - p.detach()).abs().max()) for n, p in model.named_parameters())
    assert moved > 1e-3  # the step does something
    for split in (
        {"ppo_micro_batch_size_per_gpu": 16},
        {"ppo_micro_batch_size_per_gpu": 4},
        {"ppo_micro_batch_size_per_gpu": 6},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 40},
    ):
        on, on_model = _actor(model, True, loss_agg_mode=mode, **split)
        got = _grads(on, on_model, batch, uid)
        assert on.prefix_groups_used > 0
        for n in expected:
            torch.testing.assert_close(got[n], expected[n], atol=5e-6, rtol=0, msg=f"{mode} {split}: {n}")


def test_entropy_and_kl_terms_with_prefix_grouper(tiny):
    _, tok, model = tiny
    batch, uid = _grouped_batch(tok, seed=2)
    ref = reference_log_probs(model, batch)
    batch["old_log_probs"] = ref - 0.03 * batch["response_mask"]
    batch["ref_log_prob"] = ref + 0.02 * batch["response_mask"]
    cfg = dict(entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1, ppo_micro_batch_size_per_gpu=8)
    off, off_model = _actor(model, False, **cfg)
    on, on_model = _actor(model, True, **cfg)
    m_off = off.update_policy(_proto(batch, uid, temperature=1.0))
    m_on = on.update_policy(_proto(batch, uid, temperature=1.0))
    for k in ("actor/entropy", "actor/kl_loss", "actor/pg_loss", "actor/grad_norm"):
        assert abs(m_on[k][0] - m_off[k][0]) < 1e-5, k
    for (n, p), q in zip(on_model.named_parameters(), off_model.parameters(), strict=False):
        torch.testing.assert_close(p, q, atol=5e-6, rtol=0, msg=n)


def test_gradient_checkpointing_falls_back_to_the_plain_forward(tiny):
    _, tok, model = tiny
    batch, uid = _grouped_batch(tok)
    batch["old_log_probs"] = reference_log_probs(model, batch)
    on, on_model = _actor(model, True)
    enable = getattr(on_model, "activation_checkpointing_enable", None) or on_model.gradient_checkpointing_enable
    enable()
    on.update_policy(_proto(batch, uid, temperature=1.0))
    assert on.prefix_groups_used == 0


def _dp_worker(rank, path, init_file, out_file, use_pg):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.utils.fsdp_utils import apply_fsdp2

    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    batch, uid = _grouped_batch(tok, seed=3)
    batch["old_log_probs"] = reference_log_probs(model, batch) - 0.05 * batch["response_mask"]
    from torch.distributed.device_mesh import init_device_mesh

    model = apply_fsdp2(model, init_device_mesh("cpu", (2,)))
    cfg = ActorConfig(
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=4,
        use_dynamic_bsz=False,
        loss_scale_factor=6.0,
        grad_clip=1e9,
        use_prefix_grouper=use_pg,
    )
    actor = DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=1.0))
    rows = slice(rank * 8, (rank + 1) * 8)  # each rank holds two whole groups
    local = {k: v[rows] for k, v in batch.items()}
    data = _proto(local, uid[rows], temperature=1.0, micro_batch_size=3)
    lp, _ = actor.compute_log_prob(data)
    actor.update_policy(data)
    from torch.distributed.tensor import DTensor

    params = {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for n, p in model.named_parameters()
    }
    gathered = [None, None]
    dist.all_gather_object(gathered, lp)
    if rank == 0:
        torch.save({"params": params, "lp": torch.cat(gathered), "used": actor.prefix_groups_used}, out_file)
    end_spawned_rank()


@pytest.mark.slow
def test_two_ranks_on_equals_off(tiny, tmp_path):
    path, _, _ = tiny
    results = {}
    for use_pg in (False, True):
        out = str(tmp_path / f"out_{use_pg}.pt")
        mp.spawn(_dp_worker, args=(path, str(tmp_path / f"init_{use_pg}"), out, use_pg), nprocs=2, join=True)
        results[use_pg] = torch.load(out)
    assert results[True]["used"] > 0 and results[False]["used"] == 0
    torch.testing.assert_close(results[True]["lp"], results[False]["lp"], atol=2e-6, rtol=0)
    for n, p in results[False]["params"].items():
        torch.testing.assert_close(results[True]["params"][n], p, atol=5e-6, rtol=0, msg=n)


def test_on_by_default_a_deliberate_divergence_from_upstream():
    # upstream's default is False (it needs use_remove_padding=False there); ours is exact with
    # padding removal, so it is on by default (docs/performance.md)
    from verl.trainer.main_ppo import load_default_config

    assert ActorConfig().use_prefix_grouper is True
    assert load_default_config([]).actor_rollout_ref.actor.use_prefix_grouper is True
