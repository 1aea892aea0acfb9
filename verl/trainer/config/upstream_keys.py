"""Upstream verl's config surface, and what each of its keys does here.

Every key of upstream's full PPO config is a key of `ppo_trainer.yaml`, with upstream's default.
Each one has exactly one behaviour, decided here key by key (shown in the "here" column of
docs/config_reference.md):

- (a) implemented with upstream's meaning (every key that no rule below names);
- (b) accepted without effect, because it tunes machinery this project does not have or does
  differently: when a run sets it to another value than its default, the start-up log says so
  once, with the reason;
- (c) a feature this project does not have: another value than the default fails before Ray
  starts with `<key>=<value>: <feature> is not available in this verl (available: ...)`.

Spellings that upstream renamed and that its scripts still use are aliases (`ALIASES`): the value
moves to the current key with one deprecation warning naming the new spelling.

`check_upstream_surface(cfg)` applies all of that and returns the config the trainer reads:
aliases moved, the legacy reward keys moved into `reward.*` (verl/trainer/config/reward.py),
upstream-only sections (`global_profiler`, ...) mapped onto the keys our code reads and then
removed, keys of (b)/(c) that no config dataclass holds removed, and the dataclass defaults of
keys that the yaml does not list filled in.

The embedded toy job's settings (`EMBEDDED_PRESET`) apply only when no model is given
(`actor_rollout_ref.model.path` null) or the model is one shipped in verl/assets, each yielding to
a value the user set (`apply_embedded_preset`).
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import functools
import logging
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

from verl.trainer.config.reward import apply_reward_section, migrate_legacy_reward_keys
from verl.workers.config.reward_keys import get_dotted, set_dotted

logger = logging.getLogger(__name__)

YAML_PATH = Path(__file__).with_name("ppo_trainer.yaml")

KIND_NAMES = {"a": "implemented", "b": "no effect here", "c": "not available"}


@dataclass(frozen=True)
class Rule:
    """Behaviour of the keys matching `pattern` (fnmatch on the dotted key; first match wins).

    kind "b": `why` says why the key has no effect. kind "c": `why` names the feature and
    `available` what there is instead; values in `accept` are implemented (a) and not refused;
    with `refuse` set, only those values are refused (other values are checked elsewhere, e.g. a
    rollout engine name against the engines registered at run time).
    """

    pattern: str
    kind: str
    why: str
    available: str = ""
    accept: tuple = ()
    refuse: tuple = ()


RULES_PATH = Path(__file__).with_name("upstream_rules.yaml")


def _load_rules(path: Path = RULES_PATH) -> tuple[Rule, ...]:
    """The rule table (data, one rule a line, in match order) from upstream_rules.yaml."""
    rows = yaml.safe_load(path.read_text())["rules"]
    return tuple(Rule(**{**row, **{k: tuple(row[k]) for k in ("accept", "refuse") if k in row}}) for row in rows)


RULES: tuple[Rule, ...] = _load_rules()

_RULE_CACHE: dict[str, Rule | None] = {}


def rule_for(key: str) -> Rule | None:
    """The first rule matching dotted `key`, or None (behaviour (a))."""
    if key not in _RULE_CACHE:
        _RULE_CACHE[key] = next((r for r in RULES if fnmatch.fnmatchcase(key, r.pattern)), None)
    return _RULE_CACHE[key]


def behaviour(key: str) -> tuple[str, str]:
    """(kind, text) of a key for the reference: kind a, b or c."""
    rule = rule_for(key)
    if rule is None:
        return "a", ""
    if rule.kind == "b":
        return "b", rule.why
    text = f"not available: {rule.why} (available: {rule.available})"
    if rule.accept:
        text = f"implemented for {', '.join(_fmt(v) for v in rule.accept)}; other values " + text
    return "c", text


# ----------------------------------------------------------------------------- aliases
@dataclass(frozen=True)
class Alias:
    """`old` (a key or a subtree prefix) is an older spelling of `new`."""

    old: str
    new: str
    note: str = "upstream renamed it"


ALIASES: tuple[Alias, ...] = (
    Alias("critic.model.fsdp_config", "critic.fsdp"),
    Alias("critic.fsdp_config", "critic.fsdp", "this project's earlier spelling"),
    Alias("reward_model.model.fsdp_config", "reward_model.fsdp_config"),
    Alias("reward_model.model_path", "reward_model.model.path"),
    Alias("reward_model.inference", "reward_model.rollout"),
    Alias("actor_rollout_ref.actor.optim.warmup_style", "actor_rollout_ref.actor.optim.lr_scheduler_type"),
    Alias("critic.optim.warmup_style", "critic.optim.lr_scheduler_type"),
)

# Upstream's "global" micro-batch keys (divided by the data-parallel size to get the per-GPU key).
GLOBAL_MICRO_BATCH_KEYS = (
    ("actor_rollout_ref.actor.ppo_micro_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"),
    (
        "actor_rollout_ref.rollout.log_prob_micro_batch_size",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    ),
    ("critic.ppo_micro_batch_size", "critic.ppo_micro_batch_size_per_gpu"),
    ("critic.forward_micro_batch_size", "critic.forward_micro_batch_size_per_gpu"),
)

# Keys that no config dataclass holds but that stay in the config: read from the raw config
# (actor_rollout_ref.hybrid_engine: by the trainer and verl/trainer/ppo/async_plan.py).
KEPT_KEYS = frozenset({"actor_rollout_ref.hybrid_engine"})

# Sections of upstream's config that no dataclass of ours holds: read here, then removed.
UPSTREAM_ONLY_SECTIONS = ("sandbox_fusion", "distillation", "transfer_queue", "global_profiler", "skip")


# ----------------------------------------------------------------------------- embedded preset
# The embedded toy job (tiny model, toy task; docs/quickstart.md): these settings apply when
# actor_rollout_ref.model.path is null, each one only if the user did not set that key.
EMBEDDED_PRESET: dict[str, Any] = {
    "data.max_prompt_length": 16,
    "data.max_response_length": 8,
    "data.train_batch_size": 32,
    "data.return_raw_chat": False,
    "data.seed": 1,
    "data.filter_overlong_prompts": True,
    "data.dataloader_num_workers": 0,
    "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
    "actor_rollout_ref.actor.use_dynamic_bsz": True,
    "actor_rollout_ref.actor.data_loader_seed": 1,
    "actor_rollout_ref.actor.clip_ratio_low": None,
    "actor_rollout_ref.actor.clip_ratio_high": None,
    "actor_rollout_ref.actor.optim.lr": 3e-5,
    "actor_rollout_ref.actor.fsdp_config.wrap_policy": {},
    "actor_rollout_ref.ref.fsdp_config.wrap_policy": {},
    "actor_rollout_ref.rollout.n": 8,
    "actor_rollout_ref.rollout.enforce_eager": True,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "actor_rollout_ref.rollout.max_num_seqs": 1024,
    "actor_rollout_ref.rollout.engine_kwargs": {},
    "critic.model.enable_gradient_checkpointing": False,
    "critic.data_loader_seed": 1,
    "critic.fsdp.wrap_policy": {},
    "algorithm.filter_groups.metric": "acc",
    # the toy task's rule reward takes microseconds: one reward worker (a Ray actor costs seconds to start)
    "reward.num_workers": 1,
    "trainer.total_epochs": 2,
    "trainer.project_name": "verl",
    "trainer.experiment_name": "default",
    "trainer.logger": ["console", "file"],
    "trainer.n_gpus_per_node": 1,
    "trainer.balance_batch": False,
    "trainer.test_freq": 10,
}


def override_keys(overrides: list[str] | None) -> set[str]:
    """Dotted keys that command-line style overrides set (`k=v`, `+k=v`, `++k=v`, `~k`)."""
    keys = set()
    for item in overrides or []:
        text = str(item).lstrip("~+")
        key = text.split("=", 1)[0].strip()
        if key and not key.startswith("hydra."):
            keys.add(key)
    return keys


EMBEDDED_ASSETS = Path(__file__).resolve().parents[2] / "assets"


def _is_embedded_model(path: Any) -> bool:
    """No model given, or one of the tiny models shipped in verl/assets (the toy jobs' models,
    e.g. the calculator agent's): the toy preset applies."""
    if path is None:
        return True
    try:
        return Path(str(path)).expanduser().resolve().is_relative_to(EMBEDDED_ASSETS)
    except (OSError, ValueError):
        return False


def apply_embedded_preset(cfg: DictConfig, overrides: list[str] | None, always: bool = False) -> DictConfig:
    """Put the embedded toy job's settings into `cfg` (in place) when no model is given or the
    model is one shipped in verl/assets (or `always`, e.g. for a tiny test model).

    A preset key is left alone when the user set it, or a section above it, or a key below it
    (`trainer.logger=[console]`, `actor_rollout_ref.actor.optim={lr: 1e-5}`). Returns `cfg`.
    """
    if not always and not _is_embedded_model(OmegaConf.select(cfg, "actor_rollout_ref.model.path")):
        return cfg
    user = override_keys(overrides)
    with open_dict(cfg):
        for key, value in EMBEDDED_PRESET.items():
            if any(u == key or key.startswith(u + ".") or u.startswith(key + ".") for u in user):
                continue
            OmegaConf.update(cfg, key, copy.deepcopy(value), merge=False, force_add=True)
    return cfg


# ----------------------------------------------------------------------------- overrides
@functools.cache
def _load_yaml() -> dict:
    return OmegaConf.to_container(OmegaConf.load(YAML_PATH), resolve=False)


@functools.cache
def _load_all_defaults() -> dict:
    tree = _yaml_raw()
    _fill_dataclass_defaults(tree)
    return tree


# The yaml and the dataclasses do not change while a process runs, so they are read once (the
# config checks look keys up in them per key); callers get a copy they may edit.
def _yaml_raw() -> dict:
    """ppo_trainer.yaml as plain containers, interpolations not resolved."""
    return copy.deepcopy(_load_yaml())


def _all_defaults() -> dict:
    """The yaml's defaults plus the dataclass defaults of the keys the yaml does not list."""
    return copy.deepcopy(_load_all_defaults())


_MISSING = object()


def _has_path(tree: Any, dotted: str) -> bool:
    return _get(tree, dotted, _MISSING) is not _MISSING


def dataclass_keys() -> set[str]:
    """Dotted keys of every field of the config dataclasses (nested dataclasses included)."""
    out: set[str] = set()
    for prefix, cls in section_types().items():
        _walk_fields(cls, prefix, out)
    return out


def _walk_fields(cls: type, prefix: str, out: set[str]) -> None:
    from verl.utils.config import _dataclass_in

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}"
        out.add(key)
        sub = _dataclass_in(hints.get(f.name))
        if sub is not None:
            _walk_fields(sub, key, out)


