"""Shared pytest fixtures.

`ray_session`: one local Ray instance for the whole test session (starting Ray costs seconds, so
tests never start their own). Use it in any test that creates Ray actors::

    def test_something(ray_session):
        pool = RayResourcePool([2], use_gpu=False)
        ...
        pool.release()   # give the CPU reservation back for the next test

It runs Ray on loopback with no dashboard, no usage reporting and no auth, with
``VERL_TEST_RAY_CPUS`` logical CPUs (default 4: with the default 0.5 CPU per worker slot, four
2-worker groups fit at once). Worker processes get the repository root and every folder under
tests/ on their PYTHONPATH, so worker classes defined in test modules can be imported by Ray.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent


def _test_pythonpath() -> str:
    folders = [str(REPO_ROOT)]
    folders += _test_folders()
    existing = os.environ.get("PYTHONPATH")
    if existing:
        folders.append(existing)
    return os.pathsep.join(dict.fromkeys(folders))


def _test_folders() -> list[str]:
    return sorted({str(p.parent) for p in TESTS_DIR.rglob("*.py") if "__pycache__" not in p.parts})


# tests mirror the package in folders without __init__.py (basenames are unique): shared helpers
# (test_workers_common, scorers_for_pools, ...) are imported by name from any folder
for _folder in _test_folders():
    if _folder not in sys.path:
        sys.path.append(_folder)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A test that uses the shared Ray session belongs to the `ray` lane, marked or not (before
    `-m` deselects: the fast lane must never start Ray)."""
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)


@functools.cache
def load_build_script():
    """`scripts/build_embedded_default.py` as a module (it is a script, not part of the package;
    loaded once per session)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "build_embedded_default", REPO_ROOT / "scripts" / "build_embedded_default.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the tiny Llama of the CPU tests: 2 layers, hidden 32 (the build script's `build_model` sizes)
TINY_LLAMA_SIZES = dict(
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=64,
    max_position_embeddings=64,
    seed=0,
)


def build_tiny_model(tokenizer, **sizes):
    """A tiny random Llama over `tokenizer`: `TINY_LLAMA_SIZES` with `sizes` changed."""
    return load_build_script().build_model(tokenizer, **{**TINY_LLAMA_SIZES, **sizes})


def save_model_dir(model, tokenizer, out_dir) -> str:
    """Save `model` and `tokenizer` into `out_dir` (a Hugging Face model directory); returns it."""
    model.save_pretrained(out_dir)
    load_build_script().save_tokenizer(tokenizer, out_dir)
    return str(out_dir)


def end_spawned_rank() -> None:
    """The last line of a `torch.multiprocessing.spawn` worker whose results are written.

    The ranks meet at a barrier first, so that none closes its gloo connections while another still
    reads from them. Then the process leaves with `os._exit(0)`, skipping the interpreter's
    teardown, where gloo's C++ threads can abort a process after a clean run: spawn would report a
    signal instead of exit code 0 (seen once in CI as SIGABRT). A failure in the worker raises
    before this call and is reported as usual.
    """
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def load_tiny_llama(out_dir: str):
    """``(path, tokenizer, model)``: `test_workers_common.build_tiny_llama` saved in `out_dir`, then
    loaded back with sdpa attention (the actor tests' model)."""
    import torch
    from test_workers_common import build_tiny_llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    path = build_tiny_llama(out_dir)
    return (
        path,
        AutoTokenizer.from_pretrained(path),
        AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa"),
    )


@pytest.fixture(scope="session")
def embedded_tokenizer():
    """The embedded default's tokenizer, built in memory by the build script."""
    return load_build_script().build_tokenizer()


@pytest.fixture(scope="session")
def ray_session():
    """Start (once) and yield the `ray` module; shut Ray down at the end of the session."""
    # must be in the environment before Ray starts its daemons, which inherit it
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # idle task workers that Ray would pre-start are of no use to actor tests and cost CPU here
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    import ray

    started_here = False
    if not ray.is_initialized():
        ray.init(
            num_cpus=int(os.environ.get("VERL_TEST_RAY_CPUS", "4")),
            include_dashboard=False,
            logging_level="WARNING",
            _node_ip_address="127.0.0.1",
            object_store_memory=512 * 1024**2,
            runtime_env={"env_vars": {"PYTHONPATH": _test_pythonpath()}},
        )
        started_here = True
    yield ray
    if started_here:
        ray.shutdown()
