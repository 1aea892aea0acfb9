"""Every config key that docs/config_reference.md calls *implemented* is read by some code under
verl/ besides its own dataclass (a key that only its definition and validation touch is accepted
and then ignored: the class of bug where `actor.tau_pos` was silently dropped).

The check is static, over the source of verl/: a key `a.b.leaf` counts as read where `leaf` is read
as an attribute (`cfg.leaf`), or appears as a string argument or subscript (`cfg["leaf"]`,
`config_get(cfg, "leaf")`, `_get(cfg, "a.b.leaf")`), anywhere but inside the class body of the
dataclass that holds it. Not checked here, with the reason:
- keys *implemented for* only some values (the others are refused before Ray starts: the accepted
  value is the behaviour there is) and deprecated spellings (mapped onto the key they name);
- `upstream_keys.py` counts only for the upstream-only sections it translates (`reward.*`, ...);
- `EXEMPT`: keys read by code outside verl/.
It cannot tell whether the value read is the one that wins (the SAPO case had a read); the
tests of each feature do that.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

# key -> why nothing under verl/ has to read it
EXEMPT = {
    "actor_rollout_ref.actor.policy_loss.extra": "free-form knobs read by user-registered losses "
    "(docs/examples/custom_policy_loss.py)",
    "ray_kwargs.ray_init.runtime_env.py_executable": "an entry of ray_kwargs.ray_init, passed whole to ray.init",
    "hydra.job.chdir": "read by Hydra itself",
}

# the module that maps upstream's keys onto ours: its reads count only for the sections it translates
MAPPING_MODULE = "verl/trainer/config/upstream_keys.py"
ROW = re.compile(r"^\| `([^`]+)` \| `[^|]*` \| (implemented[^|]*) \|", re.M)


def _generator():
    spec = importlib.util.spec_from_file_location("gen_config_reference", REPO / "scripts" / "gen_config_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def implemented_keys() -> list[str]:
    """Keys the reference calls implemented for every value (see the module docstring)."""
    text = (REPO / "docs" / "config_reference.md").read_text()
    return [
        key for key, here in ROW.findall(text) if not here.startswith("implemented for") and "deprecated" not in here
    ]


def _reads() -> tuple[dict, dict]:
    """(attribute name -> {(module, enclosing class)}, string argument -> {(module, class)})."""
    attrs: dict[str, set] = {}
    strings: dict[str, set] = {}
    for path in sorted((REPO / "verl").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()

        def visit(node, cls, rel=rel):
            for child in ast.iter_child_nodes(node):
                inner = child.name if isinstance(child, ast.ClassDef) else cls
                if isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Load):
                    attrs.setdefault(child.attr, set()).add((rel, cls))
                if isinstance(child, ast.Call):
                    args = [*child.args, *(k.value for k in child.keywords)]
                elif isinstance(child, ast.Subscript):
                    args = [child.slice]
                else:
                    args = []
                for arg in args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        strings.setdefault(arg.value, set()).add((rel, cls))
                visit(child, inner)

        visit(ast.parse(path.read_text()), None)
    return attrs, strings


def unread_keys() -> list[str]:
    from verl.trainer.config.upstream_keys import UPSTREAM_ONLY_SECTIONS

    gen = _generator()
    owners: dict = {}
    for prefix, cls in gen.section_types().items():
        gen.walk_dataclass(cls, prefix, owners)
    attrs, strings = _reads()
    missing = []
    for key in implemented_keys():
        leaf = key.rsplit(".", 1)[-1]
        home = None
        if key in owners:
            cls = owners[key][0]
            home = (Path(inspect.getsourcefile(cls)).resolve().relative_to(REPO).as_posix(), cls.__name__)
        where = set(attrs.get(leaf, ())) | set(strings.get(leaf, ()))
        for text, places in strings.items():
            if "." in text and (key.endswith("." + text) or key == text or text.endswith("." + leaf)):
                where |= places
        if key.split(".")[0] not in UPSTREAM_ONLY_SECTIONS:
            where = {(rel, cls) for rel, cls in where if rel != MAPPING_MODULE}
        if not (where - {home}):
            missing.append(key)
    return missing


@pytest.mark.slow
def test_every_implemented_key_is_read_by_code():
    keys = implemented_keys()
    assert len(keys) > 250  # the reference's table was parsed
    unread = sorted(set(unread_keys()) - set(EXEMPT))
    assert not unread, (
        f"config keys documented as implemented that no code under verl/ reads: {unread}; wire them up or "
        "classify them in verl/trainer/config/upstream_rules.yaml (kind b/c, with the reason)"
    )


@pytest.mark.slow
def test_exemptions_are_still_needed():
    keys = set(implemented_keys())
    unread = set(unread_keys())
    stale = sorted(k for k in EXEMPT if k not in keys or k not in unread)
    assert not stale, f"EXEMPT lists keys that are read now or no longer implemented: {stale}"


@pytest.mark.slow
def test_the_scan_sees_a_read_and_a_dataclass_only_touch():
    attrs, strings = _reads()
    # ActorConfig.clip_ratio_c is read by the policy losses, outside ActorConfig
    assert any(cls != "ActorConfig" for _, cls in strings.get("clip_ratio_c", ())) or attrs.get("clip_ratio_c")
    # the key that only its dataclass touches: RolloutConfig.mode (rollout.mode has no effect here)
    assert {cls for _, cls in attrs.get("mode", ())} <= {"RolloutConfig"}
