"""The size limits of CONTRIBUTING.md, checked: no module under verl/ over 800 lines, no function
(package or scripts) over 80 lines, counted from `def` to its last line, docstring included.

A file or function that grows past them is a sign it holds two concerns; split it rather than
raising the limit."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 80


def _python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py"))


def long_functions(paths: list[Path], limit: int, root: Path = REPO) -> list[str]:
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_package_module_is_over_800_lines():
    too_long = [
        f"{p.relative_to(REPO)} ({n} lines)"
        for p in _python_files("verl")
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    ]
    assert not too_long, f"modules over {MAX_FILE_LINES} lines (split them along their concerns): {too_long}"


def test_no_function_is_over_80_lines():
    found = long_functions(_python_files("verl", "scripts"), MAX_FUNCTION_LINES)
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines: {found}"


def test_the_function_counter_counts_def_to_last_line(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(80))  # def + 80 lines = 81
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert long_functions([tmp_path / "m.py"], 80, root=tmp_path) == ["m.py:1 long (81 lines)"]
    assert long_functions([tmp_path / "m.py"], 81, root=tmp_path) == []