def section_types() -> dict[str, type]:
    """Config path -> the dataclass of that section (a copy of `sections.SECTION_DATACLASSES`)."""
    from verl.trainer.config.sections import SECTION_DATACLASSES

    return dict(SECTION_DATACLASSES)


def normalize_overrides(overrides: list[str] | None) -> list[str]:
    """Make both spellings of an override work for keys of this project that upstream's yaml
    lacks (and that ours therefore does not list either).

    - `key=value` for a key the yaml does not list, but a config dataclass (or an alias) does:
      becomes `+key=value` (this project's own docs write e.g. `trainer.time_budget_s=60`);
    - `+key=value` for a key the yaml lists: becomes `key=value`.
    Everything else is passed unchanged (Hydra reports it).
    """
    raw = _yaml_raw()
    known = dataclass_keys() | {a.old for a in ALIASES}
    out = []
    for item in overrides or []:
        text = str(item)
        if text.startswith(("++", "~")) or "=" not in text:
            out.append(text)
            continue
        plus = text.startswith("+")
        key = text.lstrip("+").split("=", 1)[0].strip()
        present = _has_path(raw, key)
        if plus and present:
            out.append(text[1:])
        elif not plus and not present and (key in known or any(key.startswith(k + ".") for k in known)):
            out.append("+" + text)
        else:
            out.append(text)
    return out


