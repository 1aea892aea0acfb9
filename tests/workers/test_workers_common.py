"""Tiny models, tokenizers and batches shared by the worker/engine tests (and a sanity test of them).

Everything is built offline in temporary directories: a character-level tokenizer (the
`tokenizers` library wrapped as `PreTrainedTokenizerFast`, class written explicitly) and a random
`LlamaForCausalLM` with hidden size 32 and 2 layers (~40k parameters).
"""

from __future__ import annotations

import json
import os
import string

import torch

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
CHARS = list(string.digits + string.ascii_lowercase + "+-=*?:., ")


def build_tokenizer(out_dir: str):
    """Character-level tokenizer: pad=0, bos=1, eos=2, then one id per character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, padding_side="left"
    )
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'][0] ~ ':' ~ m['content'] ~ '<eos>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'a:' }}{% endif %}"
    )
    fast.save_pretrained(out_dir)
    # make the class explicit so AutoTokenizer never substitutes a model-specific one
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    return fast


def build_tiny_llama(
    out_dir: str,
    hidden_size: int = 32,
    num_layers: int = 2,
    seed: int = 0,
    intermediate_size: int | None = None,
    heads: int = 4,
    kv_heads: int = 2,
):
    """Random LlamaForCausalLM + tokenizer saved in `out_dir`; returns the directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer(out_dir)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # larger random weights than the default init make the output distribution far from uniform,
    # so sampling, EOS and log-prob differences are visible in tests
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    model.save_pretrained(out_dir)
    return out_dir


def make_batch(tokenizer, prompts: list[str], responses: list[str], prompt_len: int, resp_len: int, eos: bool = True):
    """A training batch in the upstream layout: left-padded prompts + right-padded responses.

    Returns a dict of tensors: prompts [b, P], responses [b, R], response_mask [b, R],
    input_ids/attention_mask/position_ids [b, P + R].
    """
    from verl.utils.model import compute_position_id_with_mask

    b = len(prompts)
    pad = tokenizer.pad_token_id
    p_ids = torch.full((b, prompt_len), pad, dtype=torch.long)
    p_mask = torch.zeros((b, prompt_len), dtype=torch.long)
    r_ids = torch.full((b, resp_len), pad, dtype=torch.long)
    r_mask = torch.zeros((b, resp_len), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=False)):
        pi = tokenizer(p, add_special_tokens=False)["input_ids"][-prompt_len:]
        ri = tokenizer(r, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if eos else [])
        ri = ri[:resp_len]
        p_ids[i, prompt_len - len(pi) :] = torch.tensor(pi)
        p_mask[i, prompt_len - len(pi) :] = 1
        r_ids[i, : len(ri)] = torch.tensor(ri)
        r_mask[i, : len(ri)] = 1
    attention_mask = torch.cat([p_mask, r_mask], dim=1)
    return {
        "prompts": p_ids,
        "responses": r_ids,
        "response_mask": r_mask,
        "input_ids": torch.cat([p_ids, r_ids], dim=1),
        "attention_mask": attention_mask,
        "position_ids": compute_position_id_with_mask(attention_mask),
    }


def reference_log_probs(model, batch, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of the response tokens from one plain padded transformers forward ([b, R])."""
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits
    resp_len = batch["responses"].shape[1]
    logits = logits[:, -resp_len - 1 : -1].float() / temperature
    lp = torch.log_softmax(logits, dim=-1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    return lp * batch["response_mask"]


PROMPTS = ["1+2=", "13+4=", "7+75=", "9=", "12+34=", "5+5=", "100+1=", "3="]
RESPONSES = ["3", "17", "82", "nine", "46", "10", "101", "three"]


def test_tiny_model_and_tokenizer_round_trip(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_llama(str(tmp_path))
    tok = AutoTokenizer.from_pretrained(path)
    assert "Llama" not in type(tok).__name__  # our tokenizer.json, not a model-specific class
    text = "12+34=46"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    model = AutoModelForCausalLM.from_pretrained(path)
    batch = make_batch(tok, PROMPTS, RESPONSES, prompt_len=8, resp_len=6)
    lp = reference_log_probs(model, batch)
    assert lp.shape == (8, 6)
    assert torch.all(lp[batch["response_mask"] == 0] == 0)
    assert torch.all(lp[batch["response_mask"] == 1] < 0)
