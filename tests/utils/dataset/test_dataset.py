"""RLHFDataset, collate_fn and the resumable StatefulDataLoader."""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import RandomSampler, SequentialSampler

from verl.utils.dataset import (
    RLHFDataset,
    SeededRandomSampler,
    StatefulDataLoader,
    collate_fn,
    create_rl_sampler,
    create_sampler,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tokenizer(embedded_tokenizer):
    return embedded_tokenizer


def _row(i, content="12+34", **extra):
    row = {
        "data_source": "verl_toy/addition",
        "prompt": [{"role": "user", "content": content}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": "46"},
        "extra_info": {"split": "train", "index": 100 + i},
    }
    row.update(extra)
    return row


def _parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def _jsonl(path, rows):
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


CFG = {"max_prompt_length": 16, "truncation": "error", "prompt_key": "prompt"}


# ------------------------------------------------------------------------------------------ RLHFDataset
def test_item_is_left_padded_with_positions_and_passthrough_fields(tmp_path, tokenizer):
    path = _parquet(tmp_path / "a.parquet", [_row(0, "7+5"), _row(1, "47+85")])
    ds = RLHFDataset(path, tokenizer, {**CFG, "return_raw_chat": True, "return_full_prompt": True})
    assert len(ds) == 2
    item = ds[1]
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": "47+85"}], add_generation_prompt=True, tokenize=True
    )["input_ids"]
    n = len(expected)
    assert item["raw_prompt_ids"] == expected
    assert item["input_ids"].shape == item["attention_mask"].shape == item["position_ids"].shape == (16,)
    assert item["input_ids"][-n:].tolist() == expected
    assert item["input_ids"][:-n].tolist() == [tokenizer.pad_token_id] * (16 - n)
    assert item["attention_mask"].tolist() == [0] * (16 - n) + [1] * n
    assert item["position_ids"].tolist() == [0] * (16 - n) + list(range(n))
    assert item["raw_prompt"] == [{"role": "user", "content": "47+85"}]
    assert item["full_prompts"] == "<|bos|><|user|>47+85<|end|><|assistant|>"
    assert item["data_source"] == "verl_toy/addition"
    assert item["reward_model"] == {"style": "rule", "ground_truth": "46"}
    assert item["extra_info"]["split"] == "train"
    assert item["ability"] == "arithmetic"
    assert item["index"] == 101
    assert "prompt" not in item
    assert type(item["raw_prompt_ids"]) is list and all(type(t) is int for t in item["raw_prompt_ids"])
    assert item["input_ids"].dtype == torch.long
    plain_ds = RLHFDataset(path, tokenizer, CFG)
    plain = plain_ds[0]
    assert "raw_prompt" not in plain and "full_prompts" not in plain
    # prompts are kept as int32 arrays (a list of Python ints costs ~36 bytes per token); no text copy
    assert all(ids.dtype == np.int32 for ids in plain_ds._prompt_ids) and plain_ds._prompt_text == []


def test_reads_jsonl_and_lists_of_files_and_index_falls_back_to_position(tmp_path, tokenizer):
    rows = [_row(i) for i in range(3)]
    for r in rows:
        del r["extra_info"]
    a = _jsonl(tmp_path / "a.jsonl", rows[:2])
    b = _parquet(tmp_path / "b.parquet", rows[2:])
    ds = RLHFDataset([a, b], tokenizer, CFG)
    assert len(ds) == 3
    assert [ds[i]["index"] for i in range(3)] == [0, 1, 2]


def test_json_files_hold_an_array_or_json_lines(tmp_path):
    from verl.utils.dataset.files import read_file_rows

    rows = [{"a": 1, "s": "x\u2028y"}, {"a": 2, "s": ""}]
    (tmp_path / "arr.json").write_text(json.dumps(rows, indent=2))
    (tmp_path / "lines.json").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n\n")
    assert read_file_rows(str(tmp_path / "arr.json")) == rows
    assert read_file_rows(str(tmp_path / "lines.json")) == rows  # a raw U+2028 inside a string is no line break
    (tmp_path / "bad.json").write_text(json.dumps([{"a": 1}, 3]))
    with pytest.raises(ValueError, match=r"bad\.json \(row 1\): expected a JSON object"):
        read_file_rows(str(tmp_path / "bad.json"))


def test_collate_fn_gives_tensors_and_1d_object_arrays_for_dataproto(tmp_path, tokenizer):
    path = _parquet(tmp_path / "a.parquet", [_row(i, "10+10") for i in range(4)])
    ds = RLHFDataset(path, tokenizer, CFG)
    batch = collate_fn([ds[i] for i in range(4)])
    assert batch["input_ids"].shape == (4, 16) and batch["input_ids"].dtype == torch.long
    # equal-length raw_prompt_ids must not turn into a 2-D array
    assert batch["raw_prompt_ids"].shape == (4,) and batch["raw_prompt_ids"].dtype == object
    assert batch["raw_prompt_ids"][0] == ds[0]["raw_prompt_ids"]
    assert batch["reward_model"][2]["ground_truth"] == "46"
    from verl import DataProto

    dp = DataProto.from_single_dict(batch)
    assert len(dp) == 4
    assert set(dp.batch.keys()) >= {"input_ids", "attention_mask", "position_ids"}
    assert dp.non_tensor_batch["data_source"].tolist() == ["verl_toy/addition"] * 4
    with pytest.raises(ValueError, match="same columns"):
        collate_fn([{"a": 1}, {"b": 2}])


def test_missing_prompt_names_file_and_row(tmp_path, tokenizer):
    rows = [_row(0), {"data_source": "x", "reward_model": {"ground_truth": "1"}}]
    path = _parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(KeyError, match=r"bad\.parquet \(row 1\).*missing prompt column 'prompt'"):
        RLHFDataset(path, tokenizer, CFG)


@pytest.mark.parametrize(
    "prompt, match",
    [
        ("just a string", "list of chat messages"),
        ([], "list of chat messages"),
        ([{"role": "user"}], "message 0 must be a dict with str 'role' and 'content'"),
        ([{"role": "user", "content": 5}], "message 0"),
    ],
)
def test_wrong_prompt_types_say_what_is_expected(tmp_path, tokenizer, prompt, match):
    path = _jsonl(tmp_path / "bad.jsonl", [_row(0), _row(1, prompt=prompt)])
    with pytest.raises(ValueError, match=match) as e:
        RLHFDataset(path, tokenizer, CFG)
    assert "bad.jsonl (row 1)" in str(e.value)


def test_wrong_types_of_other_columns(tmp_path, tokenizer):
    with pytest.raises(TypeError, match=r"row 0.*'reward_model' must be a dict"):
        RLHFDataset(_jsonl(tmp_path / "a.jsonl", [_row(0, reward_model="46")]), tokenizer, CFG)
    with pytest.raises(TypeError, match=r"'data_source' must be a string"):
        RLHFDataset(_jsonl(tmp_path / "b.jsonl", [_row(0, data_source=3)]), tokenizer, CFG)


def test_overlong_prompt_error_filter_and_truncation(tmp_path, tokenizer):
    long = "1234567890+1234567890"  # 21 chars + 4 template tokens = 25 tokens > 16
    path = _parquet(tmp_path / "long.parquet", [_row(0), _row(1, long), _row(2)])
    with pytest.raises(ValueError, match=r"long\.parquet \(row 1\): prompt has 25 tokens.*max_prompt_length=16"):
        RLHFDataset(path, tokenizer, CFG)
    filtered = RLHFDataset(path, tokenizer, {**CFG, "filter_overlong_prompts": True})
    assert len(filtered) == 2 and filtered.num_filtered == 1
    assert [filtered[i]["index"] for i in range(2)] == [100, 102]

    full = tokenizer.apply_chat_template(
        [{"role": "user", "content": long}], add_generation_prompt=True, tokenize=True
    )["input_ids"]
    assert len(full) == 25
    left = RLHFDataset(path, tokenizer, {**CFG, "truncation": "left"})[1]
    right = RLHFDataset(path, tokenizer, {**CFG, "truncation": "right"})[1]
    middle = RLHFDataset(path, tokenizer, {**CFG, "truncation": "middle"})[1]
    assert left["raw_prompt_ids"] == full[-16:]
    assert right["raw_prompt_ids"] == full[:16]
    assert middle["raw_prompt_ids"] == full[:8] + full[-8:]
    for item in (left, right, middle):
        assert item["attention_mask"].all() and item["input_ids"].tolist() == item["raw_prompt_ids"]


def test_all_rows_filtered_is_an_error_and_bad_config(tmp_path, tokenizer):
    path = _parquet(tmp_path / "a.parquet", [_row(0)])
    with pytest.raises(ValueError, match="no rows left"):
        RLHFDataset(path, tokenizer, {**CFG, "max_prompt_length": 2, "filter_overlong_prompts": True})
    with pytest.raises(ValueError, match="truncation='sideways'"):
        RLHFDataset(path, tokenizer, {**CFG, "truncation": "sideways"})
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        RLHFDataset(str(tmp_path / "nope.parquet"), tokenizer, CFG)


def test_config_may_be_an_omegaconf_section(tmp_path, tokenizer):
    from omegaconf import OmegaConf

    path = _parquet(tmp_path / "a.parquet", [_row(0)])
    ds = RLHFDataset(path, tokenizer, OmegaConf.create({**CFG, "max_prompt_length": 12, "return_raw_chat": None}))
    assert ds[0]["input_ids"].shape == (12,)


# ---------------------------------------------------------------------------------------------- samplers
def test_seeded_sampler_is_a_function_of_seed_and_epoch():
    a, b = SeededRandomSampler(50, seed=3), SeededRandomSampler(50, seed=3)
    assert list(a) == list(b) and sorted(a) == list(range(50))
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    assert list(SeededRandomSampler(50, seed=4)) != first
    assert isinstance(create_sampler(range(5), shuffle=False), SequentialSampler)
    s = create_rl_sampler({"shuffle": True, "seed": 7}, list(range(10)))
    assert isinstance(s, SeededRandomSampler) and s.seed == 7


# ---------------------------------------------------------------------------------------------- loader
def _epochs(loader, n_epochs, trainer_sets_epoch):
    """Batches (as lists of ints) of `n_epochs` passes, the way the trainer loops."""
    out = []
    for epoch in range(n_epochs):
        if trainer_sets_epoch and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        out.append([b.tolist() for b in loader])
    return out


def _resumed(make_loader, n_epochs, stop_after, trainer_sets_epoch):
    """Run until `stop_after` batches were consumed, save, rebuild, restore, and finish the epochs."""
    loader = make_loader()
    seen, state, epoch_at_save = [], None, None
    for epoch in range(n_epochs):
        if trainer_sets_epoch and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        for b in loader:
            seen.append(b.tolist())
            if len(seen) == stop_after:
                state, epoch_at_save = loader.state_dict(), epoch
                break
        if state is not None:
            break
    state = torch.load(_roundtrip(state), weights_only=False)
    loader = make_loader()
    loader.load_state_dict(state)
    for epoch in range(epoch_at_save, n_epochs):
        if trainer_sets_epoch and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        seen.extend(b.tolist() for b in loader)
    return seen


def _roundtrip(state):
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return buf


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(3, 23),
    batch_size=st.integers(1, 5),
    drop_last=st.booleans(),
    n_epochs=st.integers(1, 3),
    stop_frac=st.floats(0, 1),
    kind=st.sampled_from(["seeded", "sequential", "generator"]),
    trainer_sets_epoch=st.booleans(),
)
def test_resume_anywhere_continues_exactly(n, batch_size, drop_last, n_epochs, stop_frac, kind, trainer_sets_epoch):
    def make_loader():
        if kind == "seeded":
            sampler = SeededRandomSampler(n, seed=5)
        elif kind == "sequential":
            sampler = SequentialSampler(range(n))
        else:
            sampler = RandomSampler(range(n), generator=torch.Generator().manual_seed(9))
        return StatefulDataLoader(list(range(n)), batch_size=batch_size, sampler=sampler, drop_last=drop_last)

    full = [b for epoch in _epochs(make_loader(), n_epochs, trainer_sets_epoch) for b in epoch]
    if not full:
        return
    stop_after = 1 + int(stop_frac * (len(full) - 1))
    assert _resumed(make_loader, n_epochs, stop_after, trainer_sets_epoch) == full