# ----------------------------------------------------------------------------- the check
def _leaves(node: Any, prefix: str = ""):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif prefix:
        yield prefix, node


def _get(tree: dict, dotted: str, default: Any = None) -> Any:
    return get_dotted(tree, dotted, default)


_set = set_dotted


def _pop(tree: dict, dotted: str) -> Any:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None
    return node.pop(parts[-1], None) if isinstance(node, dict) else None


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _resolved(tree: dict) -> dict:
    """Resolve interpolations; a tree that cannot be resolved (a missing key) stays raw."""
    try:
        return OmegaConf.to_container(OmegaConf.create(tree), resolve=True)
    except Exception:  # noqa: BLE001 - a dangling interpolation: compare raw values instead
        return tree


def _defaults_in_context(raw_user: dict, keys: list[str], raw_yaml: dict) -> dict:
    """The user's config with every key of `keys` put back to its yaml default, resolved: an
    interpolated default (`${oc.select:trainer.n_gpus_per_node,8}`) follows the user's config."""
    tree = copy.deepcopy(raw_user)
    for section in UPSTREAM_ONLY_SECTIONS:  # a normalised config no longer has them
        if section not in tree and section in raw_yaml:
            tree[section] = copy.deepcopy(raw_yaml[section])
    for key in keys:
        if _has_path(raw_yaml, key):
            _set(tree, key, copy.deepcopy(_get(raw_yaml, key)))
        else:
            _pop(tree, key)
    return _resolved(tree)


