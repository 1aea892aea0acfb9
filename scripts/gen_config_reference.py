#!/usr/bin/env python
"""Generate docs/config_reference.md: every key of verl/trainer/config/ppo_trainer.yaml with its
default and meaning.

The meaning of a key is, in order of preference: the comment on its line in the yaml, the
comment on (or just above) the field in its config dataclass, the `- \\`key\\`: ...` bullet of the
dataclass docstring. Keys that a dataclass accepts but the yaml does not list (and the other way
round) are shown too, so the reference is complete. A test (tests/trainer/config/test_config_reference.py)
fails when the committed file differs from what this script produces.

Usage: python scripts/gen_config_reference.py [--check]
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
import textwrap
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

YAML = REPO / "verl" / "trainer" / "config" / "ppo_trainer.yaml"
OUT = REPO / "docs" / "config_reference.md"


def section_types() -> dict[str, type]:
    """Config path -> dataclass of that section (children are found through type hints)."""
    from verl.trainer.config.upstream_keys import section_types as types

    return types()


def here(key: str) -> str:
    """The "here" column: what the key does in this project (verl/trainer/config/upstream_keys.py)."""
    from verl.trainer.config import upstream_keys

    for alias in upstream_keys.ALIASES:
        if key == alias.old or key.startswith(alias.old + "."):
            return f"alias of `{alias.new + key[len(alias.old) :]}` ({alias.note}; deprecation warning)"
    for old, new in upstream_keys.GLOBAL_MICRO_BATCH_KEYS:
        if key == old:
            return f"implemented (deprecated: divided by the data-parallel size into `{new}`)"
    kind, text = upstream_keys.behaviour(key)
    if kind == "a":
        return "implemented"
    if kind == "b":
        return f"no effect: {text}"
    return text


# Meanings of keys whose dataclass carries no comment for them, looked up by the longest matching
# suffix of the dotted key (so one entry covers e.g. every `fsdp_config.param_offload`).
GLOSSARY = {
    # model
    "custom_cls.path": "a .py file or module defining your dataset class (null: RLHFDataset)",
    "custom_cls.name": "the class name in that file",
    "model.path": "Hugging Face model directory (or hub name)",
    "critic.model.path": "the value model's initial weights (default: the actor's model, with a fresh value head)",
    "reward_model.model.path": "the reward model (a sequence-classification checkpoint)",
    "model.custom_chat_template": "a jinja chat template replacing the tokenizer's",
    "model.external_lib": (
        "a module or .py file imported in every process before the model is built (e.g. one that "
        "registers a policy loss)"
    ),
    "model.override_config": "entries that override the model's config.json (e.g. dropout)",
    "model.enable_gradient_checkpointing": "recompute activations in backward (less memory, more compute)",
    "model.trust_remote_code": "allow model/tokenizer code shipped with the checkpoint",
    # engines
    "strategy": "training backend: fsdp (FSDP2, the only one here; fsdp2 is an alias)",
    "fsdp_config.mixed_precision.param_dtype": "compute dtype of parameters (null: bf16 on CUDA, fp32 on CPU)",
    "checkpoint.save_contents": "what a checkpoint holds: model, optimizer, extra (scheduler, RNG)",
    "ulysses_sequence_parallel_size": "sequence parallelism (not implemented: must be 1)",
    # batch sizes (docs/batch_sizes.md)
    "ppo_micro_batch_size_per_gpu": (
        "sequences per forward/backward pass on one worker (gradient accumulation inside a mini-batch)"
    ),
    "forward_micro_batch_size_per_gpu": "sequences per forward pass on one worker when computing values",
    "log_prob_micro_batch_size_per_gpu": "sequences per forward pass on one worker when computing log-probs",
    "micro_batch_size_per_gpu": "sequences per forward pass on one worker",
    "use_dynamic_bsz": "form micro-batches by a token budget instead of a fixed number of sequences",
    "log_prob_use_dynamic_bsz": "form log-prob micro-batches by a token budget",
    "ppo_max_token_len_per_gpu": "token budget of one micro-batch per worker with use_dynamic_bsz",
    "forward_max_token_len_per_gpu": "token budget of one forward micro-batch per worker with use_dynamic_bsz",
    "log_prob_max_token_len_per_gpu": "token budget of one log-prob micro-batch per worker with use_dynamic_bsz",
    "critic.ppo_mini_batch_size": "prompts per critic optimizer step (x rollout.n sequences)",
    "ppo_epochs": "passes over each batch (each pass: all mini-batches)",
    "shuffle": "shuffle the batch before splitting it into mini-batches",
    "data_loader_seed": "seed of that shuffle",
    "grad_clip": "gradient-norm clipping threshold",
    # actor loss
    "actor.clip_ratio_c": "dual-clip bound for negative advantages (> 1)",
    "policy_loss.loss_mode": (
        "policy loss from the registry: vanilla, gspo, sapo, cispo, reinforce, clip_cov, kl_cov, "
        "gpg, geo_mean or one you register (docs/algorithms.md)"
    ),
    "policy_loss.clip_cov_lb": "clip_cov: lower covariance bound of the clipped tokens",
    "policy_loss.clip_cov_ub": "clip_cov: upper covariance bound of the clipped tokens",
    "policy_loss.ppo_kl_coef": "kl_cov: coefficient of the KL penalty on the selected tokens",
    "policy_loss.tau_neg": "sapo: soft-gate temperature for negative advantages",
    "loss_agg_mode": (
        "how token losses are averaged: token-mean, seq-mean-token-mean, seq-mean-token-sum, "
        "seq-mean-token-sum-norm, prompt-mean"
    ),
    "actor.entropy_coeff": "weight of the entropy bonus (loss -= coeff * entropy)",
    "actor.entropy_from_logits_with_chunking": "compute the entropy in chunks (less memory for large vocabularies)",
    "actor.use_kl_loss": (
        "add kl_loss_coef * KL(policy to reference) to the loss (GRPO style; needs the reference policy)"
    ),
    "actor.kl_loss_coef": "weight of the KL loss",
    "actor.kl_loss_type": (
        "KL estimator of the KL loss: kl/k1, abs, mse/k2, low_var_kl/k3 (+ suffix: straight-through gradient), full"
    ),
    # optimizer
    "optim.lr": "learning rate (AdamW)",
    "optim.lr_warmup_steps": "linear warm-up steps (-1: use lr_warmup_steps_ratio)",
    "optim.lr_warmup_steps_ratio": "warm-up as a fraction of the training steps",
    "optim.total_training_steps": "filled in by the trainer (the run's step count)",
    "optim.weight_decay": "AdamW weight decay",
    "optim.betas": "AdamW betas",
    "optim.eps": "AdamW epsilon",
    # rollout
    "rollout.name": "generation engine: hf (Hugging Face generate on the actor's weights, CPU and GPU) or vllm (GPU)",
    "rollout.mode": (
        "sync or async; here both generate a step's whole batch in one engine call (hf, vllm in-process), "
        "so they give the same result"
    ),
    "rollout.n": "responses sampled per prompt (the group size of GRPO-style estimators)",
    "rollout.do_sample": "sample (true) or greedy (false)",
    "rollout.temperature": "sampling temperature (log-probs are computed at the same temperature)",
    "rollout.top_k": "top-k sampling (-1: off)",
    "rollout.top_p": "nucleus sampling (1.0: off)",
    "rollout.prompt_length": "prompt tokens (follows data.max_prompt_length)",
    "rollout.response_length": "response tokens (follows data.max_response_length; must equal it)",
    "rollout.ignore_eos": "keep generating after EOS up to response_length",
    "rollout.calculate_log_probs": (
        "return the engine's log-probs (rollout_log_probs) for mismatch metrics and rollout correction"
    ),
    "rollout.tensor_model_parallel_size": "vllm: tensor parallel size",
    "rollout.max_num_batched_tokens": "vllm: token budget of one engine step",
    "rollout.max_num_seqs": "vllm: sequences per engine step",
    "rollout.enforce_eager": "vllm: no CUDA graphs",
    "rollout.free_cache_engine": "vllm: free the KV cache between generations",
    "rollout.enable_chunked_prefill": "vllm: chunked prefill",
    "rollout.engine_kwargs": "extra engine arguments (vllm)",
    "val_kwargs.do_sample": "validation: sample (true) or greedy (false)",
    "val_kwargs.temperature": "validation temperature",
    "val_kwargs.top_k": "validation top-k (-1: off)",
    "val_kwargs.top_p": "validation top-p",
    "val_kwargs.n": "responses per validation prompt (n > 1 adds best@n and maj@n metrics)",
    # critic
    "critic.cliprange_value": "value clipping range around the old values",
    # reward model
    "reward_model.enable": "score responses with a reward-model worker (rm_scores) instead of the rule/custom function",
    "reward_model.max_length": "truncate reward-model inputs to this many tokens (null: no limit)",
    "reward_model.reward_manager": "reward manager: naive, batch, dapo, prime, or path/to/file.py:ClassName",
    "reward_model.reward_kwargs": "options of the reward manager (see the table at the end)",
    # algorithm
    "algorithm.adv_estimator": (
        "advantage estimator from the registry (gae, grpo, rloo, reinforce_plus_plus, remax, "
        "opo, gpg, norm, ... or one you register)"
    ),
    "algorithm.gamma": "discount factor",
    "algorithm.lam_kwargs": "arguments of a lambda function given in algorithm.lam",
    "algorithm.gae_timestep_unit": "GAE step: token, or turn (multi-turn: one step per generated turn)",
    "algorithm.norm_adv_by_std_in_grpo": "GRPO divides by the group std (false: Dr.GRPO)",
    "algorithm.use_kl_in_reward": (
        "subtract beta * KL(old policy to reference) from the token rewards (PPO style; needs the reference policy)"
    ),
    "algorithm.kl_penalty": "KL estimator of the in-reward penalty: kl/k1, abs, mse/k2, low_var_kl/k3, full",
    "algorithm.adv_norm": "a NormConfig applied to the advantages (see the table below); null: the estimator's own",
    "algorithm.reward_norm": (
        "a NormConfig applied to the outcome rewards before the estimator (norm estimator); null: off"
    ),
    "kl_ctrl.type": "fixed or adaptive KL coefficient",
    "kl_ctrl.kl_coef": "(initial) KL coefficient beta",
    "kl_ctrl.horizon": "adaptive: horizon of the update",
    "kl_ctrl.target_kl": "adaptive: target KL",
    "filter_groups.enable": "DAPO dynamic sampling: drop groups whose responses all have the same metric",
    "filter_groups.metric": (
        "per-response value that must vary within a group: acc (falls back to the score), score, "
        "or a reward extra-info column"
    ),
    "filter_groups.max_num_gen_batches": (
        "at most this many generation rounds per step (0: no cap); at the cap the step trains on what it has"
    ),
    "filter_groups.keep_generating": (
        "generate more rounds until data.train_batch_size groups are kept (false: train on the survivors of one round)"
    ),
    "rollout_correction.rollout_is_threshold": "truncation C of the importance weights",
    "rollout_correction.rollout_rs_threshold": "upper bound of the rejection test",
    "rollout_correction.rollout_rs_threshold_lower": "lower bound of the rejection test (ratio modes)",
    # ray
    "ray_init.num_cpus": "CPUs of the private local Ray (null: all of this machine)",
    "ray_init.address": "join this Ray cluster (auto or host:port); null: a private local Ray (or RAY_ADDRESS)",
    "fsdp_config.wrap_policy.min_num_params": (
        "without a decoder-layer class: wrap every child module with at least "
        "this many parameters (0: the decoder layers)"
    ),
    "fsdp.wrap_policy.min_num_params": (
        "without a decoder-layer class: wrap every child module with at least this many "
        "parameters (0: the decoder layers)"
    ),
    "fsdp.mixed_precision.param_dtype": "compute dtype of parameters (null: bf16 on CUDA, fp32 on CPU)",
    "actor.tau_neg": "sapo: soft-gate temperature for negative advantages (policy_loss.tau_neg wins when given)",
    "actor.tau_pos": "sapo: soft-gate temperature for positive advantages (policy_loss.tau_pos wins when given)",
    "actor.model_config": "upstream's model-config object of the actor (set by its workers; null here)",
    "ref.entropy_from_logits_with_chunking": "compute entropy in chunks (the reference policy computes none here)",
    "rollout.engine_kwargs.vllm": "extra vllm engine arguments",
    "rollout.engine_kwargs.hf": "extra hf engine arguments",
    "critic.forward_micro_batch_size": "upstream's deprecated global size of a forward micro-batch",
    "reward.custom_reward_function.path": (
        "upstream's current spelling of custom_reward_function.path (used when that is null)"
    ),
    "reward.custom_reward_function.name": (
        "upstream's current spelling of custom_reward_function.name (used when that is null)"
    ),
    "reward.reward_manager.source": (
        "register: reward.reward_manager.name is a registered name; importlib: load module.path:module.name"
    ),
    "reward.reward_manager.name": "upstream's current spelling of reward_model.reward_manager (used when that is null)",
    "reward.reward_model.model_path": "upstream's current spelling of reward_model.model.path (used when that is null)",
    "reward.reward_model.enable": "upstream's current spelling of reward_model.enable (used when that is null)",
    "rollout_correction.loss_type": "bypass mode's loss: ppo_clip or reinforce (read by the rollout-correction losses)",
    "rollout_correction.bypass_mode": "use the rollout log-probs as old log-probs (no old-policy forward pass)",
    "rollout_correction.rollout_is_batch_normalize": "rescale IS weights to mean 1 over the batch",
    "algorithm.use_pf_ppo": "PF-PPO: reweight the batch by reward before the update",
    "pf_ppo.reweight_method": "PF-PPO weighting: pow, max_min or max_random",
    "pf_ppo.weight_pow": "PF-PPO: exponent of the pow weighting",
    "algorithm.gdpo_reward_keys": "GDPO: reward extra-info keys normalised per group and combined",
    "algorithm.gdpo_reward_weights": "GDPO: weights of those keys (null: equal)",
    "trainer.cpus_per_worker": "CPU share of one worker process; null: the node's CPUs shared out",
    "trainer.torch_threads_per_worker": "torch intra-op threads of a worker; null: its CPU share, at least 1",
    "trainer.worker_backend": (
        "auto | ray | local: local runs a one-worker CPU job's worker inside the driver process (no Ray); "
        "auto picks it when nothing needs Ray"
    ),
    "trainer.plot": "write a PNG of reward and validation accuracy at the end",
    "ray_init.runtime_env": "Ray runtime environment of the workers (passed to ray.init; e.g. env_vars)",
    "ray_init.runtime_env.py_executable": "Ray runtime_env py_executable (passed to ray.init when set)",
    # NormConfig fields (printed bare)
    "mean_level": "subtract the mean over the group, the batch, or nothing (null)",
    "std_level": "divide by the std over the group, the batch, or nothing (null)",
    "mean_leave1out": "the mean of the other responses of the group (RLOO)",
    "std_unbiased": "unbiased (n-1) std",
    "eps": "added to the std",
}


def glossary(key: str) -> str:
    parts = key.split(".")
    for i in range(len(parts)):
        text = GLOSSARY.get(".".join(parts[i:]))
        if text:
            return text
    return ""


# keys without a dataclass of their own
EXTRA_DOCS = {
    "actor_rollout_ref": "The policy: model, actor (training), rollout (generation) and reference policy, colocated.",
    "actor_rollout_ref.hybrid_engine": (
        "Actor and rollout share one process and the same weights (the only supported mode)."
    ),
    "hydra.job.chdir": (
        "Hydra stays in the launch directory, so relative paths are relative to where you ran the command."
    ),
}


# ----------------------------------------------------------------------------- yaml comments
def yaml_comments(path: Path) -> dict[str, str]:
    """Dotted key -> the comment on its line (block-style yaml as written in this repo)."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        m = re.match(r"^(\s*)([A-Za-z_][\w]*)\s*:(.*)$", raw)
        if not m:
            continue
        indent, key, rest = len(m.group(1)), m.group(2), m.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key])
        comment = ""
        if "#" in rest:
            value, _, comment = rest.partition(" #")
            if not _:
                value, _, comment = rest.partition("#")
        if comment.strip():
            out[dotted] = comment.strip()
        stack.append((indent, key))
    return out


