"""The embedded default: shipped tokenizer/model/data, the toy task, and the build script."""

import hashlib
import json
import subprocess
import sys
import unicodedata
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from verl.utils import embedded_default
from verl.utils.dataset.toy_tasks import (
    ADDITION_DATA_SOURCE,
    AdditionTask,
    addition_sft_row,
    generate_addition_problems,
    make_addition_splits,
)
from verl.utils.reward_score import default_compute_score

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_default.model_path())


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(embedded_default.model_path()).eval()


# ------------------------------------------------------------------------------------------ tokenizer
@pytest.mark.parametrize(
    "text",
    [
        "47+85",
        "Hello, world!  two  spaces\tand\ttabs\n",
        unicodedata.normalize("NFD", "héllo wörld"),
        "emoji 🙂 and 中文",
        " leading and trailing ",
        "",
    ],
)
def test_shipped_tokenizer_round_trips_text(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    assert all(0 <= i < 256 for i in ids)  # byte-level: one id per byte, digits never merge
    assert len(ids) == len(text.encode("utf-8"))


def test_shipped_tokenizer_is_the_explicit_fast_class_with_special_tokens(tok):
    assert type(tok).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend")
    assert "Qwen" not in type(tok).__name__
    cfg = json.loads((Path(embedded_default.model_path()) / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<|pad|>", "<|bos|>", "<|end|>")
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id}) == 3
    assert len(tok) == 262
    # special tokens are single ids and are skipped on request
    ids = tok("<|user|>1+2<|end|>", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5 and tok.decode(ids, skip_special_tokens=True) == "1+2"


def test_shipped_chat_template(tok):
    msgs = [{"role": "system", "content": "add"}, {"role": "user", "content": "47+85"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|bos|><|system|>add<|end|><|user|>47+85<|end|><|assistant|>"
    ids = tok.apply_chat_template(msgs[1:], add_generation_prompt=True, tokenize=True)["input_ids"]
    assert ids == tok("<|bos|><|user|>47+85<|end|><|assistant|>", add_special_tokens=False)["input_ids"]
    assert len(ids) == 9
    full = tok.apply_chat_template(msgs[1:] + [{"role": "assistant", "content": "132"}], tokenize=False)
    assert full == "<|bos|><|user|>47+85<|end|><|assistant|>132<|end|>"
    with pytest.raises(Exception, match="unknown chat role"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


# ------------------------------------------------------------------------------------------ model
def test_shipped_model_loads_and_generates_answers(tok, model):
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.5e6 < n_params < 5e6
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (Path(embedded_default.model_path()) / "model.safetensors").exists()
    rows = pq.read_table(embedded_default.val_files()).to_pylist()[:16]
    prompts = [
        tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True)["input_ids"] for r in rows
    ]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = (ids != tok.pad_token_id).long()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    # the warmed-up model answers in the task's format: digits then eos
    assert all(t.isdigit() for t in texts), texts
    assert all(tok.eos_token_id in row.tolist() for row in out[:, width:])


def test_shipped_build_info_matches_a_fresh_measurement(tok, model):
    """Greedy accuracy recomputed now equals the one recorded at build time; numbers sit in the design band."""
    info = embedded_default.build_info()
    ev = info["eval_test_split"]
    # design: RL starts well below the ceiling but with plenty of right samples
    assert 0.05 <= ev["greedy_accuracy"] <= 0.40
    assert ev["pass@8_t1"] >= ev["greedy_accuracy"] + 0.3
    assert ev["sampled_accuracy_t1"] > ev["greedy_accuracy"]
    assert info["sizes_bytes"]["total"] < 8 * 2**20
    rows = pq.read_table(embedded_default.val_files()).to_pylist()
    prompts = [
        tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True)["input_ids"] for r in rows
    ]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=(ids != tok.pad_token_id).long(),
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    acc = sum(
        default_compute_score(r["data_source"], t, r["reward_model"]["ground_truth"])
        for t, r in zip(texts, rows, strict=False)
    )
    assert acc / len(rows) == pytest.approx(ev["greedy_accuracy"], abs=1.5 / len(rows))


# ------------------------------------------------------------------------------------------ data
def test_shipped_data_follow_the_upstream_schema_and_are_disjoint(tok):
    train = pq.read_table(embedded_default.train_files()).to_pylist()
    test = pq.read_table(embedded_default.default_data_files("test")).to_pylist()
    assert len(train) >= 1024 and len(test) >= 128
    for split, rows in (("train", train), ("test", test)):
        for i, r in enumerate(rows[:50]):
            assert r["data_source"] == ADDITION_DATA_SOURCE == embedded_default.DATA_SOURCE
            assert r["prompt"] == [{"role": "user", "content": f"{r['extra_info']['a']}+{r['extra_info']['b']}"}]
            assert r["ability"] == "arithmetic"
            assert r["reward_model"] == {
                "style": "rule",
                "ground_truth": str(r["extra_info"]["a"] + r["extra_info"]["b"]),
            }
            assert r["extra_info"]["split"] == split and r["extra_info"]["index"] == i
    pairs = lambda rows: {(r["extra_info"]["a"], r["extra_info"]["b"]) for r in rows}
    assert not pairs(train) & pairs(test)
    longest_answer = max(len(tok(r["reward_model"]["ground_truth"])["input_ids"]) for r in train + test)
    assert longest_answer <= 3  # + eos = 4 response tokens
    with pytest.raises(ValueError, match="'train' or 'test'"):
        embedded_default.default_data_files("validation")


def test_env_var_points_at_another_build_and_missing_files_say_how_to_rebuild(tmp_path, monkeypatch):
    monkeypatch.setenv(embedded_default.ENV_DIR, str(tmp_path))
    assert embedded_default.asset_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match=r"build_embedded_default\.py --output_dir"):
        embedded_default.model_path()
    with pytest.raises(FileNotFoundError, match="train data"):
        embedded_default.train_files()


def test_recommended_overrides_fit_the_shipped_task(tok):
    rec = embedded_default.recommended_overrides()
    rows = pq.read_table(embedded_default.val_files()).to_pylist()
    longest_prompt = max(
        len(tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True)["input_ids"]) for r in rows
    )
    assert longest_prompt <= rec["data.max_prompt_length"]
    assert 4 <= rec["data.max_response_length"]


# ------------------------------------------------------------------------------------------ toy task
def test_addition_task_answers_and_careless_mistake():
    assert AdditionTask.answer(47, 85) == "132"
    assert AdditionTask.careless_answer(47, 85) == "22"  # 7+5 -> 2, 4+8 -> 2, carries dropped
    assert AdditionTask.careless_answer(12, 34) == "46" == AdditionTask.answer(12, 34)
    assert AdditionTask.careless_answer(95, 7) == "92"
    assert AdditionTask.has_carry(47, 85) and not AdditionTask.has_carry(12, 34)
    row = addition_sft_row(47, 85, "sft", 3, careless=True)
    assert row["response"] == "22" and row["reward_model"]["ground_truth"] == "132" and row["extra_info"]["careless"]
    # the scorer: right / wrong / malformed
    assert default_compute_score(ADDITION_DATA_SOURCE, "132", "132") == 1.0
    assert default_compute_score(ADDITION_DATA_SOURCE, "22", "132") == 0.0
    assert default_compute_score(ADDITION_DATA_SOURCE, "13 2", "132") == 0.0
    assert default_compute_score(ADDITION_DATA_SOURCE, "", "132") == 0.0


def test_problem_generation_is_seeded_disjoint_and_bounded():
    task = AdditionTask(2, 2)
    assert task.number_of_distinct_problems() == 90 * 90
    train, test = make_addition_splits(task, 500, 100, seed=3)
    assert (train, test) == make_addition_splits(task, 500, 100, seed=3)
    assert make_addition_splits(task, 500, 100, seed=4)[1] != test
    assert len(set(train)) == 500 and not set(train) & set(test)
    assert all(10 <= a <= 99 and 10 <= b <= 99 for a, b in train)
    with pytest.raises(ValueError, match="only 8000 left"):
        generate_addition_problems(task, 8001, seed=0, split="x", exclude=set(test))
    with pytest.raises(ValueError, match="min_digits"):
        AdditionTask(3, 2)


# ------------------------------------------------------------------------------------------ build script
SMALL = [
    "--hidden_size",
    "32",
    "--num_layers",
    "1",
    "--num_heads",
    "2",
    "--num_kv_heads",
    "1",
    "--intermediate_size",
    "64",
    "--sft_steps",
    "8",
    "--sft_batch_size",
    "16",
    "--n_train",
    "64",
    "--n_test",
    "32",
    "--n_sft_train",
    "64",
    "--n_sft_val",
    "16",
    "--eval_samples",
    "2",
]


def _build(out):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_embedded_default.py"), "--output_dir", str(out), *SMALL],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "build_info.json").read_text())


def _digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.slow
def test_build_script_end_to_end_small_and_deterministic(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = _build(tmp_path / "a")
    out = tmp_path / "a"
    for rel in (
        "model/model.safetensors",
        "model/config.json",
        "model/tokenizer.json",
        "model/tokenizer_config.json",
        "data/train.parquet",
        "data/test.parquet",
        "sft/train.parquet",
        "sft/val.parquet",
    ):
        assert (out / rel).is_file(), rel
    assert info["task"]["n_train"] == 64 and info["model"]["hidden_size"] == 32 and info["sft"]["steps"] == 8
    assert set(info["eval_test_split"]) >= {"greedy_accuracy", "sampled_accuracy_t1", "pass@2_t1"}
    assert info["sft"]["final_val_loss"] is not None
    sft_rows = pq.read_table(str(out / "sft" / "train.parquet")).to_pylist()
    careless = sum(r["extra_info"]["careless"] for r in sft_rows) / len(sft_rows)
    assert 0.5 < careless < 0.9  # --careless_rate 0.7 (64 rows)
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    tok = AutoTokenizer.from_pretrained(out / "model")
    assert model.config.hidden_size == 32 and tok.decode(tok("47+85")["input_ids"]) == "47+85"
    # seeded: a second build gives byte-identical data and weights
    _build(tmp_path / "b")
    for rel in ("model/model.safetensors", "data/train.parquet", "data/test.parquet", "sft/train.parquet"):
        assert _digest(tmp_path / "a" / rel) == _digest(tmp_path / "b" / rel), rel


def test_build_script_rejects_bad_sizes(tmp_path):
    from conftest import load_build_script

    bed = load_build_script()
    tok = bed.build_tokenizer()
    with pytest.raises(ValueError, match="hidden_size=30 must be divisible by num_heads=4"):
        bed.build_model(tok, 30, 1, 4, 2, 64, 64, 0)
