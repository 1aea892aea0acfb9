#!/usr/bin/env python
"""Build the embedded default that `python -m verl.trainer.main_ppo` trains when no model/data is given.

Steps (all seeded, all offline, a few minutes on a 2-core CPU):

1. tokenizer: byte-level BPE (the 256 byte symbols, no merges, so digits are always single tokens)
   built with the `tokenizers` library, wrapped as `PreTrainedTokenizerFast` with pad/bos/eos and a
   compact jinja chat template (``<|bos|><|user|>347+85<|end|><|assistant|>``). The tokenizer class is
   written explicitly into tokenizer_config.json so `AutoTokenizer.from_pretrained(dir)` loads exactly
   this tokenizer.json.
2. model: a randomly initialised transformers `LlamaForCausalLM` (about 1M parameters by default).
   Llama, not Qwen2: transformers 5 maps a Qwen2 config.json to `Qwen2Tokenizer` whatever
   tokenizer_config.json says, and that class NFC-normalises text (it does not round-trip).
3. data: the addition toy task (`verl/utils/dataset/toy_tasks.py`) as parquet in the upstream schema:
   `data/train.parquet` and `data/test.parquet` for RL, `sft/train.parquet` and `sft/val.parquet` for
   the warm-up (disjoint problem sets; test excludes every train problem).
4. warm-up: a short supervised run of `verl.trainer.fsdp_sft_trainer` (world size 1) so that RL starts
   from a policy that is sometimes right; the result (model + tokenizer) goes to `model/`.
   `--sft_trainer sft_trainer` runs the same warm-up with `verl.trainer.sft_trainer` (upstream
   main's entry point); `--write_init DIR` writes only the random init and prints that command.
5. evaluation: greedy accuracy, sampled (T=1) mean accuracy and pass@k on the test split, written to
   `build_info.json` together with all build arguments and artifact sizes.

Usage:
    python scripts/build_embedded_default.py                       # rebuild verl/assets/embedded_default
    python scripts/build_embedded_default.py --output_dir /tmp/ed --hidden_size 32 --num_layers 1 \
        --sft_steps 5 --n_train 64 --n_test 32 --n_sft_train 64 --n_sft_val 16   # smoke test
    python scripts/build_embedded_default.py --write_init /tmp/warmup  # then run the printed command
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from verl.utils.dataset.toy_tasks import (  # noqa: E402
    AdditionTask,
    addition_rl_row,
    addition_sft_row,
    generate_addition_problems,
    make_addition_splits,
)

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|end|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS = [PAD, BOS, EOS, *ROLE_TOKENS.values()]

# Each message is <|role|>content<|end|>; the generation prompt opens the assistant turn. The model
# answers with the content and closes with <|end|> (the eos token), so generation stops there.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown chat role ' ~ message['role'] ~ '; expected system, user or assistant') }}"
    "{% endif %}"
    "{{ '<|' ~ message['role'] ~ '|>' ~ message['content'] ~ '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


# ----------------------------------------------------------------------------------------------------
# 1. tokenizer
# ----------------------------------------------------------------------------------------------------
def build_tokenizer(model_max_length: int = 512):
    """Byte-level BPE with no merges plus 6 special tokens; vocabulary of 262 ids.

    Byte symbols take ids 0..255 (in byte order), special tokens 256..261 (pad, bos, eos, system,
    user, assistant). Any UTF-8 text round-trips exactly.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_symbols = pre_tokenizers.ByteLevel.alphabet()  # 256 printable stand-ins for the bytes
    # Order the symbols by the byte they stand for so ids are stable and readable (id == byte value).
    symbol_of_byte = _bytes_to_unicode()
    assert set(symbol_of_byte.values()) == set(byte_symbols)
    vocab = {symbol_of_byte[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    # use_regex=False: no GPT-2 word splitting is needed when there are no merges; add_prefix_space
    # False so "12" and " 12" stay different strings.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens=list(ROLE_TOKENS.values()),
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


# The calculator task's tokenizer: the same bytes and specials plus a <|tool|> role for tool results
# (appended, so every id of the addition tokenizer keeps its meaning). Tool schemas are not rendered:
# the tiny model learns the one tool from demonstrations.
TOOL_ROLE_TOKEN = "<|tool|>"
CALC_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown chat role ' ~ message['role'] ~ '; expected system, user, assistant or tool') }}"
    "{% endif %}"
    "{{ '<|' ~ message['role'] ~ '|>' ~ message['content'] ~ '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_calculator_tokenizer(model_max_length: int = 512):
    """`build_tokenizer()` + the `<|tool|>` role (id 262), `<tool_call>` / `</tool_call>` as single
    (non-special, so decoding keeps them) tokens 263 / 264, and a template that renders tool messages."""
    tok = build_tokenizer(model_max_length)
    tok.add_special_tokens({"additional_special_tokens": [*ROLE_TOKENS.values(), TOOL_ROLE_TOKEN]})
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    tok.chat_template = CALC_CHAT_TEMPLATE
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """The GPT-2 byte -> printable unicode symbol table used by the ByteLevel pre-tokenizer."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def save_tokenizer(tokenizer, out_dir: str | os.PathLike) -> None:
    """save_pretrained, then pin `tokenizer_class` so AutoTokenizer never guesses from config.json."""
    out_dir = Path(out_dir)
    tokenizer.save_pretrained(out_dir)
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------------------------------
# 2. model
# ----------------------------------------------------------------------------------------------------
def build_model(
    tokenizer,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    seed: int,
):
    """A randomly initialised LlamaForCausalLM with tied input/output embeddings (float32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} must be divisible by num_kv_heads={num_kv_heads}")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


# ----------------------------------------------------------------------------------------------------
# 3. data
# ----------------------------------------------------------------------------------------------------
def write_parquet(rows: list[dict], path: str | os.PathLike) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), str(path))