# ----------------------------------------------------------------------------- dataclass docs
def _docstring_bullets(cls: type) -> dict[str, str]:
    doc = inspect.getdoc(cls) or ""
    out: dict[str, str] = {}
    current = None
    for line in doc.splitlines():
        m = re.match(r"^\s*- `([\w.]+)`(?: / `([\w.]+)`)*[^:]*:\s*(.*)$", line)
        if m:
            names = re.findall(r"`([\w.]+)`", line.split(":", 1)[0])
            text = m.group(3).strip()
            for n in names:
                out[n.split(".")[-1]] = text
            current = names
        elif current and line.startswith("  ") and line.strip():
            for n in current:
                out[n.split(".")[-1]] += " " + line.strip()
        else:
            current = None
    return out


def _field_comments(cls: type) -> dict[str, str]:
    """Comments on a field's line or directly above it in the class body."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    src = textwrap.dedent("".join(lines))
    src_lines = src.splitlines()
    tree = ast.parse(src)
    out: dict[str, str] = {}
    body = tree.body[0].body
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            line = src_lines[node.lineno - 1]
            text = ""
            if "#" in line:
                text = line.split("#", 1)[1].strip()
            above = []
            i = node.lineno - 2
            while i >= 0 and src_lines[i].strip().startswith("#"):
                above.insert(0, src_lines[i].strip().lstrip("#").strip())
                i -= 1
            if above:
                text = " ".join(above) + (f" ({text})" if text else "")
            if text:
                out[node.target.id] = text
    return out


def dataclass_docs(cls: type) -> dict[str, str]:
    docs = _docstring_bullets(cls)
    docs.update(_field_comments(cls))
    return docs


def _dataclass_in(tp):
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def walk_dataclass(cls: type, prefix: str, out: dict[str, tuple[type, str]]) -> None:
    """Dotted key -> (owning dataclass, field name), recursively."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}"
        out[key] = (cls, f.name)
        sub = _dataclass_in(hints.get(f.name))
        if sub is not None:
            walk_dataclass(sub, key, out)