def test_epochs_differ_and_state_after_last_batch_means_epoch_done():
    make = lambda: StatefulDataLoader(
        list(range(8)), batch_size=4, sampler=SeededRandomSampler(8, seed=1), drop_last=True
    )
    loader = make()
    e0 = [b.tolist() for b in loader]
    e1 = [b.tolist() for b in loader]  # plain loops advance the epoch by themselves
    assert e0 != e1 and sorted(sum(e0, [])) == sorted(sum(e1, [])) == list(range(8))
    # save right after the last batch of epoch 0 (the trainer has not asked for more yet)
    loader = make()
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert state["epoch"] == 0 and state["batches_yielded"] == 2
    resumed = make()
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == []  # the rest of epoch 0 is empty
    assert [b.tolist() for b in resumed] == e1


def test_loader_len_shuffle_and_workers():
    ds = list(range(10))
    assert len(StatefulDataLoader(ds, batch_size=4, drop_last=True)) == 2
    assert len(StatefulDataLoader(ds, batch_size=4, drop_last=False)) == 3
    shuffled = StatefulDataLoader(ds, batch_size=10, shuffle=True, seed=3)
    assert sorted(next(iter(shuffled)).tolist()) == ds and next(iter(shuffled)).tolist() != ds
    with pytest.raises(ValueError, match="either sampler or shuffle"):
        StatefulDataLoader(ds, batch_size=2, shuffle=True, sampler=SequentialSampler(ds))
    # one background worker gives the same batches and the same resume behaviour
    loader = StatefulDataLoader(ds, batch_size=3, num_workers=1, sampler=SeededRandomSampler(10, seed=2))
    it = iter(loader)
    first = next(it).tolist()
    state = loader.state_dict()
    rest = [b.tolist() for b in it]
    again = StatefulDataLoader(ds, batch_size=3, num_workers=1, sampler=SeededRandomSampler(10, seed=2))
    again.load_state_dict(state)
    assert [b.tolist() for b in again] == rest and len(first) == 3


