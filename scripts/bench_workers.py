#!/usr/bin/env python
"""Throughput of the worker engines: generate, compute_log_prob and update_actor, in tokens/s,
for a tiny (~1M) and a small (~30M parameter) Llama, with world size 1 and 2, plus padding waste.

Setup (all offline, random weights): a character-level tokenizer (vocabulary 48); prompts of
8..48 tokens left-padded to 64; `rollout.n` samples per prompt, up to 32 response tokens (the EOS
logit is boosted so that response lengths vary as in real RL batches); fp32 on CPU.

- world size 1: one `ActorRolloutRefWorker` in this process;
- world size 2: two Ray workers (FSDP2 over gloo);
each rank with `--threads_per_rank` torch threads (default 1: on a shared 2-core machine more
threads than free cores makes OpenMP spin-wait and runs ~30x slower, measured).

Tokens counted: generate = generated response tokens (valid ones); compute_log_prob and
update_actor = valid prompt + response tokens of the batch. Padding waste = share of the token
slots computed by the model that are padding, with the engine's length bucketing/compaction
(`padding_waste`) and for reference with plain padded rows (`padded_waste`).

Usage:
    python scripts/bench_workers.py                      # both sizes, world size 1 and 2
    python scripts/bench_workers.py --sizes tiny --world_sizes 1 --prompts 8 --repeats 1   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

SIZES = {
    # name: (hidden, layers, heads, intermediate)
    "tiny": (128, 4, 4, 512),
    "small": (512, 8, 8, 2048),
}


def build_model(out_dir: str, size: str) -> int:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    for ch in string.digits + string.ascii_lowercase + "+-=*?:., ":
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", padding_side="left"
    )
    fast.save_pretrained(out_dir)
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    cfg = json.load(open(cfg_path))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    json.dump(cfg, open(cfg_path, "w"))
    hidden, layers, heads, inter = SIZES[size]
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # a random model almost never emits EOS; make it likely enough that lengths vary
        model.lm_head.weight[2] += 0.05 * model.lm_head.weight.std() * torch.sign(model.lm_head.weight.mean(0))
        model.lm_head.bias = None
    model.save_pretrained(out_dir)
    return sum(p.numel() for p in model.parameters())


def worker_config(path: str, args, world_size: int):
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(REPO_ROOT / "verl" / "trainer" / "config" / "ppo_trainer.yaml")
    n_seq = args.prompts * args.n
    overrides = {
        "actor_rollout_ref.model.path": path,
        "actor_rollout_ref.model.use_remove_padding": args.use_remove_padding,
        "data.max_prompt_length": 64,
        "data.max_response_length": args.response_length,
        "actor_rollout_ref.rollout.n": args.n,
        "actor_rollout_ref.actor.ppo_mini_batch_size": args.prompts,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": None,
        "actor_rollout_ref.actor.use_dynamic_bsz": True,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": args.max_token_len,
        "actor_rollout_ref.actor.optim.lr": 1e-5,
        "actor_rollout_ref.rollout.micro_batch_size": None,
    }
    del n_seq
    from verl.trainer.config.upstream_keys import apply_embedded_preset, check_upstream_surface

    # the embedded job's settings for keys not set here; upstream's keys mapped onto ours (what workers read)
    apply_embedded_preset(cfg, [f"{key}=" for key in overrides], always=True)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return OmegaConf.create(OmegaConf.to_container(check_upstream_surface(cfg), resolve=True)).actor_rollout_ref


def make_prompts(tok, args, seed: int):
    from verl.protocol import DataProto
    from verl.utils.model import compute_position_id_with_mask

    rng = np.random.default_rng(seed)
    chars = string.digits + "+="
    texts = ["".join(rng.choice(list(chars), size=int(rng.integers(8, 49)))) for _ in range(args.prompts)]
    enc = tok(texts, add_special_tokens=False, padding="max_length", max_length=64, return_tensors="pt")
    mask = enc["attention_mask"]
    data = DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": compute_position_id_with_mask(mask),
        },
        non_tensors={"uid": np.array([str(i) for i in range(args.prompts)], dtype=object)},
        meta_info={"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id},
    )
    return data.repeat(args.n, interleave=True)


def run_step(wg, tok, args, seed: int) -> dict:
    """One generate -> compute_log_prob -> update_actor round; returns timings and token counts."""
    from verl.protocol import DataProto

    prompts = make_prompts(tok, args, seed)
    t0 = time.perf_counter()
    gen = wg.generate_sequences(prompts)
    t_gen = time.perf_counter() - t0
    batch = DataProto.from_dict(tensors=dict(gen.batch.items()), non_tensors={"uid": prompts.non_tensor_batch["uid"]})
    t0 = time.perf_counter()
    lp = wg.compute_log_prob(batch)
    t_lp = time.perf_counter() - t0
    batch.batch["old_log_probs"] = lp.batch["old_log_probs"]
    g = torch.Generator().manual_seed(seed)
    batch.batch["advantages"] = torch.randn(len(batch), generator=g).unsqueeze(1) * batch.batch["response_mask"]
    t0 = time.perf_counter()
    upd = wg.update_actor(batch)
    t_upd = time.perf_counter() - t0
    mask = batch.batch["attention_mask"]
    metrics = upd.meta_info["metrics"]
    lp_metrics = lp.meta_info.get("metrics", {})
    waste_lp = lp_metrics.get("actor/padding_waste_log_prob")
    waste_lp = float(np.mean(waste_lp)) if isinstance(waste_lp, list) else float(waste_lp)
    return {
        "gen_s": t_gen,
        "log_prob_s": t_lp,
        "update_s": t_upd,
        "response_tokens": int(batch.batch["response_mask"].sum()),
        "valid_tokens": int(mask.sum()),
        "token_slots_padded": int(mask.numel()),
        "padding_waste_update": float(np.mean(metrics["actor/padding_waste"])),
        "padding_waste_log_prob": waste_lp,
    }


class LocalGroup:
    """The in-process worker behind the same call surface as a worker group."""

    def __init__(self, worker):
        self.w = worker

    def __getattr__(self, name):
        return getattr(self.w, name)


def bench(size: str, world_size: int, args) -> dict:
    from transformers import AutoTokenizer

    tmp = tempfile.mkdtemp(prefix=f"bench_{size}_")
    n_params = build_model(tmp, size)
    tok = AutoTokenizer.from_pretrained(tmp)
    cfg = worker_config(tmp, args, world_size)
    cleanup = None
    if world_size == 1:
        torch.set_num_threads(args.threads_per_rank)
        from verl.workers.fsdp_workers import ActorRolloutRefWorker

        worker = ActorRolloutRefWorker(config=cfg, role="actor_rollout")
        worker.init_model()
        wg = LocalGroup(worker)
    else:
        import ray

        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
        from verl.workers.fsdp_workers import ActorRolloutRefWorker

        if not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(
                num_cpus=max(2, world_size),
                include_dashboard=False,
                logging_level="WARNING",
                _node_ip_address="127.0.0.1",
                runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT)}},
            )
        pool = RayResourcePool(process_on_nodes=[world_size], use_gpu=False, num_cpus_per_worker=1)
        wg = RayWorkerGroup(
            pool,
            RayClassWithInitArgs(cls=ActorRolloutRefWorker, config=cfg, role="actor_rollout"),
            num_threads_per_worker=args.threads_per_rank,
        )
        wg.init_model()

        def cleanup():
            wg.kill_workers()
            pool.release()

    run_step(wg, tok, args, seed=999)  # warm-up (allocations, lazy inits)
    rows = [run_step(wg, tok, args, seed=s) for s in range(args.repeats)]
    if cleanup:
        cleanup()
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    return {
        "size": size,
        "params_M": round(n_params / 1e6, 2),
        "world_size": world_size,
        "sequences": args.prompts * args.n,
        "generate_tok_s": round(med("response_tokens") / med("gen_s"), 1),
        "compute_log_prob_tok_s": round(med("valid_tokens") / med("log_prob_s"), 1),
        "update_actor_tok_s": round(med("valid_tokens") / med("update_s"), 1),
        "padding_waste_log_prob": round(med("padding_waste_log_prob"), 3),
        "padding_waste_update": round(med("padding_waste_update"), 3),
        "padded_waste": round(1 - med("valid_tokens") / med("token_slots_padded"), 3),
        "mean_response_len": round(med("response_tokens") / (args.prompts * args.n), 1),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="tiny,small")
    parser.add_argument("--world_sizes", default="1,2")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--response_length", type=int, default=32)
    parser.add_argument(
        "--max_token_len", type=int, default=2048, help="token budget per micro-batch (dynamic batch size)"
    )
    parser.add_argument("--threads_per_rank", type=int, default=1, help="torch threads of each rank")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--use_remove_padding", type=lambda s: s.lower() in ("1", "true", "yes"), default=True)
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    os.environ.setdefault("VERL_DEVICE", "cpu")
    results = []
    for size in args.sizes.split(","):
        for ws in (int(x) for x in args.world_sizes.split(",")):
            res = bench(size, ws, args)
            print(json.dumps(res), flush=True)
            results.append(res)
    cols = [
        "size",
        "params_M",
        "world_size",
        "generate_tok_s",
        "compute_log_prob_tok_s",
        "update_actor_tok_s",
        "padding_waste_log_prob",
        "padding_waste_update",
        "padded_waste",
        "mean_response_len",
    ]
    print("\n| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in results:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