def _default_of(cls: type, name: str):
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return value.to_dict() if hasattr(value, "to_dict") else value
    return "(required)"


# ----------------------------------------------------------------------------- rendering
def fmt(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict) and not value:
        return "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    text = str(value)
    return text.replace("|", "\\|")


def leaves(node, prefix: str):
    """(dotted key, value) of every leaf of the yaml (an empty dict is a leaf)."""
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else k)
    else:
        yield prefix, node


def _meaning_lookup(comments: dict[str, str], owners: dict[str, tuple[type, str]]):
    """The function giving the *meaning* column of a key: yaml comment, then EXTRA_DOCS, then the owning
    dataclass's field doc, then the suffix glossary."""
    docs_cache: dict[type, dict[str, str]] = {}

    def meaning(key: str) -> str:
        if key in comments:
            return comments[key]
        if key in EXTRA_DOCS:
            return EXTRA_DOCS[key]
        if key in owners:
            cls, name = owners[key]
            if cls not in docs_cache:
                docs_cache[cls] = dataclass_docs(cls)
            if docs_cache[cls].get(name):
                return docs_cache[cls][name]
        from verl.trainer.config.upstream_keys import rule_for

        if rule_for(key) is not None and key.startswith(("reward_model.rollout.", "reward.")):
            return ""  # the suffix glossary describes the actor's rollout, not these; "here" explains them
        return glossary(key)

    return meaning


