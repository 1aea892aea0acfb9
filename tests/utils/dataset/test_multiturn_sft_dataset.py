"""MultiTurnSFTDataset: assistant-only loss masks (tool-call turns included), single-turn rows,
non-prefix-stable templates, truncation, padding modes and the collator."""

import copy

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset, collate_sft_rows

CONV = [
    {"role": "system", "content": "add"},
    {"role": "user", "content": "1+1"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "2+2"},
    {"role": "assistant", "content": "4"},
]

# renders tool calls and the tool schemas (the embedded template ignores both)
TOOL_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|system|>T:{% for t in tools %}{{ t['function']['name'] }}{% endfor %}"
    "<|end|>{% endif %}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}"
    "[{{ c['function']['name'] }}({{ c['function']['arguments'] }})]"
    "{% endfor %}{% endif %}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture
def tokenizer(embedded_tokenizer):
    return copy.deepcopy(embedded_tokenizer)


def _parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def _trained_text(tokenizer, item):
    ids = item["input_ids"].tolist()
    return tokenizer.decode([t for t, m in zip(ids, item["loss_mask"].tolist(), strict=True) if m == 1])


def test_loss_on_assistant_turns_only_and_tokens_equal_the_whole_conversation(tmp_path, tokenizer):
    path = _parquet(tmp_path / "m.parquet", [{"messages": CONV}])
    item = MultiTurnSFTDataset(path, tokenizer, {"max_length": 64})[0]
    # the assistant's content and its end-of-turn token; never the generation prompt <|assistant|>
    assert _trained_text(tokenizer, item) == "2<|end|>4<|end|>"
    whole = tokenizer.apply_chat_template(CONV, tokenize=True)["input_ids"]
    assert item["input_ids"].tolist() == list(whole)
    assert item["position_ids"].tolist() == list(range(len(whole)))
    assert "attention_mask" not in item  # pad_mode=no_padding (upstream's default)


def test_tool_call_turns_are_trained_and_tool_results_are_not(tmp_path, tokenizer):
    tokenizer.chat_template = TOOL_TEMPLATE
    conv = [
        {"role": "user", "content": "12*3"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": "12*3"}}],
        },
        {"role": "tool", "content": "36"},
        {"role": "assistant", "content": "36"},
    ]
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    path = _parquet(tmp_path / "t.parquet", [{"messages": conv, "tools": tools}])
    item = MultiTurnSFTDataset(path, tokenizer, {"max_length": 128})[0]
    assert _trained_text(tokenizer, item) == "[calc(12*3)]<|end|>36<|end|>"
    text = tokenizer.decode(item["input_ids"].tolist())
    assert text.startswith("<|bos|><|system|>T:calc<|end|><|user|>12*3")  # the tools column reached the template
    assert "<|tool|>36<|end|>" in text


def test_single_turn_prompt_response_rows(tmp_path, tokenizer):
    path = _parquet(tmp_path / "s.parquet", [{"prompt": [{"role": "user", "content": "47+85"}], "response": "132"}])
    item = MultiTurnSFTDataset(path, tokenizer, {"max_length": 32})[0]
    assert tokenizer.decode(item["input_ids"].tolist()) == "<|bos|><|user|>47+85<|end|><|assistant|>132<|end|>"
    assert _trained_text(tokenizer, item) == "132<|end|>"
    text_prompt = _parquet(tmp_path / "p.parquet", [{"question": "1+2", "answer": "3"}])
    item = MultiTurnSFTDataset(text_prompt, tokenizer, {"prompt_key": "question", "response_key": "answer"})[0]
    assert _trained_text(tokenizer, item) == "3<|end|>"
    with pytest.raises(KeyError, match=r"no column 'messages' \(data.messages_key\) and no 'prompt' \+ 'response'"):
        MultiTurnSFTDataset(text_prompt, tokenizer, {})


def test_template_that_rewrites_earlier_turns_fails_unless_ignored(tmp_path, tokenizer):
    # the last assistant turn is rendered with a marker that earlier ones lose (as Qwen3's thinking templates do)
    tokenizer.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
        "{% if loop.last and m['role'] == 'assistant' %}!{% endif %}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    path = _parquet(tmp_path / "m.parquet", [{"messages": CONV}])
    with pytest.raises(ValueError, match=r"m\.parquet \(row 0\): the chat template renders earlier turns differently"):
        MultiTurnSFTDataset(path, tokenizer, {"max_length": 64})
    item = MultiTurnSFTDataset(path, tokenizer, {"max_length": 64, "ignore_input_ids_mismatch": True})[0]
    assert _trained_text(tokenizer, item).count("4") == 1


def test_truncation_padding_and_collate(tmp_path, tokenizer):
    path = _parquet(tmp_path / "m.parquet", [{"messages": CONV}, {"messages": CONV[:3]}])
    with pytest.raises(ValueError, match=r"m\.parquet \(row 0\): 22 tokens exceed data.max_length=10"):
        MultiTurnSFTDataset(path, tokenizer, {"max_length": 10})
    left = MultiTurnSFTDataset(path, tokenizer, {"max_length": 10, "truncation": "left"})[0]
    assert (
        tokenizer.decode(left["input_ids"].tolist()).endswith("<|assistant|>4<|end|>") and len(left["input_ids"]) == 10
    )
    right = MultiTurnSFTDataset(path, tokenizer, {"max_length": 24, "pad_mode": "right"})
    assert right[1]["input_ids"].shape == (24,) and int(right[1]["attention_mask"].sum()) == 14
    batch = collate_sft_rows([right[0], right[1]], tokenizer.pad_token_id)
    assert batch["input_ids"].shape == (2, 22)  # padded to the longest row, not to max_length
    assert batch["attention_mask"].sum(-1).tolist() == [22, 14]
    assert batch["loss_mask"][1, 14:].sum() == 0 and batch["input_ids"][1, 14:].eq(tokenizer.pad_token_id).all()
    with pytest.raises(ValueError, match="data.pad_mode='left' is not allowed"):
        MultiTurnSFTDataset(path, tokenizer, {"pad_mode": "left"})
    assert len(MultiTurnSFTDataset(path, tokenizer, {}, max_samples=1)) == 1
