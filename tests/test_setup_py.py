"""The top-level setup.py works for tools that look for it and takes everything from
pyproject.toml (name, version) and requirements.txt (dependencies): one source."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]


def _setup_py(*args: str, cwd: Path = REPO) -> str:
    out = subprocess.run(
        [sys.executable, str(REPO / "setup.py"), *args], cwd=cwd, capture_output=True, text=True, check=True
    )
    assert "Warning" not in out.stderr, out.stderr  # no deprecated metadata
    return out.stdout


def _requirements() -> list[str]:
    lines = (REPO / "requirements.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


@pytest.mark.slow
def test_version_and_name_come_from_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert _setup_py("--version").strip().splitlines()[-1] == project["version"]
    assert _setup_py("--name").strip().splitlines()[-1] == project["name"]


@pytest.mark.slow
def test_dependencies_come_from_requirements_txt(tmp_path):
    _setup_py("egg_info", "--egg-base", str(tmp_path))
    from packaging.requirements import Requirement

    def parsed(lines):
        return [(r.name, r.specifier) for r in map(Requirement, lines)]

    requires = (tmp_path / "verl.egg-info" / "requires.txt").read_text().split("\n\n")[0].split()
    assert parsed(requires) == parsed(_requirements())
