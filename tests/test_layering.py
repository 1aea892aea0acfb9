"""The layer rule of DESIGN.md §2: imports point down the layers, never up or sideways.

Every ``import`` under ``verl/`` is parsed (function-local imports included: a lazy import is
still a dependency) and each module is assigned a layer by its path. A module may import its own
layer and the layers listed as below it in ``MAY_IMPORT``. Edges that break the rule today are
listed in ``KNOWN_EXCEPTIONS`` with the reason; the test fails on any new edge and on an exception
that no longer exists (so the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "verl"

# first match wins: most specific prefixes first
LAYER_OF_PREFIX: list[tuple[str, str]] = [
    ("verl.trainer.ppo.core_algos", "algorithms"),
    ("verl.trainer.ppo.algos", "algorithms"),  # the modules behind core_algos
    ("verl.trainer.ppo.mode_names", "algorithms"),  # loss-mode and KL names, torch-free
    ("verl.trainer.config", "config"),
    ("verl.workers.config", "config"),
    ("verl.base_config", "config"),
    ("verl.protocol", "data"),
    ("verl.dataproto", "data"),  # DataProtoFuture, BatchData and row helpers, re-exported by verl.protocol
    ("verl.single_controller", "controller"),
    ("verl.workers.fsdp_workers", "workers"),
    ("verl.workers.separate_rollout", "workers"),
    (
        "verl.workers.worker_common",
        "workers",
    ),  # helpers shared by the worker classes  # the policy worker's weight-sync endpoints
    ("verl.checkpoint_engine", "engines"),  # weight transfer to rollout workers of their own
    ("verl.workers", "engines"),
    ("verl.experimental.agent_loop", "engines"),
    (
        "verl.experimental.one_step_off_policy",
        "trainer",
    ),  # an entry point: a preset of the async trainer  # agent loops drive the rollout engines
    ("verl.experimental", "engines"),
    ("verl.tools", "engines"),
    ("verl.trainer", "trainer"),
    ("verl.utils", "utilities"),
    ("verl", "package"),  # verl/__init__.py
]

# what each layer may import besides itself (DESIGN.md §2, "knows about")
MAY_IMPORT: dict[str, set[str]] = {
    "utilities": set(),
    # config dataclasses check names against the registries (loss modes, KL types)
    "config": {"utilities", "algorithms"},
    "data": {"utilities"},
    "algorithms": {"utilities"},
    "controller": {"utilities", "data"},
    "engines": {"utilities", "config", "data", "algorithms"},
    "workers": {"utilities", "config", "data", "algorithms", "controller", "engines"},
    "trainer": {"utilities", "config", "data", "algorithms", "controller", "engines", "workers"},
    "package": {"utilities", "config", "data", "algorithms", "controller", "engines", "workers", "trainer"},
}

# (importer module, imported module) -> why it is allowed for now (none are left)
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> str:
    for prefix, layer in LAYER_OF_PREFIX:
        if module == prefix or module.startswith(prefix + "."):
            return layer
    raise AssertionError(f"no layer for module {module}")


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str, package: Path) -> bool:
    rel = Path(*name.split(".")[1:])
    return (package / rel).with_suffix(".py").is_file() or (package / rel / "__init__.py").is_file()


def verl_imports(path: Path, package_dir: Path = PACKAGE) -> set[str]:
    """Absolute names of the verl modules imported anywhere in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module_name(path, package_dir)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "verl")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "verl":
                continue
            # `from verl.trainer.ppo import core_algos` depends on the submodule, not the package
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if _is_module(sub, package_dir):
                    found.add(sub)
                else:
                    found.add(target)
    return found


def import_edges() -> dict[tuple[str, str], tuple[str, str]]:
    edges = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        src = module_name(path)
        for dst in verl_imports(path):
            edges[(src, dst)] = (layer_of(src), layer_of(dst))
    return edges


def upward_edges() -> dict[tuple[str, str], tuple[str, str]]:
    return {edge: (a, b) for edge, (a, b) in import_edges().items() if a != b and b not in MAY_IMPORT[a]}


