"""LoRA in the SFT trainer with the RL trainer's model keys, and SFT then RL on the same adapter
(`actor_rollout_ref.model.lora_adapter_path` = the SFT run's `lora_adapter/`)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import build_tiny_model, save_model_dir
from test_sft import _config, _sft_data, tokenizer  # noqa: F401 (fixture)
from test_workers import make_config

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tokenizer):  # noqa: F811
    """A 2-layer, hidden-32 Llama with the embedded tokenizer and N(0, 0.2) weights. With the
    default 0.02 init the frozen output head gives near-uniform logits that no adapter on the
    hidden layers can sharpen; larger weights stand in for a pretrained base."""
    model = build_tiny_model(tokenizer)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2, generator=g)
    return save_model_dir(model, tokenizer, tmp_path_factory.mktemp("tiny_lora_sft_model"))


@pytest.mark.slow
def test_sft_lora_trains_an_adapter_that_rl_continues(tmp_path, tiny_model_dir, tokenizer):  # noqa: F811
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from verl.trainer.fsdp_sft_trainer import run_sft
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    torch.set_num_threads(1)
    train, val = _sft_data(tmp_path, n_train=64, n_val=16)
    cfg = _config(
        tiny_model_dir,
        train,
        val,
        tmp_path / "out",
        **{
            "model.lora_rank": 8,
            "model.lora_alpha": 16,
            "data.train_batch_size": 16,
            "data.micro_batch_size_per_gpu": 8,
            "optim.lr": 1e-2,
            "optim.warmup_steps_ratio": 0.0,
            "optim.lr_scheduler": "constant",
            "trainer.total_training_steps": 40,
            "trainer.log_freq": 100,
        },
    )
    result = run_sft(cfg)
    hist = result["history"]
    assert sum(h["train/loss"] for h in hist[-3:]) / 3 < 0.7 * hist[0]["train/loss"]
    out = tmp_path / "out" / "global_step_40"
    adapter_dir = out / "lora_adapter"
    saved = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert saved["r"] == 8 and saved["lora_alpha"] == 16
    ids = torch.tensor([[5, 9, 11, 7, 13, 6, 8, 10]])
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        base_logits = base(input_ids=ids).logits
        merged_logits = AutoModelForCausalLM.from_pretrained(str(out))(input_ids=ids).logits  # plain transformers
        peft_logits = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(adapter_dir))(
            input_ids=ids
        ).logits
    assert float((merged_logits - peft_logits).abs().max()) < 1e-5
    assert float((base_logits - peft_logits).abs().max()) > 1e-3  # the adapter learned something

    # RL continues the SFT adapter: same policy at init, base model as the reference
    rl = make_config(tiny_model_dir, **{"actor_rollout_ref.model.lora_adapter_path": str(adapter_dir)})
    worker = ActorRolloutRefWorker(config=rl.actor_rollout_ref, role="actor_rollout_ref")
    worker.init_model()
    assert worker.ref_policy is None
    trainable = [n for n, p in worker.actor_module.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)  # loaded as trainable
    with torch.no_grad():
        rl_logits = worker.actor_module(input_ids=ids).logits
        with worker.actor_module.disable_adapter():
            ref_logits = worker.actor_module(input_ids=ids).logits
    assert torch.equal(rl_logits, peft_logits)
    assert torch.equal(ref_logits, base_logits)