def test_unresumable_or_mismatched_states_fail_clearly():
    loader = StatefulDataLoader(list(range(6)), batch_size=2, sampler=RandomSampler(range(6)))
    with pytest.raises(ValueError, match="without a generator"):
        loader.state_dict()
    good = StatefulDataLoader(list(range(6)), batch_size=2, sampler=SeededRandomSampler(6))
    next(iter(good))
    state = good.state_dict()
    with pytest.raises(ValueError, match="batch_size=2 but this loader has batch_size=3"):
        StatefulDataLoader(list(range(6)), batch_size=3, sampler=SeededRandomSampler(6)).load_state_dict(state)
    with pytest.raises(ValueError, match="num_samples"):
        StatefulDataLoader(list(range(8)), batch_size=2, sampler=SeededRandomSampler(8)).load_state_dict(state)
    restored = StatefulDataLoader(list(range(6)), batch_size=2, sampler=SeededRandomSampler(6))
    restored.load_state_dict(state)
    restored.sampler.set_epoch(3)
    with pytest.raises(RuntimeError, match="restored inside epoch 0"):
        next(iter(restored))


def test_rl_batches_through_the_loader(tmp_path, tokenizer):
    path = _parquet(tmp_path / "a.parquet", [_row(i, f"{i}+1") for i in range(10)])
    ds = RLHFDataset(path, tokenizer, CFG)
    loader = StatefulDataLoader(
        ds, batch_size=4, sampler=create_rl_sampler({"seed": 1}, ds), drop_last=True, collate_fn=collate_fn
    )
    batches = list(loader)
    assert len(batches) == 2
    assert batches[0]["input_ids"].shape == (4, 16)
    assert isinstance(batches[0]["extra_info"], np.ndarray)


