"""Reward model engine: the score is the head output at the last valid token, placed on the last
valid response position; re-templating with the reward model's own tokenizer."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from test_workers_common import PROMPTS, RESPONSES, build_tiny_llama, make_batch

from verl.protocol import DataProto
from verl.utils.model import build_reward_model
from verl.workers.config import RewardModelConfig
from verl.workers.reward_model import DataParallelRewardModel


@pytest.fixture(scope="module")
def rm(tmp_path_factory):
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    path = build_tiny_llama(str(tmp_path_factory.mktemp("tiny_rm")))
    tok = AutoTokenizer.from_pretrained(path)
    model = build_reward_model(path)
    return path, tok, model


def _score_alone(model, ids: list[int]) -> float:
    """Reference: the sequence alone, unpadded (the model's own pooling then takes the last token)."""
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


@pytest.mark.parametrize("use_remove_padding", [True, False])
def test_scores_at_last_valid_token(rm, use_remove_padding):
    _, tok, model = rm
    batch = make_batch(tok, PROMPTS, RESPONSES, prompt_len=8, resp_len=6)
    engine = DataParallelRewardModel(
        RewardModelConfig(micro_batch_size_per_gpu=3), model, use_remove_padding=use_remove_padding
    )
    scores = engine.compute_rm_score(DataProto.from_dict(tensors=batch))
    assert scores.shape == (8, 6)
    for i in range(8):
        valid = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        n = int(batch["response_mask"][i].sum())
        expected = _score_alone(model, valid)
        assert scores[i, n - 1].item() == pytest.approx(expected, abs=1e-5)
        assert torch.count_nonzero(scores[i]) <= 1  # nothing else is scored


def test_retemplating_with_a_different_reward_tokenizer(rm, tmp_path):
    from transformers import AutoTokenizer

    path, tok, model = rm
    # a reward tokenizer with the same vocabulary but another chat template
    rm_dir = str(tmp_path / "rm_tok")
    tok.save_pretrained(rm_dir)
    cfg_path = os.path.join(rm_dir, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    template = "{% for m in messages %}{{ m['role'][0] ~ '=' ~ m['content'] ~ '<eos>' }}{% endfor %}"
    cfg["chat_template"] = template
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    for extra in ("chat_template.jinja",):
        p = os.path.join(rm_dir, extra)
        if os.path.exists(p):
            with open(p, "w") as f:
                f.write(template)
    rm_tok = AutoTokenizer.from_pretrained(rm_dir)
    batch = make_batch(tok, PROMPTS[:4], RESPONSES[:4], prompt_len=8, resp_len=6)
    raw = np.empty(4, dtype=object)
    for i, p in enumerate(PROMPTS[:4]):
        raw[i] = [{"role": "user", "content": p}]
    data = DataProto.from_dict(tensors=batch, non_tensors={"raw_prompt": raw})
    engine = DataParallelRewardModel(RewardModelConfig(max_length=32), model, rm_tokenizer=rm_tok, input_tokenizer=tok)
    scores = engine.compute_rm_score(data)
    for i in range(4):
        text = f"u={PROMPTS[i]}<eos>a={RESPONSES[i]}<eos>"
        ids = rm_tok(text, add_special_tokens=False)["input_ids"]
        n = int(batch["response_mask"][i].sum())
        assert scores[i, n - 1].item() == pytest.approx(_score_alone(model, ids), abs=1e-5)
    # too long for max_length: the beginning is cut, the end (where the score is read) is kept
    short = DataParallelRewardModel(RewardModelConfig(max_length=6), model, rm_tokenizer=rm_tok, input_tokenizer=tok)
    scores = short.compute_rm_score(data)
    for i in range(4):
        ids = rm_tok(f"u={PROMPTS[i]}<eos>a={RESPONSES[i]}<eos>", add_special_tokens=False)["input_ids"]
        n = int(batch["response_mask"][i].sum())
        assert len(ids) > 6
        assert scores[i, n - 1].item() == pytest.approx(_score_alone(model, ids[-6:]), abs=1e-5)
    with pytest.raises(KeyError, match="return_raw_chat"):
        engine.compute_rm_score(DataProto.from_dict(tensors=batch))