def _rows_by_section(raw: dict, owners: dict[str, tuple[type, str]], meaning) -> dict[str, list[tuple]]:
    """Table rows (key, default, here, meaning) per top-level section: every yaml leaf, then the dataclass
    fields the yaml does not list."""
    from omegaconf import OmegaConf

    rows_by_section: dict[str, list[tuple[str, str, str]]] = {}
    seen = set()
    for key, value in leaves(raw, ""):
        seen.add(key)
        section = key.split(".")[0]
        rows_by_section.setdefault(section, []).append((key, fmt(value), here(key), meaning(key)))
    # dataclass fields the yaml does not list (reachable through a section that the yaml has)
    for key, (cls, name) in owners.items():
        if key in seen or any(s.startswith(key + ".") for s in seen):
            continue
        parent = key.rsplit(".", 1)[0]
        parent_value = OmegaConf.select(OmegaConf.create(raw), parent, default="__missing__")
        if parent_value is None:
            continue  # e.g. algorithm.reward_norm: null; its fields are listed under the dataclass below
        if _dataclass_in(typing.get_type_hints(cls).get(name)) is not None:
            continue
        section = key.split(".")[0]
        rows_by_section.setdefault(section, []).append(
            (key, fmt(_default_of(cls, name)), "implemented (not in upstream's yaml: append with `+`)", meaning(key))
        )
    return rows_by_section


