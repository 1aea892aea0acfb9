"""`verl.utils.dataset.files`: a data file that cannot be read is named in the error."""

from __future__ import annotations

import os

import pytest

from verl.trainer.main_ppo import load_default_config
from verl.trainer.ppo.utils import validate_config
from verl.utils.dataset.files import read_file_rows, read_rows


def test_empty_parquet_names_the_file(tmp_path):
    path = tmp_path / "train.parquet"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=rf"{path}: not a readable parquet file .*0 bytes"):
        read_file_rows(str(path))
    with pytest.raises(ValueError, match=str(path)):
        read_rows([str(path)])


def test_corrupt_parquet_names_the_file(tmp_path):
    path = tmp_path / "val.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ValueError, match=rf"{path}: not a readable parquet file"):
        read_file_rows(str(path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_parquet_names_the_file(tmp_path):
    path = tmp_path / "locked.parquet"
    path.write_bytes(b"x")
    path.chmod(0)
    with pytest.raises(OSError, match=str(path)):
        read_file_rows(str(path))


def test_a_directory_named_like_parquet_names_the_path(tmp_path):
    path = tmp_path / "dir.parquet"
    path.mkdir()
    with pytest.raises(OSError, match=str(path)):
        read_file_rows(str(path))


def test_empty_data_file_fails_at_validation_naming_the_key(tmp_path):
    path = tmp_path / "train.parquet"
    path.write_bytes(b"")
    cfg = load_default_config([f"data.train_files={path}", "algorithm.adv_estimator=grpo"])
    with pytest.raises(ValueError, match=r"data\.train_files=.*train\.parquet.*empty \(0 bytes\)"):
        validate_config(cfg)
