"""docs/config_reference.md is generated from the yaml and the dataclasses and must be current."""

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_config_reference", REPO / "scripts" / "gen_config_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_config_reference_is_current():
    gen = load_generator()
    assert (REPO / "docs" / "config_reference.md").read_text() == gen.generate(), (
        "docs/config_reference.md is out of date: run python scripts/gen_config_reference.py"
    )


def test_every_yaml_key_is_documented_with_a_meaning():
    from omegaconf import OmegaConf

    gen = load_generator()
    text = gen.generate()
    raw = OmegaConf.to_container(OmegaConf.load(gen.YAML), resolve=False)
    rows = {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(r"^\| `([\w.]+)` \| `[^`]*` \| (.*?) \| (.*) \|$", text, re.M)
    }
    for key, _ in gen.leaves(raw, ""):
        assert key in rows, f"{key} missing from the reference"
        where, meaning = rows[key]
        assert where.strip(), f"{key} has no 'here' behaviour"
        # a key without effect or not available is explained by its 'here' text; an implemented one needs a meaning
        if where == "implemented" or where.startswith("implemented ("):
            assert meaning.strip(), (
                f"{key} has no meaning: add a yaml comment, a dataclass field comment or a glossary entry"
            )