def _intro_lines() -> list[str]:
    """The page title, the legend of the *here* column, the embedded preset table and the divergences."""
    from verl.trainer.config.upstream_keys import EMBEDDED_PRESET

    return [
        "# Configuration reference",
        "",
        "<!-- generated by scripts/gen_config_reference.py from verl/trainer/config/ppo_trainer.yaml and the config",
        "     dataclasses; do not edit by hand: run `python scripts/gen_config_reference.py` -->",
        "",
        "Every key of `python -m verl.trainer.main_ppo` with its default, what it does here, and its meaning.",
        "The yaml holds every key of upstream verl's full PPO config with upstream's nesting and defaults.",
        "Override any key on the command line (`data.train_batch_size=64`); add a key that the yaml does not",
        "list with a `+` prefix (`+reward_model.reward_kwargs.error_score=-1`; for this project's own keys",
        "`python -m verl.trainer.main_ppo` adds the `+` itself). `${...}` defaults follow another key. Each",
        "section is converted into its dataclass before anything starts: an unknown key or a bad value fails",
        "at once with a message naming it. Batch sizes are explained in [batch_sizes.md](batch_sizes.md).",
        "",
        "The column *here* says what each key does in this project:",
        "",
        "- **implemented**: upstream's meaning;",
        "- **no effect**: accepted, and without effect because it tunes machinery this project does not have",
        "  or does differently; a run that sets it to another value logs that once at start, with the reason;",
        "- **not available**: a feature this project does not have; another value than the default (or than",
        "  the values listed as implemented) fails before Ray starts with",
        "  `<key>=<value>: <feature> is not available in this verl (available: ...)`;",
        "- **alias**: an older upstream spelling, moved to the current key with a deprecation warning.",
        "",
        "**Embedded preset.** With `actor_rollout_ref.model.path` null the embedded toy job runs, and these",
        "settings replace the defaults below, each only when you did not set that key:",
        "",
        "| key | embedded preset |",
        "| --- | --- |",
        *[f"| `{k}` | `{fmt(v)}` |" for k, v in EMBEDDED_PRESET.items()],
        "",
        "**Divergences from upstream's defaults** (deliberate): `actor_rollout_ref.model.path`, `data.train_files`",
        "and `data.val_files` are null (the embedded job) instead of upstream's example paths;",
        "`actor_rollout_ref.rollout.name` is `hf` (upstream: required, no default); `trainer.device` is `auto`",
        "(upstream: `cuda`); `critic.model.path` follows the actor's model. The LoRA keys (`lora_rank`,",
        "`lora_alpha`, `target_modules`, `exclude_modules`, `lora_adapter_path`, `lora.*`) are not listed yet.",
        "",
    ]