_logged_b: set[tuple[str, str]] = set()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (a == b and type(a) is type(b))
    return a == b


def check_upstream_surface(config: Any) -> DictConfig:
    """Apply the key behaviours of this module to `config`; returns the normalised copy.

    Raises ValueError for a (c) key set to a value that is not available here (before Ray
    starts); logs once each (b) key the run sets (and why it has no effect); warns once per
    deprecated spelling used. Idempotent.
    """
    if isinstance(config, DictConfig):
        raw = OmegaConf.to_container(config, resolve=False)
    else:
        raw = copy.deepcopy(dict(config))
    raw.pop("hydra", None)
    raw_yaml = _all_defaults()
    _move_aliases(raw, raw_yaml)
    migrate_legacy_reward_keys(raw)

    user = _resolved(raw)
    leaves = [(k, v) for k, v in _leaves(user) if rule_for(k) is not None]
    base = _defaults_in_context(raw, [k for k, _ in leaves], raw_yaml)
    refused: dict[str, list[tuple[Rule, str, Any]]] = {}
    for key, value in leaves:
        rule = rule_for(key)
        default = _get(base, key, "<unset>")
        if _same(value, default):
            continue
        if rule.kind == "c":
            if rule.accept and any(_same(value, a) for a in rule.accept):
                continue
            if rule.refuse and not any(_same(value, r) for r in rule.refuse):
                continue
            refused.setdefault(rule.why, []).append((rule, key, value))
        elif (key, _fmt(value)) not in _logged_b:
            _logged_b.add((key, _fmt(value)))
            logger.warning("%s=%s has no effect here: %s", key, _fmt(value), rule.why)
    if refused:
        raise ValueError("; ".join(_refusal(items) for items in refused.values()))
    _check_rollout_device(user)
    _log_engine_only_keys(user, raw_yaml)

    _map_reward_section(raw)
    _map_global_micro_batches(raw)
    _map_misc(raw)
    # interpolations into the sections removed below keep the value they have now
    for key, value in list(_leaves(raw)):
        if isinstance(value, str) and any(f"{s}." in value for s in UPSTREAM_ONLY_SECTIONS) and "${" in value:
            _set(raw, key, _plain(_get(user, key)))
    for section in UPSTREAM_ONLY_SECTIONS:
        raw.pop(section, None)
    _strip_unheld(raw)
    _fill_dataclass_defaults(raw)
    return OmegaConf.create(raw)


# rollout keys that only the vllm engine reads
VLLM_ONLY_KEYS = (
    "tensor_model_parallel_size",
    "gpu_memory_utilization",
    "max_num_batched_tokens",
    "max_num_seqs",
    "enforce_eager",
    "free_cache_engine",
    "enable_chunked_prefill",
    "dtype",
)