def test_every_module_has_a_layer():
    for path in PACKAGE.rglob("*.py"):
        layer_of(module_name(path))


def test_imports_point_down_the_layers():
    bad = {edge: layers for edge, layers in upward_edges().items() if edge not in KNOWN_EXCEPTIONS}
    lines = [f"{a} ({la}) imports {b} ({lb})" for (a, b), (la, lb) in sorted(bad.items())]
    assert not bad, "imports that point up or sideways (DESIGN.md §2):\n" + "\n".join(lines)


def test_known_exceptions_still_exist():
    stale = sorted(set(KNOWN_EXCEPTIONS) - set(upward_edges()))
    assert not stale, f"fixed edges still listed in KNOWN_EXCEPTIONS (remove them): {stale}"


def test_the_checker_sees_a_planted_upward_import(tmp_path):
    # the rule must be able to fail: an engine importing the trainer is reported
    assert "trainer" not in MAY_IMPORT["engines"]
    assert layer_of("verl.workers.actor.dp_actor") == "engines"
    assert layer_of("verl.trainer.ppo.ray_trainer") == "trainer"
    fake = tmp_path / "verl" / "workers" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def f():\n    from verl.trainer.ppo import ray_trainer\n    from ..trainer import main_ppo\n")
    edges = {("verl.workers.x", dst) for dst in verl_imports(fake, tmp_path / "verl")}
    assert edges == {("verl.workers.x", "verl.trainer.ppo"), ("verl.workers.x", "verl.trainer")}
    assert all(layer_of(dst) == "trainer" and "trainer" not in MAY_IMPORT["engines"] for _, dst in edges)


# groups of modules that import each other today (strongly connected in the import graph), with
# the reason; a new cycle, or a module joining one of these, fails `test_no_new_import_cycles`
KNOWN_CYCLES: dict[frozenset[str], str] = {
    frozenset(
        {
            "verl.experimental.agent_loop",
            "verl.experimental.agent_loop.agent_loop",
            "verl.experimental.agent_loop.single_turn_agent_loop",
            "verl.experimental.agent_loop.tool_agent_loop",
        }
    ): "the package registers its loops on import and the loops import the package's registry",
}


def import_cycles(edges) -> list[frozenset[str]]:
    """The strongly connected groups of more than one module in the graph of `edges`."""
    graph: dict[str, set[str]] = {}
    for src, dst in edges:
        graph.setdefault(src, set()).add(dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[frozenset[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.add(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_new_import_cycles():
    cycles = import_cycles(import_edges())
    new = [sorted(c) for c in cycles if not any(c <= known for known in KNOWN_CYCLES)]
    assert not new, f"modules that import each other (a new import cycle): {new}"
    stale = [sorted(k) for k in KNOWN_CYCLES if not any(c <= k and len(c) > 1 for c in cycles)]
    assert not stale, f"KNOWN_CYCLES lists cycles that are gone (remove them): {stale}"


def test_the_cycle_finder_sees_a_planted_cycle():
    edges = {("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "d2")}
    assert import_cycles(edges) == [frozenset({"a", "b", "c"})]
    # the data layer, the trainer's checkpoint / validation modules and the algorithm registries
    # have none any more
    cycles = import_cycles(import_edges())
    gone = ("verl.protocol", "verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.core_algos")
    assert not [c for c in cycles if any(m in c for m in gone)]


def test_workers_do_not_import_the_trainer_package():
    """The worker and engine modules use the algorithms (core_algos, under verl/trainer/ppo) but
    nothing else of verl/trainer, its config layer included: what both need lives below the workers
    (e.g. `verl/workers/config/batch_plan.py`)."""
    bad = sorted(
        (a, b)
        for (a, b), (la, lb) in import_edges().items()
        if la in ("workers", "engines") and b.startswith("verl.trainer") and lb != "algorithms"
    )
    assert not bad, f"worker/engine modules importing the trainer package: {bad}"