def _norm_lines() -> list[str]:
    """The table of `algorithm.reward_norm` / `algorithm.adv_norm` (null in the yaml, a dataclass when set)."""
    from verl.trainer.config import NormConfig

    norm_docs = dataclass_docs(NormConfig)
    out = [
        "## `algorithm.reward_norm` / `algorithm.adv_norm` (when set)",
        "",
        inspect.getdoc(NormConfig).splitlines()[0],
        "",
        "| key | default | meaning |",
        "| --- | --- | --- |",
    ]
    for f in dataclasses.fields(NormConfig):
        out.append(
            f"| `{f.name}` | `{fmt(_default_of(NormConfig, f.name))}` | {norm_docs.get(f.name) or glossary(f.name)} |"
        )
    out.append("")
    return out


def _reward_kwargs_lines() -> list[str]:
    """The table of the reward manager options (`reward_model.reward_kwargs.*`)."""
    return [
        "## Reward manager options (`reward_model.reward_kwargs.*`)",
        "",
        "Passed to the constructor of the reward manager named by `reward_model.reward_manager`;",
        "an option the manager does not take fails before training starts.",
        "",
        "| option | managers | default | meaning |",
        "| --- | --- | --- | --- |",
        "| `error_score` | all | `0.0` | score of a response whose scoring failed: raised, timed out, returned NaN/inf "
        "or a non-number (counted in `reward/score_errors`); `null` stops the run with the error |",
        "| `truncation_penalty` | all | `null` | when set, a response without EOS (cut by `data.max_response_length`) "
        "gets this score (the EOS trick) |",
        "| `eos_token_id` | all | tokenizer's | token id(s) that end a response, for truncation detection |",
        "| `overlong_buffer_cfg` | dapo | `null` | `{enable, len, penalty_factor, log}`: soft overlong penalty, 0 up "
        "to `max_response_length - len`, then linear down to `-penalty_factor` |",
        "| `max_resp_len` | dapo | `data.max_response_length` | length limit used by the overlong penalty |",
        "| `timeout` | all | `30.0` (`batch`: `300.0`) | seconds one scoring call may run; a longer call is cut, "
        "scored `error_score` and counted in `reward/score_timeouts`; `null`: no limit (not for prime) |",
        "| `num_processes` | prime | `4` | scoring worker processes (a call past `timeout` has its process "
        "killed and replaced) |",
        "| any other | batch | | passed to every call of the batched scoring function |",
        "",
    ]


def generate() -> str:
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(YAML), resolve=False)
    comments = yaml_comments(YAML)
    owners: dict[str, tuple[type, str]] = {}
    for prefix, cls in section_types().items():
        walk_dataclass(cls, prefix, owners)
    rows_by_section = _rows_by_section(raw, owners, _meaning_lookup(comments, owners))

    out = _intro_lines()
    for section, rows in rows_by_section.items():
        out += [f"## `{section}`", "", "| key | default | here | meaning |", "| --- | --- | --- | --- |"]
        for key, default, where, text in rows:
            out.append(f"| `{key}` | `{default}` | {where.replace('|', '/')} | {text.replace('|', '/')} |")
        out.append("")
    # sections that are null in the yaml but have a dataclass (normalisation)
    out += _norm_lines()
    out += _reward_kwargs_lines()
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/config_reference.md is not current")
    args = ap.parse_args()
    text = generate()
    if args.check:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is out of date: run python scripts/gen_config_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