def _log_engine_only_keys(user: dict, raw_yaml: dict) -> None:
    """With rollout.name=hf, the vllm-only keys the run set are logged as having no effect."""
    if _get(user, "actor_rollout_ref.rollout.name") != "hf":
        return
    embedded = _get(user, "actor_rollout_ref.model.path") is None
    for name in VLLM_ONLY_KEYS:
        key = f"actor_rollout_ref.rollout.{name}"
        value, default = _get(user, key, "<unset>"), _get(raw_yaml, key, "<unset>")
        if embedded and key in EMBEDDED_PRESET and _same(value, EMBEDDED_PRESET[key]):
            continue  # the embedded preset's own value, not the user's
        if not _same(value, default) and (key, _fmt(value)) not in _logged_b:
            _logged_b.add((key, _fmt(value)))
            logger.warning(
                "%s=%s has no effect here: only the vllm rollout reads it (rollout.name=hf)", key, _fmt(value)
            )


def _check_rollout_device(user: dict) -> None:
    """The vllm engine needs a CUDA GPU: say so before Ray starts instead of in a worker."""
    if _get(user, "actor_rollout_ref.rollout.name") != "vllm":
        return
    device = _get(user, "trainer.device", "auto")
    if device == "cuda":
        return
    import torch

    if device == "cpu" or not torch.cuda.is_available():
        raise ValueError(
            "actor_rollout_ref.rollout.name=vllm: the vllm rollout without a CUDA GPU is not available in this verl "
            "(available: actor_rollout_ref.rollout.name=hf, which runs on CPU and GPU)"
        )


def _refusal(items: list[tuple[Rule, str, Any]]) -> str:
    """One message per missing feature: the headline key (a value-restricted key such as
    `strategy` first), then the other keys that need the same feature."""
    items = sorted(items, key=lambda it: (not it[0].accept, it[1]))
    rule, key, value = items[0]
    text = f"{key}={_fmt(value)}: {rule.why} is not available in this verl (available: {rule.available})"
    others = [f"{k}={_fmt(v)}" for _, k, v in items[1:]]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        text += f" (also needed by {shown})"
    return text


def _warn_deprecated(old: str, new: str, note: str) -> None:
    warnings.warn(f"{old} is deprecated ({note}): use {new}", DeprecationWarning, stacklevel=3)
    logger.warning("%s is deprecated (%s): use %s", old, note, new)


def _move_aliases(raw: dict, raw_yaml: dict) -> None:
    """Move values set under an older spelling to the current key. Alias leaves are null in the
    yaml (= not set); a set leaf overrides the current key (a conflict with a current key that the
    user also changed is an error)."""
    for alias in ALIASES:
        if not _has_path(raw, alias.old):
            continue
        value = _pop(raw, alias.old)
        set_leaves = [(k, v) for k, v in _leaves({"x": value}) if v is not None and v != {}]
        if not set_leaves:
            continue
        _warn_deprecated(alias.old, alias.new, alias.note)
        for k, v in set_leaves:
            sub = k[len("x") :]
            target = alias.new + sub
            current = _get(raw, target, "<unset>")
            default = _get(raw_yaml, target, "<unset>")
            if current != "<unset>" and current != default and current != v:
                raise ValueError(
                    f"{alias.old + sub}={_fmt(v)} conflicts with {target}={_fmt(current)}: set only {target}"
                )
            _set(raw, target, v)


def _map_reward_section(raw: dict) -> None:
    """The `reward.*` section (upstream's current keys, the legacy ones already moved into it) back
    onto the keys the driver-side reward code reads (`custom_reward_function.*`, `reward_model.*`)."""
    apply_reward_section(raw)
    (raw.get("reward_model") or {}).pop("num_workers", None)  # reward.num_workers is the key read


