"""scripts/data_preprocess: GSM8K and MATH conversion from local files, and a clear failure offline."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl.utils.reward_score import default_compute_score

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures"
SCRIPTS = ROOT / "scripts" / "data_preprocess"

# every test runs a preprocessing script in a subprocess
pytestmark = pytest.mark.slow


def _run(script, *args, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )


def _rows(path):
    return pq.read_table(str(path)).to_pylist()


def test_gsm8k_from_local_jsonl(tmp_path):
    proc = _run("gsm8k.py", "--local_dataset_path", str(FIXTURES / "gsm8k"), "--local_save_dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    train, test = _rows(tmp_path / "train.parquet"), _rows(tmp_path / "test.parquet")
    assert len(train) == 3 and len(test) == 2
    row = train[1]
    assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    assert row["prompt"][0]["role"] == "user"
    assert row["prompt"][0]["content"].startswith("A farm sells 1,250 eggs") and row["prompt"][0]["content"].endswith(
        '"####".'
    )
    assert row["reward_model"] == {"style": "rule", "ground_truth": "10000"}
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 1
    assert [r["reward_model"]["ground_truth"] for r in test] == ["8", "-7"]
    # the converted rows score with the default scorer and load in RLHFDataset
    assert default_compute_score(row["data_source"], "... #### 10000", row["reward_model"]["ground_truth"]) == 1.0


def test_gsm8k_from_hub_style_parquet_and_rlhf_dataset(tmp_path):
    src = tmp_path / "hub" / "main"
    src.mkdir(parents=True)
    for split in ("train", "test"):
        rows = [json.loads(ln) for ln in (FIXTURES / "gsm8k" / f"{split}.jsonl").read_text().splitlines()]
        pq.write_table(pa.Table.from_pylist(rows), str(src / f"{split}-00000-of-00001.parquet"))
    out = tmp_path / "out"
    proc = _run("gsm8k.py", "--local_dataset_path", str(tmp_path / "hub"), "--local_save_dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert len(_rows(out / "train.parquet")) == 3

    from conftest import load_build_script

    bed = load_build_script()
    from verl.utils.dataset import RLHFDataset

    ds = RLHFDataset(str(out / "test.parquet"), bed.build_tokenizer(), {"max_prompt_length": 256})
    assert len(ds) == 2 and ds[1]["reward_model"]["ground_truth"] == "-7"


def test_gsm8k_bad_rows_and_arguments(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.jsonl").write_text(json.dumps({"question": "q", "answer": "no final line"}) + "\n")
    proc = _run(
        "gsm8k.py", "--local_dataset_path", str(bad), "--local_save_dir", str(tmp_path / "o"), "--splits", "train"
    )
    assert proc.returncode != 0 and "train.jsonl (row 0)" in proc.stderr and "####" in proc.stderr
    (bad / "train.jsonl").write_text(json.dumps({"q": "x"}) + "\n")
    proc = _run(
        "gsm8k.py", "--local_dataset_path", str(bad), "--local_save_dir", str(tmp_path / "o"), "--splits", "train"
    )
    assert proc.returncode != 0 and "missing column(s) ['question', 'answer']" in proc.stderr
    proc = _run(
        "gsm8k.py", "--local_dataset_path", str(bad), "--local_save_dir", str(tmp_path / "o"), "--splits", "test"
    )
    assert proc.returncode != 0 and "no test file" in proc.stderr
    proc = _run("gsm8k.py", "--local_save_dir", str(tmp_path / "o"))
    assert proc.returncode != 0 and "exactly one of --local_dataset_path" in proc.stderr


def test_hub_download_without_network_fails_clearly(tmp_path):
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    for script in ("gsm8k.py", "math_dataset.py"):
        proc = _run(script, "--from_hub", "--local_save_dir", str(tmp_path / "o"), env_extra=offline)
        assert proc.returncode != 0
        assert "could not load" in proc.stderr and "--local_dataset_path" in proc.stderr, proc.stderr[-2000:]
        assert not (tmp_path / "o" / "train.parquet").exists()


def test_math_from_local_jsonl(tmp_path):
    proc = _run("math_dataset.py", "--local_dataset_path", str(FIXTURES / "math"), "--local_save_dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    train, test = _rows(tmp_path / "train.parquet"), _rows(tmp_path / "test.parquet")
    assert [r["reward_model"]["ground_truth"] for r in train] == ["\\frac{1}{2}", "4"]
    assert test[0]["reward_model"]["ground_truth"] == "5\\sqrt{2}"
    row = train[0]
    assert row["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert row["prompt"][0]["content"].endswith("within \\boxed{}.")
    assert row["extra_info"] == {"split": "train", "index": 0, "level": "Level 1", "type": "Prealgebra"}
    assert default_compute_score(row["data_source"], "so \\boxed{0.5}", row["reward_model"]["ground_truth"]) == 1.0
    # other MATH data sources can be written with --data_source
    proc = _run(
        "math_dataset.py",
        "--local_dataset_path",
        str(FIXTURES / "math" / "test.jsonl"),
        "--local_save_dir",
        str(tmp_path / "m500"),
        "--splits",
        "test",
        "--data_source",
        "HuggingFaceH4/MATH-500",
    )
    assert proc.returncode == 0, proc.stderr
    assert _rows(tmp_path / "m500" / "test.parquet")[0]["data_source"] == "HuggingFaceH4/MATH-500"


def test_math_row_without_boxed_answer_is_named(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "train.jsonl").write_text(json.dumps({"problem": "p", "solution": "the answer is 3"}) + "\n")
    proc = _run(
        "math_dataset.py", "--local_dataset_path", str(d), "--local_save_dir", str(tmp_path / "o"), "--splits", "train"
    )
    assert proc.returncode != 0 and "train.jsonl (row 0)" in proc.stderr and "boxed" in proc.stderr


def test_a_failing_split_leaves_no_partial_output(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "train.jsonl").write_text((FIXTURES / "gsm8k" / "train.jsonl").read_text())
    (d / "test.jsonl").write_text(json.dumps({"question": "q", "answer": "no final line"}) + "\n")
    out = tmp_path / "o"
    proc = _run("gsm8k.py", "--local_dataset_path", str(d), "--local_save_dir", str(out))
    assert proc.returncode != 0 and "test.jsonl (row 0)" in proc.stderr
    assert not (out / "train.parquet").exists()  # train converted fine but nothing is written


def test_json_array_input(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    rows = [json.loads(ln) for ln in (FIXTURES / "math" / "train.jsonl").read_text().splitlines()]
    (d / "train.json").write_text(json.dumps(rows, indent=1))
    proc = _run(
        "math_dataset.py", "--local_dataset_path", str(d), "--local_save_dir", str(tmp_path / "o"), "--splits", "train"
    )
    assert proc.returncode == 0, proc.stderr
    assert [r["reward_model"]["ground_truth"] for r in _rows(tmp_path / "o" / "train.parquet")] == ["\\frac{1}{2}", "4"]
