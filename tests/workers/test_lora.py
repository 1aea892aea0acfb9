"""LoRA (peft) on the FSDP workers: config keys, frozen base + trainable adapter, exactness at
init, the reference policy from the actor with its adapter disabled, world size 1 and 2."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from conftest import end_spawned_rank
from test_workers import _grpo_like_advantages, prompt_batch
from test_workers import make_config as _make_config
from test_workers_common import build_tiny_llama

from verl.protocol import DataProto

peft = pytest.importorskip("peft")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    path = build_tiny_llama(str(tmp_path_factory.mktemp("tiny_lora")))
    return path, AutoTokenizer.from_pretrained(path)


def make_config(path, **overrides):
    # bitwise comparisons (LoRA at init == base) need one forward path for both models: the plain
    # one (the prefix grouper's cached prompt path rounds differently, ~1e-7)
    overrides.setdefault("actor_rollout_ref.actor.use_prefix_grouper", False)
    return _make_config(path, **overrides)


def lora_config(path, rank=4, **overrides):
    base = {
        "actor_rollout_ref.model.lora_rank": rank,
        "actor_rollout_ref.model.lora_alpha": 8,
        "actor_rollout_ref.actor.optim.lr": 1e-2,
    }
    base.update(overrides)
    return make_config(path, **base)


def build_actor(cfg, role="actor_rollout"):
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role=role)
    worker.init_model()
    return worker


def rollout_batch(worker, tok):
    out = worker.generate_sequences(prompt_batch(tok))
    batch = DataProto.from_dict(
        tensors=dict(out.batch.items()), non_tensors={"uid": np.array([f"u{i // 2}" for i in range(8)], dtype=object)}
    )
    _grpo_like_advantages(batch)
    return batch


# -- config ------------------------------------------------------------------------------------


def test_lora_keys_are_validated():
    from verl.workers.config import HFModelConfig

    assert not HFModelConfig().use_lora
    assert HFModelConfig(lora_rank=8).use_lora and HFModelConfig(lora_adapter_path="/x").use_lora
    with pytest.raises(ValueError, match="lora_rank"):
        HFModelConfig(lora_rank=-1)
    with pytest.raises(ValueError, match="target_modules"):
        HFModelConfig(lora_rank=8, target_modules=3)
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['actor_rollout_ref.model.lora.rank'\]"):
        from verl.utils.config import omega_conf_to_dataclass

        omega_conf_to_dataclass({"lora": {"rank": 8}}, HFModelConfig, _path="actor_rollout_ref.model")


def test_all_linear_targets_every_linear_layer_but_the_head(tiny):
    from verl.utils.model import apply_lora, build_causal_lm, count_parameters
    from verl.workers.config import HFModelConfig

    path, _ = tiny
    model = apply_lora(build_causal_lm(path), HFModelConfig(path=path, lora_rank=2, target_modules="all-linear"))
    adapted = {
        n.rsplit(".lora_A", 1)[0].split("base_model.model.", 1)[1]
        for n, _ in model.named_parameters()
        if ".lora_A." in n
    }
    # 2 layers x (q, k, v, o, gate, up, down); lm_head stays a plain frozen Linear
    assert len(adapted) == 14 and not any("lm_head" in a for a in adapted)
    trainable, total = count_parameters(model)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert all(".lora_A." in n or ".lora_B." in n for n in names)
    # hidden 32, intermediate 64, kv heads 2 x head dim 8 = 16, r = 2: sum of r * (in + out) per layer
    per_layer = 2 * ((32 + 32) + (32 + 16) + (32 + 16) + (32 + 32) + 2 * (32 + 64) + (64 + 32))
    assert trainable == 2 * per_layer
    excluded = apply_lora(
        build_causal_lm(path),
        HFModelConfig(
            path=path,
            lora_rank=2,
            target_modules=["q_proj", "v_proj"],
            exclude_modules=["model.layers.1.self_attn.v_proj"],
        ),
    )
    kept = {n.split(".lora_A")[0] for n, _ in excluded.named_parameters() if ".lora_A." in n}
    assert len(kept) == 3 and not any("layers.1.self_attn.v_proj" in k for k in kept)
    assert total > trainable


# -- actor at world size 1 ----------------------------------------------------------------------


def test_normalize_peft_param_name_gives_the_base_models_keys(tiny):
    from verl.utils.fsdp_utils import normalize_peft_param_name
    from verl.utils.model import apply_lora, build_causal_lm
    from verl.workers.config import HFModelConfig

    path, _ = tiny
    base = build_causal_lm(path).state_dict()
    peft = apply_lora(build_causal_lm(path), HFModelConfig(path=path, lora_rank=2, target_modules="all-linear"))
    names = normalize_peft_param_name(peft.state_dict())
    assert set(names) == set(base) and not any("lora_" in k for k in names)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(names[q], peft.state_dict()[f"base_model.model.{q.replace('.weight', '.base_layer.weight')}"])
    assert normalize_peft_param_name({"x.adapter_A.weight": 1, "y.weight": 2}) == {"y.weight": 2}


def test_lora_actor_is_exact_at_init_trains_only_the_adapter_and_refs_from_the_base(tiny):
    path, tok = tiny
    base_worker = build_actor(make_config(path))
    worker = build_actor(lora_config(path), role="actor_rollout_ref")
    assert worker.ref_policy is None and worker.ref_module is None  # no second model
    batch = rollout_batch(worker, tok)
    base_lp = base_worker.compute_log_prob(batch).batch["old_log_probs"]
    lora_lp = worker.compute_log_prob(batch).batch["old_log_probs"]
    assert torch.equal(lora_lp, base_lp)  # B = 0: bitwise the base model

    trainable = {n for n, p in worker.actor_module.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    optim_params = {id(p) for g in worker.actor_optimizer.param_groups for p in g["params"]}
    assert optim_params == {id(p) for p in worker.actor_module.parameters() if p.requires_grad}
    frozen_before = {n: p.detach().clone() for n, p in worker.actor_module.named_parameters() if not p.requires_grad}

    batch = batch.union(DataProto.from_dict(tensors={"old_log_probs": lora_lp}))
    worker.update_actor(batch)
    for n, p in worker.actor_module.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, frozen_before[n]), n
    after = worker.compute_log_prob(batch).batch["old_log_probs"]
    mask = batch.batch["response_mask"].bool()
    assert (after - base_lp)[mask].abs().max() > 1e-3  # the adapter moved the policy

    # reference = actor with the adapter off = a separate reference worker on the base model
    ref = worker.compute_ref_log_prob(batch).batch["ref_log_prob"]
    separate = build_actor(lora_config(path), role="ref")
    assert separate.ref_policy is not None and separate.actor is None
    sep = separate.compute_ref_log_prob(batch).batch["ref_log_prob"]
    assert float((ref - sep).abs().max()) == 0.0
    assert torch.equal(ref, base_lp)


# -- world size 2 -------------------------------------------------------------------------------


def _ws2_worker(rank: int, port: int, path: str, out_dir: str):
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "LOCAL_RANK": str(rank),
        }
    )
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    worker = build_actor(lora_config(path), role="actor_rollout_ref")
    batch = torch.load(os.path.join(out_dir, "batch.pt"), weights_only=False)
    lo, hi = rank * 4, rank * 4 + 4
    part = batch[lo:hi]
    init_lp = worker.compute_log_prob(part).batch["old_log_probs"]
    part = part.union(DataProto.from_dict(tensors={"old_log_probs": init_lp}))
    worker.update_actor(part)
    after = worker.compute_log_prob(part).batch["old_log_probs"]
    ref = worker.compute_ref_log_prob(part).batch["ref_log_prob"]
    # adapter-only checkpoint at world size 2: move away, restore, same policy
    worker.save_checkpoint(os.path.join(out_dir, "ckpt_ws2"), global_step=1)
    worker.update_actor(part)
    worker.load_checkpoint(os.path.join(out_dir, "ckpt_ws2"))
    assert torch.equal(worker.compute_log_prob(part).batch["old_log_probs"], after)
    gen = worker.generate_sequences(prompt_batch(tok)[lo:hi])
    from verl.utils.fsdp_utils import fsdp_version, get_lora_merged_state_dict

    assert fsdp_version(worker.actor_module) == 2
    merged = get_lora_merged_state_dict(worker.actor_module, rank0_only=True)
    assert (len(merged) > 0) == (rank == 0)
    torch.save(
        {"init": init_lp, "after": after, "ref": ref, "gen_keys": sorted(gen.batch.keys()), "merged": merged},
        os.path.join(out_dir, f"rank{rank}.pt"),
    )
    end_spawned_rank()


@pytest.mark.slow
def test_lora_actor_world_size_2_equals_world_size_1(tiny, tmp_path):
    import socket

    import torch.multiprocessing as mp

    path, tok = tiny
    ws1 = build_actor(lora_config(path))
    base = build_actor(make_config(path))
    batch = rollout_batch(ws1, tok)
    torch.save(batch, tmp_path / "batch.pt")
    base_lp = base.compute_log_prob(batch).batch["old_log_probs"]
    init = ws1.compute_log_prob(batch).batch["old_log_probs"]
    # the trainer splits a batch over ranks; an update at world size 2 sees both halves, so the
    # world-size-1 reference update sees the whole batch
    ws1.update_actor(batch.union(DataProto.from_dict(tensors={"old_log_probs": init})))
    after1 = ws1.compute_log_prob(batch).batch["old_log_probs"]

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_ws2_worker, args=(port, path, str(tmp_path)), nprocs=2, join=True)
    parts = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    init2 = torch.cat([p["init"] for p in parts])
    assert torch.equal(init2, base_lp)  # exact at init under FSDP2 too
    ref2 = torch.cat([p["ref"] for p in parts])
    assert torch.equal(ref2, base_lp)  # adapter disabled = base, after the update
    after2 = torch.cat([p["after"] for p in parts])
    mask = batch.batch["response_mask"].bool()
    assert (after2 - init2)[mask].abs().max() > 1e-3
    torch.testing.assert_close(after2, after1, atol=1e-5, rtol=0)
    assert "responses" in parts[0]["gen_keys"]
    # the world-size-2 checkpoint resumes in one process
    restored = build_actor(lora_config(path))
    restored.load_checkpoint(str(tmp_path / "ckpt_ws2"))
    torch.testing.assert_close(restored.compute_log_prob(batch).batch["old_log_probs"], after2, atol=1e-6, rtol=0)
    from verl.utils.fsdp_utils import get_lora_merged_state_dict

    merged1 = get_lora_merged_state_dict(ws1.actor_module)
    assert sorted(parts[0]["merged"]) == sorted(merged1)
    for key, value in merged1.items():
        torch.testing.assert_close(parts[0]["merged"][key], value, atol=1e-6, rtol=0)


# -- rollout weight sync ------------------------------------------------------------------------


def test_shared_hf_rollout_generates_with_the_adapter_model(tiny):
    path, tok = tiny
    worker = build_actor(lora_config(path))
    assert worker.rollout.shares_weights_with(worker.actor_module)
    assert type(worker.rollout.module).__name__ == "PeftModelForCausalLM"
    batch = rollout_batch(worker, tok)
    batch.meta_info["use_current_as_old_log_prob"] = True
    worker.update_actor(batch)
    out = worker.generate_sequences(prompt_batch(tok))
    assert "metrics" not in out.meta_info  # nothing to sync: the rollout is the actor
    lp = worker.compute_log_prob(DataProto.from_dict(tensors=dict(out.batch.items()))).batch["old_log_probs"]
    mask = out.batch["response_mask"].bool()
    assert (lp - out.batch["rollout_log_probs"])[mask].abs().max() < 1e-5


def test_lora_merge_syncs_merged_weights_into_a_plain_copy_and_checks_them(tiny):
    from verl.utils.fsdp_utils import get_lora_merged_state_dict

    path, tok = tiny
    worker = build_actor(lora_config(path, **{"actor_rollout_ref.model.lora.merge": True}))
    assert not worker.rollout.shares_weights_with(worker.actor_module)
    assert type(worker.rollout.module).__name__ == "LlamaForCausalLM"  # no adapter layers
    batch = rollout_batch(worker, tok)
    batch.meta_info["use_current_as_old_log_prob"] = True
    worker.update_actor(batch)
    out = worker.generate_sequences(prompt_batch(tok))
    assert out.meta_info["metrics"]["rollout/weight_sync_max_logp_diff"] < 1e-5
    merged = get_lora_merged_state_dict(worker.actor_module)
    rollout_sd = worker.rollout.module.state_dict()
    assert sorted(merged) == sorted(rollout_sd)
    assert all(torch.equal(merged[k], rollout_sd[k]) for k in merged)
    # the merged weights differ from the base exactly where there is an adapter
    base = build_actor(make_config(path)).actor_module.state_dict()
    changed = {k for k in merged if not torch.equal(merged[k], base[k])}
    assert changed and all(any(m in k for m in ("_proj",)) for k in changed)
    lp = worker.compute_log_prob(DataProto.from_dict(tensors=dict(out.batch.items()))).batch["old_log_probs"]
    mask = out.batch["response_mask"].bool()
    assert (lp - out.batch["rollout_log_probs"])[mask].abs().max() < 1e-5


# -- checkpoints --------------------------------------------------------------------------------


def test_checkpoint_has_a_peft_adapter_and_a_merged_export_that_contain_the_update(tiny, tmp_path):
    import json

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    path, tok = tiny
    worker = build_actor(lora_config(path, rank=4))
    batch = rollout_batch(worker, tok)
    batch.meta_info["use_current_as_old_log_prob"] = True
    worker.update_actor(batch)
    ckpt = tmp_path / "ckpt"
    worker.save_checkpoint(str(ckpt), global_step=1)
    adapter_cfg = json.loads((ckpt / "lora_adapter" / "adapter_config.json").read_text())
    assert adapter_cfg["r"] == 4 and adapter_cfg["lora_alpha"] == 8 and adapter_cfg["peft_type"] == "LORA"
    assert (ckpt / "lora_adapter" / "adapter_model.safetensors").is_file()
    meta = json.loads((ckpt / "checkpoint_meta.json").read_text())
    assert meta["lora"] == {"adapter_dir": "lora_adapter", "save_lora_only": False}

    ids = batch.batch["input_ids"][:4]
    mask = batch.batch["attention_mask"][:4]
    with torch.no_grad():
        actor_logits = worker.actor_module(input_ids=ids, attention_mask=mask).logits
        base_logits = AutoModelForCausalLM.from_pretrained(path)(input_ids=ids, attention_mask=mask).logits
        # peft loads the adapter onto a fresh base: the actor's function exactly
        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), str(ckpt / "lora_adapter"))
        assert torch.equal(loaded(input_ids=ids, attention_mask=mask).logits, actor_logits)
        # the merged export is a plain transformers model that really contains the adapter
        merged = AutoModelForCausalLM.from_pretrained(str(ckpt / "huggingface"))
        merged_logits = merged(input_ids=ids, attention_mask=mask).logits
    assert type(merged).__name__ == "LlamaForCausalLM"
    assert float((merged_logits - actor_logits).abs().max()) < 1e-5
    assert float((base_logits - actor_logits).abs().max()) > 1e-3


def test_adapter_only_checkpoint_resumes_exactly(tiny, tmp_path):
    path, tok = tiny
    cfg = lora_config(path, **{"actor_rollout_ref.actor.checkpoint.save_lora_only": True})
    straight = build_actor(cfg)
    batch = rollout_batch(straight, tok)
    batch.meta_info["use_current_as_old_log_prob"] = True
    straight.update_actor(batch)
    ckpt = tmp_path / "ckpt"
    straight.save_checkpoint(str(ckpt), global_step=1)
    assert not (ckpt / "huggingface" / "model.safetensors").exists()  # adapter only: no merged export
    assert (ckpt / "lora_adapter" / "adapter_model.safetensors").is_file()
    m2 = straight.update_actor(batch).meta_info["metrics"]
    expected = straight.compute_log_prob(batch).batch["old_log_probs"]

    resumed = build_actor(cfg)  # a fresh process would build the same base + a new adapter
    resumed.load_checkpoint(str(ckpt))
    r2 = resumed.update_actor(batch).meta_info["metrics"]
    got = resumed.compute_log_prob(batch).batch["old_log_probs"]
    assert torch.equal(got, expected)
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "actor/lr"):
        assert r2[key] == m2[key], key


def test_full_checkpoint_cannot_be_resumed_by_a_lora_actor(tiny, tmp_path):
    path, _ = tiny
    full = build_actor(make_config(path))
    full.save_checkpoint(str(tmp_path / "full"), global_step=1)
    worker = build_actor(lora_config(path))
    with pytest.raises(FileNotFoundError, match="LoRA checkpoint weights"):
        worker.load_checkpoint(str(tmp_path / "full"))


# -- critic -------------------------------------------------------------------------------------


def test_lora_critic_trains_adapter_and_value_head_and_resumes(tiny, tmp_path):
    import json

    from test_workers_common import PROMPTS, RESPONSES, make_batch

    from verl.workers.fsdp_workers import CriticWorker

    path, tok = tiny
    cfg = make_config(path, **{"critic.model.lora_rank": 4, "critic.model.lora_alpha": 8, "critic.optim.lr": 1e-2})
    worker = CriticWorker(config=cfg.critic)
    worker.init_model()
    trainable = {n for n, p in worker.critic_module.named_parameters() if p.requires_grad}
    heads = {n for n in trainable if ".lora_" not in n}
    assert heads == {
        "base_model.model.score.modules_to_save.default.weight",
        "base_model.model.score.modules_to_save.default.bias",
    }
    tensors = make_batch(tok, PROMPTS, RESPONSES, prompt_len=8, resp_len=6)
    batch = DataProto.from_dict(tensors=tensors)
    values = worker.compute_values(batch).batch["values"]
    batch.batch["values"] = values
    batch.batch["returns"] = torch.ones_like(values) * tensors["response_mask"]
    losses = [worker.update_critic(batch).meta_info["metrics"]["critic/vf_loss"][0] for _ in range(4)]
    assert losses[-1] < losses[0]
    worker.save_checkpoint(str(tmp_path / "critic"), global_step=1)
    saved = json.loads((tmp_path / "critic" / "lora_adapter" / "adapter_config.json").read_text())
    assert saved["r"] == 4 and saved["task_type"] == "TOKEN_CLS"
    expected = worker.compute_values(batch).batch["values"]
    fresh = CriticWorker(config=cfg.critic)
    fresh.init_model()
    fresh.load_checkpoint(str(tmp_path / "critic"))
    assert torch.equal(fresh.compute_values(batch).batch["values"], expected)  # adapter + value head restored


def test_reward_model_rejects_lora_keys(tiny):
    from verl.workers.fsdp_workers import RewardModelWorker

    path, _ = tiny
    cfg = make_config(
        path, **{"reward_model.enable": True, "reward_model.model.path": path, "reward_model.model.lora_rank": 4}
    )
    worker = RewardModelWorker(config=cfg.reward_model)
    with pytest.raises(ValueError, match="reward_model.model.lora_rank=4"):
        worker.init_model()


class _OwnWeightsEngine:
    """Stands in for vLLM on CPU: built from the model path (its own weights, no adapter layers),
    receives the actor's weights by Hugging Face name at every sync."""

    def __init__(self, model_path, config, tokenizer=None, trust_remote_code=False):
        from verl.utils.model import build_causal_lm
        from verl.workers.rollout.hf_rollout import HFRollout

        self.inner = HFRollout(build_causal_lm(model_path).requires_grad_(False), config, owns_module=True)
        self.received: list[list[str]] = []

    def shares_weights_with(self, module):
        return False

    def update_weights(self, weights):
        self.received.append(sorted(weights))
        self.inner.update_weights(weights)

    def generate_sequences(self, prompts):
        return self.inner.generate_sequences(prompts)

    def probe_log_probs(self, *args):
        return self.inner.probe_log_probs(*args)

    def release(self):
        pass

    def resume(self):
        pass