# ----------------------------------------------------------------------------------------------------
# 4. warm-up (SFT) with an imperfect teacher
# ----------------------------------------------------------------------------------------------------
def draw_problem_sets(task, args, make_splits, prefix: str = "") -> tuple[list, list, list, list]:
    """Disjoint (train, test, sft_train, sft_val) problem lists: RL splits from `make_splits`, then
    SFT problems that avoid them (streams named `<prefix>sft_val` / `<prefix>sft_train`)."""
    train, test = make_splits(task, args.n_train, args.n_test, args.seed)
    used = set(train) | set(test)
    sft_val = generate_addition_problems(task, args.n_sft_val, args.seed, f"{prefix}sft_val", exclude=used)
    sft_train = generate_addition_problems(
        task, args.n_sft_train, args.seed, f"{prefix}sft_train", exclude=used | set(sft_val)
    )
    return train, test, sft_train, sft_val


def write_sft_data(
    out_dir: Path,
    task: AdditionTask,
    sft_train: list[tuple[int, int]],
    sft_val: list[tuple[int, int]],
    careless_rate: float,
    seed: int,
) -> dict[str, str]:
    """SFT parquet files. With probability ``careless_rate`` a problem's response is the carry-dropping answer.

    The warm-up imitates a teacher who often forgets to carry: the resulting policy knows both the
    correct algorithm and the mistake, prefers the mistake on problems with a carry (greedy is wrong
    there) but samples the correct answer often enough for group-relative RL to find and reinforce it.
    """
    import random

    rng = random.Random(seed * 7919 + 17)
    paths = {"sft_train": out_dir / "sft" / "train.parquet", "sft_val": out_dir / "sft" / "val.parquet"}
    write_parquet(
        [
            addition_sft_row(a, b, "sft_train", i, careless=rng.random() < careless_rate)
            for i, (a, b) in enumerate(sft_train)
        ],
        paths["sft_train"],
    )
    write_parquet(
        [
            addition_sft_row(a, b, "sft_val", i, careless=rng.random() < careless_rate)
            for i, (a, b) in enumerate(sft_val)
        ],
        paths["sft_val"],
    )
    return {k: str(v) for k, v in paths.items()}


def warmup_overrides(init_dir, sft_paths: dict, work_dir, args, multiturn: bool = False) -> list[str]:
    """The warm-up's Hydra overrides for `verl.trainer.fsdp_sft_trainer` (config `sft_trainer`,
    what built the shipped assets) or, with `args.sft_trainer == "sft_trainer"`, the same run in
    the keys of `verl.trainer.sft_trainer` (config `sft_trainer_engine`)."""
    if getattr(args, "sft_trainer", "fsdp_sft_trainer") == "sft_trainer":
        return [
            f"data.train_files={sft_paths['sft_train']}",
            f"data.val_files={sft_paths['sft_val']}",
            f"model.path={init_dir}",
            f"data.max_length={args.max_length}",
            f"data.train_batch_size={args.sft_batch_size}",
            f"data.micro_batch_size_per_gpu={args.sft_batch_size}",
            "data.use_dynamic_bsz=False",
            "data.num_workers=0",
            "model.enable_gradient_checkpointing=False",
            f"engine.seed={args.seed}",
            f"optim.lr={args.sft_lr}",
            "optim.betas=[0.9,0.95]",
            "optim.weight_decay=0.01",
            f"optim.lr_warmup_steps_ratio={args.sft_warmup_ratio}",
            "optim.lr_scheduler_type=cosine",
            f"optim.min_lr_ratio={args.sft_min_lr_ratio}",
            f"trainer.default_local_dir={Path(work_dir) / 'sft_ckpt'}",
            f"trainer.total_training_steps={args.sft_steps}",
            "trainer.total_epochs=1000",
            f"trainer.seed={args.seed}",
            f"trainer.test_freq={max(1, args.sft_steps // 4)}",
            "trainer.device=cpu",
            "trainer.logger=[console]",
        ]
    return [
        f"data.train_files={sft_paths['sft_train']}",
        f"data.val_files={sft_paths['sft_val']}",
        *(
            ["data.multiturn.enable=True", "data.multiturn.messages_key=messages"]
            if multiturn
            else ["data.prompt_key=prompt", "data.response_key=response"]
        ),
        f"data.max_length={args.max_length}",
        f"data.train_batch_size={args.sft_batch_size}",
        f"data.micro_batch_size_per_gpu={args.sft_batch_size}",
        f"data.seed={args.seed}",
        f"model.partial_pretrain={init_dir}",
        f"optim.lr={args.sft_lr}",
        "optim.betas=[0.9,0.95]",
        "optim.weight_decay=0.01",
        f"optim.warmup_steps_ratio={args.sft_warmup_ratio}",
        "optim.lr_scheduler=cosine",
        f"optim.min_lr_ratio={args.sft_min_lr_ratio}",
        f"trainer.default_local_dir={Path(work_dir) / 'sft_ckpt'}",
        f"trainer.total_training_steps={args.sft_steps}",
        "trainer.total_epochs=1000",
        f"trainer.seed={args.seed}",
        f"trainer.test_freq={max(1, args.sft_steps // 4)}",
        f"trainer.log_freq={max(1, args.sft_steps // 10)}",
        "trainer.device=cpu",
        f"trainer.torch_threads={args.threads}",
    ]


