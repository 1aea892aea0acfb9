"""SFTDataset (loss masks, truncation, conversations) and the FSDP2 SFT trainer at world size 1 (and 2)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import build_tiny_model, save_model_dir
from omegaconf import OmegaConf

from verl.utils.dataset.sft_dataset import SFTDataset
from verl.utils.dataset.toy_tasks import AdditionTask, addition_sft_row, generate_addition_problems

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer(embedded_tokenizer):
    return embedded_tokenizer


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """A 2-layer, hidden-32 Llama with the embedded tokenizer."""
    return save_model_dir(build_tiny_model(tokenizer), tokenizer, tmp_path_factory.mktemp("tiny_model"))


def _parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


# ------------------------------------------------------------------------------------------ SFTDataset
def test_loss_mask_covers_exactly_the_response_and_eos(tmp_path, tokenizer):
    path = _parquet(tmp_path / "a.parquet", [{"prompt": [{"role": "user", "content": "47+85"}], "response": "132"}])
    item = SFTDataset(path, tokenizer, {"max_length": 16})[0]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "47+85"}], add_generation_prompt=True, tokenize=True
    )["input_ids"]
    response = tokenizer("132", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    n = len(prompt) + len(response)
    assert item["input_ids"].tolist() == prompt + response + [tokenizer.pad_token_id] * (16 - n)
    assert item["attention_mask"].tolist() == [1] * n + [0] * (16 - n)
    assert item["position_ids"].tolist() == list(range(n)) + [0] * (16 - n)
    # loss_mask[t] == 1 iff token t+1 is a response token (logits at t predict t+1)
    expected = [0.0] * 16
    for t in range(len(prompt) - 1, n - 1):
        expected[t] = 1.0
    assert item["loss_mask"].tolist() == expected
    predicted = [item["input_ids"][t + 1].item() for t in range(15) if item["loss_mask"][t] == 1]
    assert predicted == response
    assert tokenizer.decode(predicted) == "132<|end|>"


def test_string_prompts_and_nested_keys(tmp_path, tokenizer):
    rows = [{"extra_info": {"question": "1+2", "answer": "3"}}]
    path = _parquet(tmp_path / "a.parquet", rows)
    cfg = {
        "max_length": 12,
        "prompt_key": "extra_info",
        "prompt_dict_keys": ["question"],
        "response_key": "extra_info",
        "response_dict_keys": ["answer"],
    }
    item = SFTDataset(path, tokenizer, cfg)[0]
    text = tokenizer.decode(item["input_ids"][item["attention_mask"].bool()].tolist())
    assert text == "<|bos|><|user|>1+2<|end|><|assistant|>3<|end|>"
    with pytest.raises(KeyError, match=r"a\.parquet \(row 0\): cannot find 'nope' inside 'extra_info'"):
        SFTDataset(path, tokenizer, {**cfg, "prompt_dict_keys": ["nope"]})


def test_truncation_and_bad_rows(tmp_path, tokenizer):
    path = _parquet(tmp_path / "a.parquet", [{"prompt": "12345+67890", "response": "80235"}])
    with pytest.raises(ValueError, match=r"a\.parquet \(row 0\): 21 tokens exceed data.max_length=10"):
        SFTDataset(path, tokenizer, {"max_length": 10})  # at construction, not when the row is read
    left = SFTDataset(path, tokenizer, {"max_length": 10, "truncation": "left"})[0]
    right = SFTDataset(path, tokenizer, {"max_length": 10, "truncation": "right"})[0]
    # 21 tokens: bos, user, 11 prompt chars, end, assistant, 5 answer digits, eos
    assert tokenizer.decode(left["input_ids"].tolist()) == "90<|end|><|assistant|>80235<|end|>"
    assert left["loss_mask"].tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1, 0]
    assert right["input_ids"][0].item() == tokenizer.bos_token_id and right["loss_mask"].sum() == 0
    bad = tmp_path / "b.jsonl"
    bad.write_text(
        json.dumps({"prompt": "1+1", "response": "2"}) + "\n" + json.dumps({"prompt": "1+1", "response": 2}) + "\n"
    )
    with pytest.raises(TypeError, match=r"b\.jsonl \(row 1\): column 'response' must be a string"):
        SFTDataset(bad, tokenizer, {"max_length": 16})
    missing = _parquet(tmp_path / "c.parquet", [{"question": "1+1", "response": "2"}])
    with pytest.raises(KeyError, match="missing column 'prompt'"):
        SFTDataset(missing, tokenizer, {"max_length": 16})


def test_multiturn_trains_every_assistant_message(tmp_path, tokenizer):
    conv = [
        {"role": "system", "content": "add"},
        {"role": "user", "content": "1+1"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2+2"},
        {"role": "assistant", "content": "4"},
    ]
    path = _parquet(tmp_path / "m.parquet", [{"messages": conv}])
    item = SFTDataset(path, tokenizer, {"max_length": 40, "multiturn": {"enable": True}})[0]
    ids = item["input_ids"].tolist()
    trained = [ids[t + 1] for t in range(39) if item["loss_mask"][t] == 1]
    assert tokenizer.decode(trained) == "2<|end|>4<|end|>"
    full = tokenizer.apply_chat_template(conv, tokenize=False)
    assert tokenizer.decode(ids[: int(item["attention_mask"].sum())]) == full
    no_assistant = _parquet(tmp_path / "n.parquet", [{"messages": conv[:2]}])
    with pytest.raises(ValueError, match="no assistant message"):
        SFTDataset(no_assistant, tokenizer, {"max_length": 40, "multiturn": {"enable": True}})


# ------------------------------------------------------------------------------------------ trainer
def _sft_data(tmp_path, n_train=256, n_val=32):
    task = AdditionTask(1, 2)
    probs = generate_addition_problems(task, n_train + n_val, seed=0, split="sft")
    train = _parquet(
        tmp_path / "train.parquet", [addition_sft_row(a, b, "train", i) for i, (a, b) in enumerate(probs[:n_train])]
    )
    val = _parquet(
        tmp_path / "val.parquet", [addition_sft_row(a, b, "val", i) for i, (a, b) in enumerate(probs[n_train:])]
    )
    return train, val


def _config(model_dir, train, val, out_dir, **over):
    from hydra import compose, initialize_config_module

    overrides = [
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"model.partial_pretrain={model_dir}",
        f"trainer.default_local_dir={out_dir}",
        "data.max_length=16",
        "trainer.device=cpu",
        "trainer.logger=[console]",
    ]
    overrides += [f"{k}={v}" for k, v in over.items()]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="sft_trainer", overrides=overrides)


def test_sft_world_size_1_loss_decreases_and_saves_hf_dir(tmp_path, tiny_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.trainer.fsdp_sft_trainer import run_sft

    torch.set_num_threads(1)
    train, val = _sft_data(tmp_path)
    cfg = _config(
        tiny_model_dir,
        train,
        val,
        tmp_path / "out",
        **{
            "data.train_batch_size": 32,
            "data.micro_batch_size_per_gpu": 16,
            "optim.lr": 1e-2,
            "optim.warmup_steps_ratio": 0.1,
            "trainer.total_training_steps": 40,
            "trainer.test_freq": 20,
            "trainer.save_freq": 20,
            "trainer.log_freq": 20,
        },
    )
    result = run_sft(cfg)
    hist = result["history"]
    assert len(hist) == 40 and result["skipped_steps"] == 0
    first, last = hist[0]["train/loss"], sum(h["train/loss"] for h in hist[-5:]) / 5
    assert last < 0.6 * first, (first, last)
    vals = [h["val/loss"] for h in hist if "val/loss" in h]
    assert len(vals) == 2 and vals[-1] < first
    assert hist[0]["train/lr"] == 0.0 and max(h["train/lr"] for h in hist) == pytest.approx(1e-2)
    assert [h["train/epoch"] for h in hist][7:9] == [0, 1]  # 256 / 32 = 8 steps per epoch
    # HF directories at the save points; the final one is returned
    assert result["final_checkpoint"] == str(tmp_path / "out" / "global_step_40")
    assert (tmp_path / "out" / "global_step_20" / "model.safetensors").exists()
    assert (tmp_path / "out" / "latest_checkpointed_iteration.txt").read_text() == "40"
    model = AutoModelForCausalLM.from_pretrained(result["final_checkpoint"])
    tok = AutoTokenizer.from_pretrained(result["final_checkpoint"])
    assert tok.decode(tok("héllo 12")["input_ids"]) == "héllo 12"
    assert (
        json.loads((Path(result["final_checkpoint"]) / "tokenizer_config.json").read_text())["tokenizer_class"]
        == "PreTrainedTokenizerFast"
    )
    # the saved weights are the trained ones: the saved model reproduces the final validation loss
    from verl.utils.dataset.sft_dataset import SFTDataset as DS

    ds = DS(val, tok, {"max_length": 16})
    batch = {k: torch.stack([ds[i][k] for i in range(len(ds))]) for k in ds[0]}
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits[:, :-1]
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), batch["input_ids"][:, 1:].reshape(-1), reduction="none"
    ).view(len(ds), -1)
    mask = batch["loss_mask"][:, :-1]
    assert (nll * mask).sum().item() / mask.sum().item() == pytest.approx(vals[-1], rel=1e-4)


def test_gradient_accumulation_is_exact(tmp_path, tiny_model_dir, tokenizer):
    """One step with micro-batches of 2 equals one step with the whole batch at once."""
    import torch.distributed as dist

    from verl.trainer.fsdp_sft_trainer import FSDPSFTTrainer, init_process_group
    from verl.utils.fsdp_utils import get_full_state_dict

    torch.set_num_threads(1)
    train, val = _sft_data(tmp_path, n_train=16, n_val=4)
    created = init_process_group("cpu")
    try:
        params = []
        for micro in (2, 16):
            cfg = _config(
                tiny_model_dir,
                train,
                val,
                tmp_path / f"o{micro}",
                **{
                    "data.train_batch_size": 16,
                    "data.micro_batch_size_per_gpu": micro,
                    "optim.lr": 1e-2,
                    "optim.warmup_steps_ratio": 0,
                    "trainer.total_training_steps": 1,
                    "data.shuffle": False,
                },
            )
            ds = SFTDataset(train, tokenizer, cfg.data)
            trainer = FSDPSFTTrainer(cfg, tokenizer, ds)
            batch = next(iter(trainer.train_loader))
            grads = {}

            # a pre-step hook, not a replaced optimizer.step (the lr scheduler warns on those)
            def capture(_optimizer, _args, _kwargs, _grads=grads, _model=trainer.model):
                for name, p in _model.named_parameters():
                    g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                    _grads[name] = g.detach().clone()

            trainer.optimizer.register_step_pre_hook(capture)
            metrics = trainer.training_step(batch)
            params.append((metrics["train/loss"], grads, get_full_state_dict(trainer.model)))
        (loss_a, g_a, sd_a), (loss_b, g_b, sd_b) = params
        assert loss_a == pytest.approx(loss_b, rel=1e-6)
        assert g_a.keys() == g_b.keys() and len(g_a) > 0
        for k in g_a:  # gradients (after clipping) agree to float32 accuracy
            torch.testing.assert_close(g_a[k], g_b[k], rtol=1e-4, atol=1e-7)
        for k in sd_a:  # and so do the parameters (Adam amplifies rounding where a gradient is ~0)
            torch.testing.assert_close(sd_a[k], sd_b[k], rtol=1e-4, atol=1e-5)
        with pytest.raises(ValueError, match="micro_batch_size_per_gpu=3 must divide the per-process batch 16"):
            FSDPSFTTrainer(
                _config(
                    tiny_model_dir,
                    train,
                    val,
                    tmp_path / "x",
                    **{"data.train_batch_size": 16, "data.micro_batch_size_per_gpu": 3},
                ),
                tokenizer,
                ds,
            )
    finally:
        if created:
            dist.destroy_process_group()


def test_missing_required_keys_fail_before_anything_runs(tmp_path):
    from verl.trainer.fsdp_sft_trainer import run_sft

    cfg = OmegaConf.create({"data": {"train_files": None}, "model": {"partial_pretrain": "x"}, "trainer": {}})
    with pytest.raises(ValueError, match="data.train_files is required"):
        run_sft(cfg)


@pytest.mark.slow
def test_torchrun_two_processes_matches_one(tmp_path, tiny_model_dir):
    """`torchrun --nproc_per_node=2` trains the same model as one process (exact global token mean)."""
    train, val = _sft_data(tmp_path, n_train=32, n_val=8)
    common = [
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"model.partial_pretrain={tiny_model_dir}",
        "data.max_length=16",
        "data.train_batch_size=16",
        "data.micro_batch_size_per_gpu=4",
        "data.shuffle=False",
        "trainer.total_training_steps=3",
        "trainer.device=cpu",
        "optim.lr=1e-2",
        "trainer.logger=[console]",
        "trainer.log_freq=1",
        "trainer.torch_threads=1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    losses = {}
    for nproc in (1, 2):
        out = tmp_path / f"ws{nproc}"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "verl.trainer.fsdp_sft_trainer",
            *common,
            f"trainer.default_local_dir={out}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("sft step")]
        assert len(lines) == 3, proc.stdout  # printed by rank 0 only
        losses[nproc] = [float(ln.split("train/loss ")[1].split(" ")[0]) for ln in lines]
        assert (out / "global_step_3" / "model.safetensors").exists()
    # DistributedSampler(shuffle=False) gives the same global batch; the loss is the global token mean
    assert losses[1] == pytest.approx(losses[2], rel=1e-3)