def _map_global_micro_batches(raw: dict) -> None:
    """Upstream's deprecated global micro-batch sizes: divided by the data-parallel size into the
    per-GPU key (as upstream does) when the per-GPU key is not set."""
    trainer = raw.get("trainer") or {}
    sizes = [trainer.get("nnodes") or 1, trainer.get("n_gpus_per_node") or 1]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in sizes):
        return  # a mistyped size: validate_config names it; nothing can be divided by it here
    n_workers = sizes[0] * sizes[1]
    for old, new in GLOBAL_MICRO_BATCH_KEYS:
        value = _get(raw, old)
        if value is None:
            continue
        if isinstance(value, str) and value.startswith("${"):
            continue  # an interpolation of another (deprecated) key: handled at its source
        _warn_deprecated(old, new, "a global size, divided by the data-parallel size")
        if _get(raw, new) is None or (isinstance(_get(raw, new), str) and str(_get(raw, new)).startswith("${")):
            _set(raw, new, max(int(value) // n_workers, 1))
        _set(raw, old, None)


def _map_misc(raw: dict) -> None:
    for section in ("actor_rollout_ref.model", "critic.model", "reward_model.model"):
        model = _get(raw, section)
        if isinstance(model, dict) and "trust_remote_code" in model and model["trust_remote_code"] is None:
            model["trust_remote_code"] = False  # upstream's legacy reward_model.model default is null
    data = raw.get("data") or {}
    if "seed" in data and data["seed"] is None:
        data["seed"] = 1  # upstream: null means the default sampler seed
    actor = _get(raw, "actor_rollout_ref.actor") or {}
    pl = actor.get("policy_loss")
    if isinstance(pl, dict):
        # SAPO temperatures: upstream reads them from actor.tau_pos/tau_neg (its yaml) or from
        # policy_loss.* (its scripts append them with +); policy_loss.* wins when given
        for key in ("tau_pos", "tau_neg"):
            if key in actor and key not in pl:
                pl[key] = actor[key]


def _strip_unheld(raw: dict) -> None:
    """Remove (b)/(c) keys (checked above) that no config dataclass holds, and the sections that
    this leaves empty."""
    held = dataclass_keys() | KEPT_KEYS
    dict_fields = [h for h in held if _is_dict_field(h)]
    for key, _ in list(_leaves(raw)):
        if rule_for(key) is None or key in held or any(key.startswith(h + ".") for h in dict_fields):
            continue
        _pop(raw, key)
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        while parent and _get(raw, parent) == {} and parent not in held:
            _pop(raw, parent)
            parent = parent.rsplit(".", 1)[0] if "." in parent else ""


_DICT_FIELDS: set[str] | None = None


def _is_dict_field(key: str) -> bool:
    global _DICT_FIELDS
    if _DICT_FIELDS is None:
        from verl.utils.config import _dataclass_in

        out = set()
        for prefix, cls in section_types().items():
            stack = [(prefix, cls)]
            while stack:
                pre, c = stack.pop()
                hints = typing.get_type_hints(c)
                for f in dataclasses.fields(c):
                    sub = _dataclass_in(hints.get(f.name))
                    if sub is not None:
                        stack.append((f"{pre}.{f.name}", sub))
                    elif "dict" in str(hints.get(f.name)).lower() or "Any" in str(hints.get(f.name)):
                        out.add(f"{pre}.{f.name}")
        _DICT_FIELDS = out
    return key in _DICT_FIELDS


def _plain(value: Any) -> Any:
    """A yaml-able copy (tuples become lists)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return copy.deepcopy(value)


def _fill_dataclass_defaults(raw: dict) -> None:
    """Keys of the config dataclasses that the config lacks (the yaml does not list them) get their
    dataclass default, so code reading the raw config sees every key."""
    from verl.utils.config import _dataclass_in

    def fill(node: dict, cls: type) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            sub = _dataclass_in(hints.get(f.name))
            if f.name not in node:
                if f.default is not dataclasses.MISSING:
                    value = f.default
                elif f.default_factory is not dataclasses.MISSING:
                    value = f.default_factory()
                else:
                    continue
                if dataclasses.is_dataclass(value):
                    value = dataclasses.asdict(value)
                node[f.name] = _plain(value)
            elif sub is not None and isinstance(node[f.name], dict):
                fill(node[f.name], sub)

    for prefix, cls in section_types().items():
        node = _get(raw, prefix)
        if isinstance(node, dict):
            fill(node, cls)