def run_warmup(
    init_dir: Path, sft_paths: dict[str, str], work_dir: Path, args, multiturn: bool = False
) -> tuple[str, dict]:
    """Run the warm-up SFT (one process) from the random init; returns (model dir, result).
    `multiturn`: rows are `messages` conversations, trained on the assistant turns only."""
    from hydra import compose, initialize_config_module

    overrides = warmup_overrides(init_dir, sft_paths, work_dir, args, multiturn)
    new = getattr(args, "sft_trainer", "fsdp_sft_trainer") == "sft_trainer"
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="sft_trainer_engine" if new else "sft_trainer", overrides=overrides)
    if new:
        from verl.trainer.sft_trainer import run_sft

        result = run_sft(cfg)
        result["skipped_steps"] = 0
        return os.path.join(result["final_checkpoint"], "huggingface"), result
    from verl.trainer.fsdp_sft_trainer import run_sft

    result = run_sft(cfg)
    return result["final_checkpoint"], result


# ----------------------------------------------------------------------------------------------------
# 5. evaluation
# ----------------------------------------------------------------------------------------------------
def generate_left_padded(
    model, tok, prompt_ids: list[list[int]], do_sample: bool, max_new_tokens: int, batch_size: int
) -> list[str]:
    """Continuation texts of `prompt_ids`, `batch_size` prompts at a time, each batch left padded to its
    longest prompt; sampled at temperature 1 (no top-k/top-p) or greedy; special tokens skipped."""
    import torch

    texts = []
    for i in range(0, len(prompt_ids), batch_size):
        chunk = prompt_ids[i : i + batch_size]
        width = max(map(len, chunk))
        ids = torch.full((len(chunk), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for j, p in enumerate(chunk):
            ids[j, width - len(p) :] = torch.tensor(p)
            mask[j, width - len(p) :] = 1
        kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if do_sample else dict(do_sample=False)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
                **kwargs,
            )
        texts.extend(tok.batch_decode(out[:, width:], skip_special_tokens=True))
    return texts


def addition_metrics(
    rows: list[dict], greedy_text: list[str], greedy: list[float], sampled: list[float], n_samples: int
) -> dict:
    """The accuracy dict of `evaluate_model` (without `eval_seconds`): `greedy` holds one score per row,
    `sampled` `n_samples` scores per row (row-major); the carry split uses the rows' `extra_info` a, b."""
    per_prompt = [sampled[i * n_samples : (i + 1) * n_samples] for i in range(len(rows))]
    carry = [AdditionTask.has_carry(r["extra_info"]["a"], r["extra_info"]["b"]) for r in rows]
    careless_greedy = [
        t.strip() == AdditionTask.careless_answer(r["extra_info"]["a"], r["extra_info"]["b"])
        for t, r, c in zip(greedy_text, rows, carry, strict=False)
        if c
    ]
    n_carry = max(1, sum(carry))
    return {
        "n_prompts": len(rows),
        "greedy_accuracy": sum(greedy) / len(rows),
        "sampled_accuracy_t1": sum(sampled) / len(sampled),
        f"pass@{n_samples}_t1": sum(max(p) for p in per_prompt) / len(rows),
        "greedy_accuracy_no_carry": sum(g for g, c in zip(greedy, carry, strict=False) if not c)
        / max(1, len(rows) - sum(carry)),
        "greedy_accuracy_with_carry": sum(g for g, c in zip(greedy, carry, strict=False) if c) / n_carry,
        "greedy_careless_rate_with_carry": sum(careless_greedy) / n_carry,
        "fraction_with_carry": sum(carry) / len(rows),
    }


def evaluate_model(
    model_dir: str,
    test_path: str,
    n_samples: int,
    max_new_tokens: int,
    seed: int,
    batch_size: int = 512,
    limit: int | None = None,
) -> dict:
    """Greedy accuracy, sampled (temperature 1, no top-k/top-p) mean accuracy and pass@n_samples.

    Prompts are left padded; generation uses the KV cache and stops at eos; a response that hits
    ``max_new_tokens`` without eos is scored as decoded (it will be wrong for this task).
    """
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.utils.reward_score import default_compute_score

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = pq.read_table(test_path).to_pylist()
    if limit:
        rows = rows[:limit]
    prompts = [
        tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True)["input_ids"] for r in rows
    ]

    def score(text: str, row: dict) -> float:
        return float(
            default_compute_score(row["data_source"], text, row["reward_model"]["ground_truth"], row["extra_info"])
        )

    torch.manual_seed(seed)
    t0 = time.time()
    greedy_text = generate_left_padded(model, tok, prompts, False, max_new_tokens, batch_size)
    greedy = [score(t, r) for t, r in zip(greedy_text, rows, strict=False)]
    sampled_prompts = [p for p in prompts for _ in range(n_samples)]
    sampled_text = generate_left_padded(model, tok, sampled_prompts, True, max_new_tokens, batch_size)
    sampled = [score(t, rows[i // n_samples]) for i, t in enumerate(sampled_text)]
    return addition_metrics(rows, greedy_text, greedy, sampled, n_samples) | {"eval_seconds": time.time() - t0}


# ----------------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------------
def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_out = REPO_ROOT / "verl" / "assets" / "embedded_default"
    p.add_argument("--output_dir", default=str(default_out), help="where model/, data/, sft/ and build_info.json go")
    p.add_argument("--seed", type=int, default=0)
    # task
    p.add_argument("--min_digits", type=int, default=2)
    p.add_argument("--max_digits", type=int, default=2)
    p.add_argument("--n_train", type=int, default=2048, help="RL training prompts")
    p.add_argument("--n_test", type=int, default=256, help="RL validation prompts")
    p.add_argument("--n_sft_train", type=int, default=4096)
    p.add_argument("--n_sft_val", type=int, default=256)
    p.add_argument(
        "--careless_rate",
        type=float,
        default=0.7,
        help="probability that the warm-up teacher answers with the carry-dropping sum",
    )
    # model
    p.add_argument("--hidden_size", type=int, default=128)
    p.add_argument("--num_layers", type=int, default=4)
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument("--num_kv_heads", type=int, default=2)
    p.add_argument("--intermediate_size", type=int, default=512)
    p.add_argument("--max_position_embeddings", type=int, default=256)
    # warm-up
    p.add_argument("--sft_steps", type=int, default=1500)
    p.add_argument("--sft_batch_size", type=int, default=64)
    p.add_argument("--sft_lr", type=float, default=2e-3)
    p.add_argument("--sft_warmup_ratio", type=float, default=0.05)
    p.add_argument("--sft_min_lr_ratio", type=float, default=0.1)
    p.add_argument("--max_length", type=int, default=24, help="SFT sequence length (prompt + response tokens)")
    p.add_argument(
        "--sft_trainer",
        choices=("fsdp_sft_trainer", "sft_trainer"),
        default="fsdp_sft_trainer",
        help="entry point of the warm-up (the shipped assets were built with fsdp_sft_trainer)",
    )
    p.add_argument(
        "--write_init",
        metavar="DIR",
        help="only write the tokenizer + random-init model to DIR/init and print the sft_trainer command "
        "that trains the warm-up on the shipped SFT data",
    )
    # evaluation
    p.add_argument("--eval_samples", type=int, default=8, help="samples per prompt for sampled accuracy / pass@k")
    p.add_argument("--eval_max_new_tokens", type=int, default=8)
    p.add_argument("--skip_eval", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 gives reproducible timings)")
    return p.parse_args(argv)


def save_addition_init(args, work: Path) -> tuple:
    """Build the tokenizer and the random-init model and save both to `work`/init; returns
    (tokenizer, parameter count, init dir)."""
    tokenizer = build_tokenizer()
    model = build_model(
        tokenizer,
        args.hidden_size,
        args.num_layers,
        args.num_heads,
        args.num_kv_heads,
        args.intermediate_size,
        args.max_position_embeddings,
        args.seed,
    )
    n_params = sum(p.numel() for p in model.parameters())
    init_dir = work / "init"
    model.save_pretrained(init_dir)
    save_tokenizer(tokenizer, init_dir)
    del model
    return tokenizer, n_params, init_dir


def write_addition_data(staging: Path, task, args) -> tuple[tuple[list, list, list, list], dict[str, Path], dict]:
    """Draw the problem sets and write the RL parquet files (`staging`/data) and the SFT ones
    (`staging`/sft); returns ((train, test, sft_train, sft_val), RL paths, SFT paths)."""
    train, test, sft_train, sft_val = draw_problem_sets(task, args, make_addition_splits)
    data_paths = {"train": staging / "data" / "train.parquet", "test": staging / "data" / "test.parquet"}
    write_parquet([addition_rl_row(a, b, "train", i) for i, (a, b) in enumerate(train)], data_paths["train"])
    write_parquet([addition_rl_row(a, b, "test", i) for i, (a, b) in enumerate(test)], data_paths["test"])
    sft_paths = write_sft_data(staging, task, sft_train, sft_val, args.careless_rate, args.seed)
    return (train, test, sft_train, sft_val), data_paths, sft_paths


def sft_record(args, sft_seconds: float, history: list[dict]) -> dict:
    """The `sft` entry of build_info.json: the warm-up's settings, its wall time and its last losses."""
    return {
        "steps": args.sft_steps,
        "batch_size": args.sft_batch_size,
        "lr": args.sft_lr,
        "seconds": round(sft_seconds, 1),
        "threads": args.threads,
        "final_train_loss": history[-1]["train/loss"] if history else None,
        "final_val_loss": next((h["val/loss"] for h in reversed(history) if "val/loss" in h), None),
    }


def addition_build_info(
    args, splits: tuple, n_params: int, vocab_size: int, sft_seconds: float, sft_result: dict, metrics: dict
) -> dict:
    """build_info.json of the addition build, without the sizes and the total build time (known only
    once the output directory is written)."""
    import torch

    train, test, sft_train, sft_val = splits
    return {
        "task": {
            "data_source": "verl_toy/addition",
            "min_digits": args.min_digits,
            "max_digits": args.max_digits,
            "n_train": len(train),
            "n_test": len(test),
            "n_sft_train": len(sft_train),
            "n_sft_val": len(sft_val),
            "careless_rate": args.careless_rate,
        },
        "model": {
            "architecture": "LlamaForCausalLM",
            "parameters": n_params,
            "hidden_size": args.hidden_size,
            "num_layers": args.num_layers,
            "num_heads": args.num_heads,
            "num_kv_heads": args.num_kv_heads,
            "intermediate_size": args.intermediate_size,
            "vocab_size": vocab_size,
        },
        "sft": sft_record(args, sft_seconds, sft_result["history"]) | {"skipped_steps": sft_result["skipped_steps"]},
        "eval_test_split": metrics,
        "build_args": vars(args) | {"output_dir": None},
        "torch": torch.__version__,
    }


def write_init_and_command(args) -> str:
    """`--write_init DIR`: the random init in DIR/init and the command that trains the warm-up
    with `verl.trainer.sft_trainer` on the shipped `sft/` data (returned and printed)."""
    import shlex

    _, _, init_dir = save_addition_init(args, Path(args.write_init))
    shipped = REPO_ROOT / "verl" / "assets" / "embedded_default" / "sft"
    paths = {"sft_train": shipped / "train.parquet", "sft_val": shipped / "val.parquet"}
    args.sft_trainer = "sft_trainer"
    overrides = warmup_overrides(init_dir, paths, Path(args.write_init), args)
    command = " ".join(["python -m verl.trainer.sft_trainer", *(shlex.quote(o) for o in overrides)])
    print(command)
    return command


def main(argv=None) -> dict:
    args = parse_args(argv)
    import tempfile

    import torch

    torch.set_num_threads(args.threads)
    if args.write_init:
        return {"command": write_init_and_command(args)}
    out = Path(args.output_dir).resolve()
    task = AdditionTask(args.min_digits, args.max_digits)
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="verl_embedded_build_") as tmp:
        work = Path(tmp)
        staging = work / "out"
        # 1-3: tokenizer, random init, data
        tokenizer, n_params, init_dir = save_addition_init(args, work)
        splits, data_paths, sft_paths = write_addition_data(staging, task, args)
        # 4: warm-up
        t_sft = time.time()
        final_ckpt, sft_result = run_warmup(init_dir, sft_paths, work, args)
        sft_seconds = time.time() - t_sft
        shutil.copytree(final_ckpt, staging / "model")
        # 5: evaluation of the shipped checkpoint
        metrics = {}
        if not args.skip_eval:
            metrics = evaluate_model(
                str(staging / "model"), str(data_paths["test"]), args.eval_samples, args.eval_max_new_tokens, args.seed
            )
        info = addition_build_info(args, splits, n_params, len(tokenizer), sft_seconds, sft_result, metrics)
        # Replace the output directory only once everything succeeded.
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staging, out)
    info["sizes_bytes"] = {name: dir_size(out / name) for name in ("model", "data", "sft")}
    info["sizes_bytes"]["total"] = dir_size(out)
    info["build_seconds"] = round(time.time() - t_start, 1)
    (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(
        json.dumps(
            {"output_dir": str(out), "sft": info["sft"], "eval": metrics, "sizes": info["sizes_bytes"]}, indent=2
        )
    )
    return info


# ----------------------------------------------------------------------------------------------------
# the calculator task (multi-turn tool use): verl/assets/embedded_calculator
# ----------------------------------------------------------------------------------------------------
CALC_TOOL_CONFIG = """tools:
  - class_name: verl.tools.calculator_tool.CalculatorTool
    config:
      type: native
    tool_schema:
      type: function
      function:
        name: calculator
        description: Evaluate an arithmetic expression exactly.
        parameters:
          type: object
          properties:
            expression:
              type: string
              description: digits, + - * / and parentheses, e.g. 347*85
          required: [expression]
"""


def _repo_relative(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(REPO_ROOT)) if p.is_relative_to(REPO_ROOT) else str(p)


def parse_calculator_args(argv=None):
    p = argparse.ArgumentParser(description="build verl/assets/embedded_calculator (the tool-use task)")
    p.add_argument("--task", choices=["calculator"], required=True)
    p.add_argument("--output_dir", default=str(REPO_ROOT / "verl" / "assets" / "embedded_calculator"))
    p.add_argument(
        "--init_from",
        default=str(REPO_ROOT / "verl" / "assets" / "embedded_default" / "model"),
        help="warm-start weights (the addition model; embeddings grow by the 3 new tokens); '' = random init",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--a_digits", type=int, default=3)
    p.add_argument("--b_digits", type=int, default=2)
    p.add_argument("--n_train", type=int, default=2048)
    p.add_argument("--n_test", type=int, default=128)
    p.add_argument("--n_sft_train", type=int, default=4096)
    p.add_argument("--n_sft_val", type=int, default=128)
    p.add_argument("--tool_rate", type=float, default=0.3, help="share of teacher demonstrations that call the tool")
    p.add_argument("--hidden_size", type=int, default=128)
    p.add_argument("--num_layers", type=int, default=4)
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument("--num_kv_heads", type=int, default=2)
    p.add_argument("--intermediate_size", type=int, default=512)
    p.add_argument("--max_position_embeddings", type=int, default=256)
    p.add_argument("--sft_steps", type=int, default=400)
    p.add_argument("--sft_batch_size", type=int, default=64)
    p.add_argument("--sft_lr", type=float, default=2e-3)
    p.add_argument("--sft_warmup_ratio", type=float, default=0.05)
    p.add_argument("--sft_min_lr_ratio", type=float, default=0.1)
    p.add_argument("--max_length", type=int, default=56)
    p.add_argument("--skip_eval", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def evaluate_calculator(
    model_dir: str, test_path: str, tool_config: str | None, do_sample: bool = False, seed: int = 0
) -> dict:
    """Accuracy and tool-call rate of the agent loop (tool_agent, verl_toy format) on the test split."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.protocol import DataProto
    from verl.utils.reward_score import default_compute_score
    from verl.workers.config import MultiTurnConfig, RolloutConfig
    from verl.workers.rollout import HFRollout
    from verl.workers.rollout.agent_rollout import AgentRollout

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = pq.read_table(test_path).to_pylist()
    cfg = RolloutConfig(
        prompt_length=16,
        response_length=48,
        do_sample=do_sample,
        temperature=1.0,
        multi_turn=MultiTurnConfig(enable=True, format="verl_toy", tool_config_path=tool_config, max_assistant_turns=3),
    )
    ro = AgentRollout(HFRollout(model, cfg), None, cfg, tok)
    raw = np.empty(len(rows), dtype=object)
    for i, r in enumerate(rows):
        raw[i] = r["prompt"]
    data = DataProto.from_dict(
        tensors={"dummy": torch.zeros(len(rows), 1)},
        non_tensors={"raw_prompt": raw, "agent_name": np.array(["tool_agent"] * len(rows), dtype=object)},
        meta_info={"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id},
    )
    t0 = time.time()
    out = ro.generate_sequences(data)
    span = out.batch["response_mask"].shape[1]
    texts = []
    for i in range(len(rows)):
        m = out.batch["response_mask"][i]
        n = int(m.nonzero().max()) + 1 if m.any() else 0
        texts.append(tok.decode(out.batch["responses"][i, :n].tolist(), skip_special_tokens=True))
    acc = [
        float(default_compute_score(r["data_source"], t, r["reward_model"]["ground_truth"]))
        for t, r in zip(texts, rows, strict=False)
    ]
    calls = [tr["tool_calls"] > 0 for tr in out.non_tensor_batch["agent_trace"]]
    del span
    return {
        "n_prompts": len(rows),
        "accuracy": sum(acc) / len(rows),
        "tool_call_rate": sum(calls) / len(rows),
        "do_sample": do_sample,
        "eval_seconds": round(time.time() - t0, 1),
    }


def greedy_continuations(model, tok, prompts: list[list[int]], max_new_tokens: int) -> list[str]:
    """Greedy continuation texts of left-padded prompts in one batch (special tokens skipped)."""
    import torch

    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
    kw = {"pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id}
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, **kw)
    return tok.batch_decode(out[:, width:], skip_special_tokens=True)


def evaluate_copy(model_dir: str, test_path: str) -> dict:
    """Greedy accuracy of the answer turn when the conversation already holds the tool call and its
    result (``<|tool|>29495<|end|><|assistant|>`` -> ``=29495``): the copy skill that caps what RL
    can reach once the policy always calls the tool. Also the wrong-digit count per position."""
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.utils.dataset.toy_tasks import CalculatorTask

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pairs = [(r["extra_info"]["a"], r["extra_info"]["b"]) for r in pq.read_table(test_path).to_pylist()]
    prompts = [
        tok.apply_chat_template(
            [
                {"role": "user", "content": CalculatorTask.question(a, b)},
                {"role": "assistant", "content": CalculatorTask.tool_call(a, b)},
                {"role": "tool", "content": CalculatorTask.answer(a, b)},
            ],
            add_generation_prompt=True,
            tokenize=True,
        )["input_ids"]
        for a, b in pairs
    ]
    texts = greedy_continuations(model, tok, prompts, max_new_tokens=10)
    truths = [CalculatorTask.final(a, b) for a, b in pairs]
    n = max(map(len, truths))
    wrong = [
        sum(len(t) <= i or t[i] != g[i] for t, g in zip(texts, truths, strict=True) if i < len(g)) for i in range(n)
    ]
    return {
        "n_prompts": len(pairs),
        "copy_accuracy": sum(t == g for t, g in zip(texts, truths, strict=True)) / len(pairs),
        "wrong_chars_per_position": wrong,
    }


def previous_stages(init_from: str, depth: int = 0) -> list:
    """The SFT stages that produced `init_from` (a calculator build's model/), read from the
    build_info.json next to it: its `sft_stages`, or, for a build that did not record them, its
    own stage (from its build_args) after the stages of the model it started from. [] for any
    other start (the addition model, a random init)."""
    info = Path(init_from).parent / "build_info.json" if init_from else None
    if depth > 16 or not info or not info.is_file():
        return []
    prev = json.loads(info.read_text())
    if prev.get("task", {}).get("data_source") != "verl_toy/calculator":
        return []
    if "sft_stages" in prev:  # without the header line of older records
        return [st for st in prev["sft_stages"] if isinstance(st, dict) or str(st)[:1].isdigit()]
    args = prev.get("build_args", {})
    parent = args.get("init_from") or ""
    if parent and not Path(parent).is_absolute():
        parent = str(REPO_ROOT / parent)
    stages = previous_stages(parent, depth + 1)
    stages.append(_stage_record(stages, args, prev.get("eval_test_split", {})))
    return stages


def _stage_record(stages: list, args: dict, metrics: dict) -> dict:
    """One stage of the chain: where it started, its SFT settings, its copy accuracy."""
    init = args.get("init_from") or "random"
    return {
        # earlier stages may be recorded as text ("1: ...") after a header line
        "stage": 1 + sum(isinstance(st, dict) or str(st)[:1].isdigit() for st in stages),
        "init_from": _repo_relative(init) if init != "random" else init,
        "sft_steps": args.get("sft_steps"),
        "sft_lr": args.get("sft_lr"),
        "tool_rate": args.get("tool_rate"),
        "seed": args.get("seed"),
        "copy_accuracy": metrics.get("copy_after_tool_result", {}).get("copy_accuracy"),
        "greedy_accuracy_with_tool": metrics.get("greedy", {}).get("accuracy"),
    }


def calculator_init(args, tokenizer, init_dir: Path) -> int:
    """Save the starting weights (`--init_from` with its embeddings grown to the tokenizer, or a
    random init) and the tokenizer to `init_dir`; returns the parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    if args.init_from:
        model = AutoModelForCausalLM.from_pretrained(args.init_from, dtype=torch.float32)
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    else:
        shape = (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_position_embeddings",
        )
        model = build_model(tokenizer, **{k: getattr(args, k) for k in (*shape, "seed")})
    model.save_pretrained(init_dir)
    save_tokenizer(tokenizer, init_dir)
    return sum(p.numel() for p in model.parameters())


def write_calculator_data(staging: Path, task, args) -> tuple[dict[str, Path], dict[str, Path], dict[str, int]]:
    """RL rows (data/train, data/test), multi-turn SFT rows (sft/train, sft/val; the teacher calls
    the tool with probability `tool_rate`) and tool_config.yaml under `staging`; disjoint problem
    sets. Returns (RL paths, SFT paths, row counts)."""
    import random

    from verl.utils.dataset.toy_tasks import calculator_rl_row, calculator_sft_row, make_calculator_splits

    train, test, sft_train, sft_val = draw_problem_sets(task, args, make_calculator_splits, prefix="calc_")
    data_paths = {"train": staging / "data" / "train.parquet", "test": staging / "data" / "test.parquet"}
    for split, problems in (("train", train), ("test", test)):
        write_parquet([calculator_rl_row(a, b, split, i) for i, (a, b) in enumerate(problems)], data_paths[split])
    rng = random.Random(args.seed * 7919 + 29)  # one stream: train rows first, then val rows
    sft_paths = {"sft_train": staging / "sft" / "train.parquet", "sft_val": staging / "sft" / "val.parquet"}
    for split, problems in (("sft_train", sft_train), ("sft_val", sft_val)):
        rows = [
            calculator_sft_row(a, b, split, i, rng.random() < args.tool_rate, rng) for i, (a, b) in enumerate(problems)
        ]
        write_parquet(rows, sft_paths[split])
    (staging / "tool_config.yaml").write_text(CALC_TOOL_CONFIG)
    counts = {"n_train": len(train), "n_test": len(test), "n_sft_train": len(sft_train), "n_sft_val": len(sft_val)}
    return data_paths, sft_paths, counts


def evaluate_calculator_build(model_dir: str, test_path: str, tools: str, seed: int) -> dict:
    """The build's evaluation on the test split: greedy and sampled agent-loop runs with the tool,
    greedy without it, and the copy skill after a tool result."""
    return {
        "greedy": evaluate_calculator(model_dir, test_path, tools),
        "sampled_t1": evaluate_calculator(model_dir, test_path, tools, do_sample=True, seed=seed),
        "greedy_tool_disabled": evaluate_calculator(model_dir, test_path, None),
        "copy_after_tool_result": evaluate_copy(model_dir, test_path),
    }


def main_calculator(argv=None) -> dict:
    """Tokenizer with the tool role, warm-started model, RL + multi-turn SFT data, SFT warm-up on an
    imperfect teacher (calls the tool in `tool_rate` of its demonstrations), evaluation."""
    import tempfile

    import torch

    from verl.utils.dataset.toy_tasks import CalculatorTask

    args = parse_calculator_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.output_dir).resolve()
    task = CalculatorTask(args.a_digits, args.b_digits)
    stages = previous_stages(args.init_from)  # read before the output (maybe init_from's) is replaced
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="verl_calc_build_") as tmp:
        work = Path(tmp)
        staging = work / "out"
        tokenizer = build_calculator_tokenizer()
        n_params = calculator_init(args, tokenizer, work / "init")
        data_paths, sft_paths, counts = write_calculator_data(staging, task, args)
        t_sft = time.time()
        final_ckpt, sft_result = run_warmup(
            work / "init", {k: str(v) for k, v in sft_paths.items()}, work, args, multiturn=True
        )
        sft_seconds = time.time() - t_sft
        shutil.copytree(final_ckpt, staging / "model")
        metrics = {}
        if not args.skip_eval:
            metrics = evaluate_calculator_build(
                str(staging / "model"), str(data_paths["test"]), str(staging / "tool_config.yaml"), args.seed
            )
        stages.append(_stage_record(stages, vars(args), metrics))
        init_name = _repo_relative(args.init_from) if args.init_from else ""
        info = {
            "task": {
                "data_source": "verl_toy/calculator",
                "a_digits": args.a_digits,
                "b_digits": args.b_digits,
                **counts,
                "tool_rate": args.tool_rate,
                "format": "verl_toy",
            },
            "model": {
                "architecture": "LlamaForCausalLM",
                "parameters": n_params,
                "vocab_size": len(tokenizer),
                "init_from": init_name or "random",
            },
            "sft": sft_record(args, sft_seconds, sft_result["history"]),
            "eval_test_split": metrics,
            "sft_stages": stages,
            "sft_stages_note": (
                "each stage is `scripts/build_embedded_default.py --task calculator --init_from <the previous "
                "stage's model>` with the data of this build (seed 0); the shipped model is the last stage"
            ),
            "build_args": vars(args) | {"output_dir": None, "init_from": init_name},
            "torch": torch.__version__,
        }
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staging, out)
    info["sizes_bytes"] = {name: dir_size(out / name) for name in ("model", "data", "sft")}
    info["build_seconds"] = round(time.time() - t_start, 1)
    (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps({"output_dir": str(out), "sft": info["sft"], "eval": metrics}, indent=2))
    return info


if __name__ == "__main__":
    if "--task" in sys.argv[1:]:
        main_calculator()
    else:
        main()
