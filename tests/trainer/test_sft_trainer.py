"""`verl.trainer.sft_trainer` (upstream main's SFT entry point): the loss against a hand computation,
exact micro-batching, checkpoints, exact resume (mid-epoch and at an epoch boundary; one process
here, two under torchrun in the slow lane), LoRA, and the config checks."""

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed as dist
from conftest import build_tiny_model, save_model_dir

from verl.utils.dataset.toy_tasks import AdditionTask, addition_sft_row, generate_addition_problems

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, embedded_tokenizer):
    return save_model_dir(build_tiny_model(embedded_tokenizer), embedded_tokenizer, tmp_path_factory.mktemp("m"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """64 training rows (4 steps per epoch at batch 16) and 16 validation rows; single-turn
    prompt/response rows and the same problems as `messages` conversations."""
    out = tmp_path_factory.mktemp("data")
    probs = generate_addition_problems(AdditionTask(1, 2), 80, seed=0, split="sft")
    rows = [addition_sft_row(a, b, "sft", i) for i, (a, b) in enumerate(probs)]
    conv = [{"messages": [*r["prompt"], {"role": "assistant", "content": r["response"]}]} for r in rows]
    paths = {}
    for name, part in (("train", slice(0, 64)), ("val", slice(64, 80))):
        paths[name] = str(out / f"{name}.parquet")
        pq.write_table(pa.Table.from_pylist(rows[part]), paths[name])
        paths[f"{name}_messages"] = str(out / f"{name}_messages.parquet")
        pq.write_table(pa.Table.from_pylist(conv[part]), paths[f"{name}_messages"])
    return paths


def compose(model_dir, data, out_dir, *overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    base = [
        f"data.train_files={data['train']}",
        f"data.val_files={data['val']}",
        f"model.path={model_dir}",
        f"trainer.default_local_dir={out_dir}",
        "trainer.device=cpu",
        "trainer.logger=[console]",
        "data.train_batch_size=16",
        "data.micro_batch_size_per_gpu=4",
        "data.use_dynamic_bsz=False",
        "data.num_workers=0",
        "model.enable_gradient_checkpointing=False",
        "optim.lr=1e-2",
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return hydra_compose(config_name="sft_trainer_engine", overrides=base + list(overrides))


@pytest.fixture
def process_group():
    from verl.trainer.fsdp_sft_trainer import init_process_group

    torch.set_num_threads(1)
    created = init_process_group("cpu")
    yield
    if created:
        dist.destroy_process_group()


def _weights(path):
    """The model weights of a checkpoint step: its DCP shards (`dcp/`), read back whole."""
    from verl.utils.checkpoint.dcp_shards import iter_full_tensors

    return dict(iter_full_tensors(os.path.join(path, "dcp")))


def _run(cfg, stop_at=None, chunk_tokens=None):
    """Train a fresh (or resumed) SFTTrainer; `stop_at`: stop after that step as a killed run
    would (its checkpoint is the last thing it wrote); `chunk_tokens`: the engine's CPU chunk
    budget (forward + backward per chunk of rows). Returns (trainer, {step: loss})."""
    from verl.trainer.sft_trainer import SFTTrainer

    trainer = SFTTrainer(cfg)
    if chunk_tokens is not None:
        trainer.engine.chunk_tokens = chunk_tokens
    if stop_at is None:
        trainer.fit()
    else:
        while trainer.global_step < stop_at:
            for batch in trainer.train_loader:
                trainer._step(batch, None)
                if trainer.global_step >= stop_at:
                    break
    return trainer, {h["step"]: h["train/loss"] for h in trainer.history}


def test_loss_is_the_token_mean_nll_of_the_assistant_tokens(tmp_path, model_dir, data, process_group):
    """The first step's loss equals the NLL of the trained tokens computed by hand with the
    untouched Hugging Face model; micro-batches of 2 rows, of 16 and a token budget agree."""
    from transformers import AutoModelForCausalLM

    from verl.trainer.sft_trainer import SFTTrainer

    cfg = compose(model_dir, data, tmp_path / "a", "trainer.total_training_steps=1", "data.micro_batch_size_per_gpu=2")
    trainer = SFTTrainer(cfg)
    batch = next(iter(trainer.train_loader))
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["input_ids"][:, 1:], reduction="none")
    mask = batch["loss_mask"][:, 1:]  # loss_mask[t] marks token t, predicted by the logits at t - 1
    expected = float((nll * mask).sum() / mask.sum())
    metrics = trainer.training_step(batch)
    assert metrics["train/loss"] == pytest.approx(expected, rel=1e-5)
    assert metrics["train/trained_tokens"] == int(mask.sum())
    weights = {}
    variants = {
        "m2": ([], None),
        "m16": (["data.micro_batch_size_per_gpu=16"], None),
        "dyn": (["data.use_dynamic_bsz=True", "data.max_token_len_per_gpu=40"], None),
        "chunked": (["data.micro_batch_size_per_gpu=16"], 40),
    }
    for name, (extra, chunk) in variants.items():
        out = tmp_path / name
        trainer, losses = _run(
            compose(model_dir, data, out, "trainer.total_training_steps=2", *extra), chunk_tokens=chunk
        )
        weights[name] = (_weights(out / "global_step_2"), losses)
    for name in ("m16", "dyn", "chunked"):
        assert weights[name][1] == pytest.approx(weights["m2"][1], rel=1e-5)
        for k, v in weights["m2"][0].items():
            torch.testing.assert_close(weights[name][0][k], v, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "total,half", [pytest.param(6, 3, marks=pytest.mark.slow), (8, 4)], ids=["mid_epoch", "epoch_boundary"]
)
def test_resume_is_exact(tmp_path, model_dir, data, process_group, total, half):
    """N steps straight == N/2 steps, a restart from the checkpoint, N/2 more (loss of every step
    and final weights, bit for bit), with warm-up and a cosine schedule over N steps."""
    sched = [
        f"trainer.total_training_steps={total}",
        "optim.lr_warmup_steps_ratio=0.25",
        "optim.lr_scheduler_type=cosine",
    ]
    _, straight = _run(compose(model_dir, data, tmp_path / "straight", *sched))
    out = tmp_path / "resumed"
    _, first = _run(compose(model_dir, data, out, *sched, f"trainer.save_freq={half}"), stop_at=half)
    assert (out / "latest_checkpointed_iteration.txt").read_text() == str(half)
    trainer, second = _run(compose(model_dir, data, out, *sched, f"trainer.save_freq={half}"))
    assert sorted(second) == list(range(half + 1, total + 1))  # continued, nothing repeated or skipped
    assert {**first, **second} == straight
    final, ref = _weights(out / f"global_step_{total}"), _weights(tmp_path / "straight" / f"global_step_{total}")
    assert final.keys() == ref.keys() and all(torch.equal(final[k], ref[k]) for k in ref)
    # a finished run resumed again trains nothing and exits
    again, rest = _run(compose(model_dir, data, out, *sched))
    assert rest == {} and again.global_step == total
    again.world_size = 2  # the data position depends on the number of processes
    with pytest.raises(ValueError, match="written by 1 processes and this run has 2"):
        again.checkpointer.load()


@pytest.mark.slow
def test_checkpoint_layout_loads_and_damage_falls_back(tmp_path, model_dir, data, process_group, caplog):
    from transformers import AutoConfig, AutoTokenizer

    out = tmp_path / "o"
    _run(
        compose(
            model_dir,
            data,
            out,
            "trainer.total_training_steps=4",
            "trainer.save_freq=2",
            f"data.train_files={data['train_messages']}",
            f"data.val_files={data['val_messages']}",
        )
    )
    step = out / "global_step_4"
    assert {p.name for p in step.iterdir()} >= {
        "huggingface",
        "dcp",
        "extra_state_world_size_1_rank_0.pt",
        "data_0.pt",
        "trainer_state.pt",
        "manifest.json",
    }
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp")]
    # huggingface/ holds config and tokenizer (the weights are the DCP shards; hf_model adds them)
    AutoConfig.from_pretrained(step / "huggingface")
    AutoTokenizer.from_pretrained(step / "huggingface")
    shard = next((step / "dcp").glob("*.distcp"))
    shard.write_bytes(b"garbage")  # the newest checkpoint is damaged: resume uses step 2
    trainer, losses = _run(
        compose(
            model_dir,
            data,
            out,
            "trainer.total_training_steps=4",
            "trainer.save_freq=2",
            f"data.train_files={data['train_messages']}",
            f"data.val_files={data['val_messages']}",
        )
    )
    assert sorted(losses) == [3, 4] and "damaged" in caplog.text


@pytest.mark.slow
def test_lora_trains_the_adapter_and_resumes_it(tmp_path, model_dir, data, process_group):
    pytest.importorskip("peft")
    lora = ["model.lora_rank=4", "model.lora_alpha=8", "trainer.total_training_steps=4"]
    _, straight = _run(compose(model_dir, data, tmp_path / "s", *lora))
    out = tmp_path / "r"
    _run(compose(model_dir, data, out, *lora, "trainer.save_freq=2"), stop_at=2)
    _, second = _run(compose(model_dir, data, out, *lora, "trainer.save_freq=2"))
    assert second == {k: v for k, v in straight.items() if k > 2}
    assert (out / "global_step_4" / "lora_adapter" / "adapter_model.safetensors").exists()
    merged, base = _weights(out / "global_step_4"), _weights(tmp_path / "s" / "global_step_4")
    assert all(torch.equal(merged[k], base[k]) for k in base)


@pytest.mark.parametrize(
    "override,match",
    [
        ("engine.strategy=megatron", "the megatron engine is not available here; use engine=fsdp"),
        ("engine.ulysses_sequence_parallel_size=2", "Ulysses sequence parallelism is not available"),
        ("model.use_liger=True", "model.use_liger=True: liger kernels is not available"),
        ("profiler.enable=True", "profiler.enable=True"),
        ("trainer.resume_mode=sometimes", "trainer.resume_mode='sometimes' must be auto, disable or resume_path"),
        ("trainer.save_freq=often", "trainer.save_freq='often' must be an integer"),
        ("data.micro_batch_size_per_gpu=3", "data.micro_batch_size_per_gpu=3 must divide the per-process batch 16"),
    ],
)
def test_what_cannot_run_fails_before_training_naming_the_key(
    tmp_path, model_dir, data, process_group, override, match
):
    from verl.trainer.sft_trainer import SFTTrainer, run_sft

    cfg = compose(model_dir, data, tmp_path / "x", override)
    with pytest.raises(ValueError, match=match):
        run_sft(cfg) if "micro" not in override else SFTTrainer(cfg)


def test_a_logger_that_is_not_installed_is_named_before_anything_is_built(tmp_path, model_dir, data):
    import importlib.util

    from verl.trainer.sft_trainer import run_sft

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed")
    cfg = compose(model_dir, data, tmp_path / "x", "trainer.logger=[console,wandb]")  # upstream's default
    with pytest.raises(ImportError, match="trainer.logger includes 'wandb' but the package 'wandb' is not installed"):
        run_sft(cfg)
    assert not (tmp_path / "x").exists()


def test_other_engines_on_the_command_line_are_named():
    from verl.trainer.sft_trainer import _refuse_other_engines

    with pytest.raises(SystemExit, match="engine=megatron: the megatron engine is not available in this verl"):
        _refuse_other_engines(["data.train_files=x", "engine=megatron"])
    _refuse_other_engines(["engine=fsdp", "optim=fsdp"])


# ------------------------------------------------------------------------------------------ slow lane
def _torchrun(nproc, args, env=None):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "verl.trainer.sft_trainer",
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    return proc


def _losses(stdout):
    return {
        int(ln.split()[1]): float(ln.split("| loss ")[1].split()[0])
        for ln in stdout.splitlines()
        if ln.startswith("step ") and "| loss " in ln
    }


@pytest.mark.slow
def test_torchrun_two_processes_resume_exactly(tmp_path, model_dir, data):
    """Two ranks (gloo), 4 steps per epoch: 8 straight steps == 3 + resume (mid-epoch) + 1 +
    resume (at the epoch boundary) + 4, losses and final weights. (A constant schedule after a
    fixed warm-up, so that stopping early is the only difference between the runs.)"""
    common = [
        f"data.train_files={data['train_messages']}",
        f"data.val_files={data['val_messages']}",
        f"model.path={model_dir}",
        "trainer.device=cpu",
        "trainer.logger=[console]",
        "data.train_batch_size=16",
        "data.micro_batch_size_per_gpu=4",
        "data.num_workers=0",
        "optim.lr=1e-2",
        "optim.lr_warmup_steps=2",
    ]
    straight = _torchrun(2, [*common, f"trainer.default_local_dir={tmp_path / 's'}", "trainer.total_training_steps=8"])
    assert straight.returncode == 0, straight.stderr[-3000:]
    out = tmp_path / "r"
    losses = {}
    for total, expected in ((3, [1, 2, 3]), (4, [4]), (8, [5, 6, 7, 8])):
        proc = _torchrun(2, [*common, f"trainer.default_local_dir={out}", f"trainer.total_training_steps={total}"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert sorted(_losses(proc.stdout)) == expected
        losses.update(_losses(proc.stdout))
    assert losses == _losses(straight.stdout)
    a, b = _weights(out / "global_step_8"), _weights(tmp_path / "s" / "global_step_8")
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert (out / "global_step_8" / "data_1.pt").exists()


# upstream main's examples/sft scripts (engine=fsdp): their keys, with local paths and a short run
UPSTREAM_SFT_SCRIPTS = {
    "gsm8k/run_qwen2_5_0_5b_fsdp.sh": [
        "data.messages_key=messages",
        "data.micro_batch_size_per_gpu=4",
        "optim.lr=1e-4",
        "engine=fsdp",
        "engine.ulysses_sequence_parallel_size=1",
        "model.use_remove_padding=true",
        "trainer.project_name=gsm8k-sft",
        "trainer.experiment_name=gsm8k-sft-qwen2_5_0_5b",
        "trainer.total_epochs=1",
    ],
    "gsm8k/run_qwen3_8b_fsdp.sh": [
        "data.micro_batch_size_per_gpu=64",
        "data.messages_key=messages",
        "data.ignore_input_ids_mismatch=True",
        "optim.lr=1e-4",
        "engine=fsdp",
        "engine.ulysses_sequence_parallel_size=2",
        "model.use_remove_padding=true",
        "trainer.total_epochs=2",
        "model.lora_rank=32",
        "model.lora_alpha=16",
        "model.target_modules=all-linear",
    ],
    "gsm8k/run_gemma_2b_fsdp.sh": [
        "data.messages_key=messages",
        "data.micro_batch_size_per_gpu=4",
        "optim.lr=1e-4",
        "engine=fsdp",
        "trainer.total_epochs=2",
    ],
    "gsm8k/run_seed_oss_36b_fsdp.sh": [
        "data.micro_batch_size_per_gpu=4",
        "optim.lr=1e-4",
        "engine=fsdp",
        "engine.ulysses_sequence_parallel_size=2",
        "model.use_remove_padding=true",
        "trainer.total_training_steps=1",
    ],
    "multiturn/run_qwen2_5_0_5b_fsdp.sh": [
        "data.messages_key=messages",
        "data.micro_batch_size_per_gpu=4",
        "model.use_remove_padding=true",
        "engine=fsdp",
        "engine.ulysses_sequence_parallel_size=1",
        "trainer.total_training_steps=1",
    ],
}


@pytest.mark.parametrize("script", sorted(UPSTREAM_SFT_SCRIPTS))
def test_upstream_sft_scripts_compose_and_pass_or_name_the_missing_feature(script, model_dir, data, tmp_path):
    """Each script's keys compose with our config; the checks pass, or name what is missing
    (Ulysses sequence parallelism in the scripts that ask for it)."""
    from verl.trainer.sft_config import check_sft_config

    cfg = compose(model_dir, data, tmp_path, *UPSTREAM_SFT_SCRIPTS[script])
    if "engine.ulysses_sequence_parallel_size=2" in UPSTREAM_SFT_SCRIPTS[script]:
        with pytest.raises(ValueError, match="Ulysses sequence parallelism is not available"):
            check_sft_config(cfg)
    else:
        check_sft_config(cfg)


@pytest.mark.slow
def test_upstream_sft_script_runs_under_torchrun_and_megatron_is_named(tmp_path, model_dir, data):
    """gsm8k/run_qwen2_5_0_5b_fsdp.sh's command line with local paths (upstream's defaults for
    everything it does not set: dynamic batch size, 8 loader workers, gradient checkpointing), two
    steps; the megatron script stops before anything starts, naming the engine."""
    local = [
        f"data.train_files={data['train_messages']}",
        f"data.val_files={data['val_messages']}",
        f"model.path={model_dir}",
        f"trainer.default_local_dir={tmp_path / 'out'}",
        "trainer.logger=[console]",
        "data.train_batch_size=16",
        "data.num_workers=2",
        "trainer.total_training_steps=2",
    ]
    proc = _torchrun(1, [*UPSTREAM_SFT_SCRIPTS["gsm8k/run_qwen2_5_0_5b_fsdp.sh"], *local])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(_losses(proc.stdout)) == [1, 2] and "val_loss" in proc.stdout
    assert (tmp_path / "out" / "global_step_2" / "dcp" / ".metadata").exists()
    megatron = subprocess.run(
        [sys.executable, "-m", "verl.trainer.sft_trainer", "engine=megatron", "optim=megatron", *local],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert megatron.returncode != 0 and "the megatron engine is not available in this verl" in megatron.stderr


@pytest.mark.slow
def test_embedded_warmup_command_reproduces_the_old_trainer(tmp_path, process_group):
    """The command `build_embedded_default.py --write_init` prints trains the embedded default's
    warm-up with sft_trainer: the same losses as fsdp_sft_trainer (what built the shipped model)."""
    import shlex

    from conftest import load_build_script

    build = load_build_script()
    args = build.parse_args(["--write_init", str(tmp_path), "--sft_steps", "3"])
    command = build.write_init_and_command(args)
    assert command.startswith("python -m verl.trainer.sft_trainer ")
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    from verl.trainer.sft_trainer import run_sft

    overrides = shlex.split(command)[3:] + [f"trainer.default_local_dir={tmp_path / 'new'}"]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        new = run_sft(hydra_compose(config_name="sft_trainer_engine", overrides=overrides))
    shipped = ROOT / "verl" / "assets" / "embedded_default" / "sft"
    old_args = build.parse_args(["--sft_steps", "3"])
    _, old = build.run_warmup(
        tmp_path / "init",
        {"sft_train": str(shipped / "train.parquet"), "sft_val": str(shipped / "val.parquet")},
        tmp_path / "old",
        old_args,
    )
    old_losses = {h["step"]: h["train/loss"] for h in old["history"]}
    new_losses = {h["step"]: h["train/loss"] for h in new["history"]}
    assert sorted(new_losses) == [1, 2, 3] and new_losses == pytest.approx(old_losses, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("asset", ["embedded_default", "embedded_calculator"])
def test_validation_loss_of_the_shipped_warmups_equals_the_build_record(asset, tmp_path, process_group):
    """The shipped models are the final checkpoints of fsdp_sft_trainer warm-ups, whose last
    validation loss build_info.json records: sft_trainer's loss on the same validation data
    (single-turn addition rows; multi-turn calculator conversations with tool turns) is the same."""
    import json

    from verl.trainer.sft_trainer import SFTTrainer

    root = ROOT / "verl" / "assets" / asset
    info = json.loads((root / "build_info.json").read_text())["sft"]
    cfg = compose(
        root / "model",
        {"train": root / "sft" / "val.parquet", "val": root / "sft" / "val.parquet"},
        tmp_path,
        "data.train_batch_size=16",
        "data.use_dynamic_bsz=True",
        "trainer.total_training_steps=1",
    )
    assert SFTTrainer(cfg).validation_loss() == pytest.approx(info["final_val_loss"], rel=1e-4)


@pytest.mark.slow
def test_custom_dataset_class_retention_and_the_checkpoint_copy(tmp_path, model_dir, data, process_group):
    """`data.custom_cls`, `trainer.max_ckpt_to_keep` and `trainer.default_hdfs_dir` (a mounted copy)."""
    user = tmp_path / "my_dataset.py"
    user.write_text(
        "from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset\n"
        "class Half(MultiTurnSFTDataset):\n"
        "    def __len__(self):\n"
        "        return super().__len__() // 2\n"
    )
    out, copy = tmp_path / "o", tmp_path / "mounted"
    trainer, losses = _run(
        compose(
            model_dir,
            data,
            out,
            f"data.custom_cls.path={user}",
            "data.custom_cls.name=Half",
            "trainer.total_epochs=3",
            "trainer.save_freq=1",
            "trainer.max_ckpt_to_keep=2",
            f"trainer.default_hdfs_dir={copy}",
        )
    )
    assert type(trainer.train_dataset).__name__ == "Half" and trainer.steps_per_epoch == 2  # 32 rows / 16
    assert sorted(losses) == list(range(1, 7))
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("global_step_")) == [
        "global_step_5",
        "global_step_6",
    ]
    assert (copy / "global_step_6" / "manifest.json").exists()