def test_missing_or_null_ground_truth_names_file_and_row(tmp_path, tokenizer):
    # parquet keeps the key of a struct field with a null value: the null case of a real file
    path = _parquet(tmp_path / "gt.parquet", [_row(0), _row(1, reward_model={"style": "rule", "ground_truth": None})])
    with pytest.raises(ValueError, match=r"gt\.parquet \(row 1\): reward_model\.ground_truth is null"):
        RLHFDataset(path, tokenizer, CFG)
    path = _jsonl(tmp_path / "nogt.jsonl", [_row(0), _row(1), _row(2, reward_model={"style": "rule"})])
    with pytest.raises(KeyError, match=r"nogt\.jsonl \(row 2\): reward_model has no 'ground_truth'"):
        RLHFDataset(path, tokenizer, CFG)
    path = _jsonl(tmp_path / "null_rm.jsonl", [_row(0, reward_model=None)])
    with pytest.raises(TypeError, match=r"null_rm\.jsonl \(row 0\).*'reward_model' must be a dict"):
        RLHFDataset(path, tokenizer, CFG)
    # rows scored by a reward model may leave it null
    path = _jsonl(tmp_path / "rm.jsonl", [_row(0, reward_model={"style": "model", "ground_truth": None})])
    assert len(RLHFDataset(path, tokenizer, CFG)) == 1