def test_an_engine_with_its_own_weights_gets_merged_plain_named_weights(tiny):
    """The vLLM code path (vLLM itself cannot run here): merged weights under the base model's
    names, verified by the sync check after every update."""
    from verl.workers.rollout.base import ROLLOUT_REGISTRY

    path, tok = tiny
    ROLLOUT_REGISTRY["lora_test_engine"] = _OwnWeightsEngine
    try:
        worker = build_actor(lora_config(path, **{"actor_rollout_ref.rollout.name": "lora_test_engine"}))
        batch = rollout_batch(worker, tok)
        batch.meta_info["use_current_as_old_log_prob"] = True
        worker.update_actor(batch)
        out = worker.generate_sequences(prompt_batch(tok))
        assert out.meta_info["metrics"]["rollout/weight_sync_max_logp_diff"] < 1e-5
        engine = worker.rollout
        assert len(engine.received) == 2
        plain = sorted(engine.inner.module.state_dict())
        assert engine.received[-1] == plain and not any("lora_" in k or "base_layer" in k for k in plain)
    finally:
        ROLLOUT_REGISTRY.pop("lora_test_engine", None)


def test_lora_with_gradient_checkpointing_gives_the_same_update(tiny):
    path, tok = tiny
    plain = build_actor(lora_config(path))
    ckpt = build_actor(lora_config(path, **{"actor_rollout_ref.model.enable_gradient_checkpointing": True}))
    batch = rollout_batch(plain, tok)
    batch.meta_info["use_current_as_old_log_prob"] = True
    plain.update_actor(batch)
    ckpt.update_actor(batch)
    a = plain.compute_log_prob(batch).batch["old_log_probs"]
    b = ckpt.compute_log_prob(batch).batch["old_log_probs"]
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert float((a - ckpt.compute_ref_log_prob(batch).batch["ref_log_prob"]).abs().max()) > 1e-3  # it trained
