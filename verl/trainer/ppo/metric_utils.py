"""Metrics of a PPO step and of validation, under upstream verl's names.

All functions read CPU tensors of a `DataProto` on the driver:

- `responses` [B, R], `response_mask` [B, R] (1 on generated tokens that count),
  `attention_mask` [B, P+R];
- `token_level_scores` / `token_level_rewards` [B, R] (score on the last valid token; rewards
  may include the KL penalty), `advantages` / `returns` [B, R], `values` [B, R] with a critic.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoConfig

import verl.utils.torch_functional as verl_F
from verl.utils.fs import copy_to_local
from verl.utils.model import update_model_config

logger = logging.getLogger(__name__)


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    """mean/max/min of a flat tensor; an empty tensor gives nan (visible, not a fake 0)."""
    x = x.detach().float().flatten()
    if x.numel() == 0:
        nan = float("nan")
        return {f"{prefix}/mean": nan, f"{prefix}/max": nan, f"{prefix}/min": nan}
    return {f"{prefix}/mean": x.mean().item(), f"{prefix}/max": x.max().item(), f"{prefix}/min": x.min().item()}


def _compute_response_info(batch) -> dict[str, torch.Tensor]:
    """`prompt_length` and `response_length` [B] (float) of a batch: taken from the batch when it
    carries them, else counted on `attention_mask` [B, P+R] (its last R columns are the response)."""
    b = batch.batch
    if "prompt_length" in b.keys() and "response_length" in b.keys():
        return {"prompt_length": b["prompt_length"], "response_length": b["response_length"]}
    width = b["responses"].shape[-1]
    attention = b["attention_mask"]
    return {
        "prompt_length": attention[:, :-width].sum(-1).float(),
        "response_length": attention[:, -width:].sum(-1).float(),
    }


def compute_vf_explained_var(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """`critic/vf_explained_var`, upstream's definition: `1 - Var(R - V) / (Var(R) + 1e-5)` over
    the valid tokens (`mask` [B, R]), with unbiased variances, of the batch's `values` (the
    critic's predictions before its update) and `returns`. nan with fewer than 2 valid tokens.

    The only producer of that metric (the critic worker does not report it)."""
    sel = mask.bool()
    r = returns[sel].double()
    v = values[sel].double()
    if r.numel() < 2:
        return float("nan")
    return float(1.0 - (r - v).var() / (r.var() + 1e-5))


def compute_data_metrics(
    batch, use_critic: bool = True, max_response_length: int | None = None, max_prompt_length: int | None = None
) -> dict[str, float]:
    """Score, reward, advantage, return, value and length statistics of a training batch.

    `max_response_length` / `max_prompt_length` are the configured limits used for the clip
    ratios (share of responses that hit the limit); default: the padded width of the tensors.
    """
    b = batch.batch
    resp_width = b["responses"].shape[-1]
    mask = b["response_mask"].bool() if "response_mask" in b.keys() else b["attention_mask"][:, -resp_width:].bool()
    # lengths count every response token the model saw (tool observations of a multi-turn
    # rollout too), as upstream's; the statistics of advantages and returns use `response_mask`
    lengths = _compute_response_info(batch)
    resp_len, prompt_len = lengths["response_length"].float(), lengths["prompt_length"].float()
    max_resp = max_response_length or resp_width
    max_prompt = max_prompt_length or b["attention_mask"].shape[-1] - resp_width

    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", b["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", b["token_level_rewards"].sum(-1)))
    if "advantages" in b.keys():
        metrics.update(_stats("critic/advantages", b["advantages"][mask]))
    if "returns" in b.keys():
        metrics.update(_stats("critic/returns", b["returns"][mask]))
    if use_critic and "values" in b.keys():
        values = b["values"][mask]
        metrics.update(_stats("critic/values", values))
        metrics["critic/vf_explained_var"] = compute_vf_explained_var(b["values"], b["returns"], mask)
    metrics.update(_stats("response_length", resp_len))
    metrics["response_length/clip_ratio"] = (resp_len >= max_resp).float().mean().item()
    # responses with no valid token (aborted generations) skew the length statistics
    aborted = resp_len == 0
    metrics.update(_stats("response_length_non_aborted", resp_len[~aborted]))
    kept = resp_len[~aborted]
    metrics["response_length_non_aborted/clip_ratio"] = (
        (kept >= max_resp).float().mean().item() if kept.numel() else float("nan")
    )
    metrics["response/aborted_ratio"] = aborted.float().mean().item()
    metrics.update(_stats("prompt_length", prompt_len))
    metrics["prompt_length/clip_ratio"] = (prompt_len >= max_prompt).float().mean().item()
    for key, name in (("__num_turns__", "num_turns"), ("tool_call_counts", "tool_call_counts")):
        if key in batch.non_tensor_batch:
            values = np.asarray(batch.non_tensor_batch[key], dtype=np.float64)
            metrics[f"{name}/min"], metrics[f"{name}/max"], metrics[f"{name}/mean"] = (
                float(values.min()),
                float(values.max()),
                float(values.mean()),
            )
    return metrics


def compute_variance_proxy_metrics(batch, gradient_norm: float | None = None) -> dict[str, float]:
    """Gradient-variance proxies `variance_proxy/*` from the score-norm proxy (upstream's names).

    Needs `sum_pi_squared`, `old_log_probs`, `advantages`, `response_mask` [B, R] in the batch
    ({} otherwise). Per token `w = 1 - 2 pi + sum_pi_squared` (times `rollout_is_weights^2` when
    the batch has them), per response `W = sum_t w` and `A = mean_t advantages`:
    - `proxy2_total_power`: `mean(A^2 max(W, 0))`; with IS weights `mean(rho^2 A^2 max(W0, 0))`,
      rho the response's mean IS weight and W0 the unweighted W;
    - `proxy1_signal_strength`: `gradient_norm^2` (0 when not given);
    - `proxy3_pure_noise`: `max(0, (proxy2 - proxy1) / (B - 1))` (0 without a gradient norm or B < 2);
    - `expected_a_squared` = mean(A^2), `expected_w` = mean(W).
    """
    b = batch.batch
    if not all(k in b.keys() for k in ("sum_pi_squared", "old_log_probs", "advantages", "response_mask")):
        return {}
    mask = b["response_mask"]
    w = 1.0 - 2.0 * torch.exp(b["old_log_probs"]) + b["sum_pi_squared"]
    is_w = b["rollout_is_weights"].detach() if "rollout_is_weights" in b.keys() else None
    if is_w is not None:
        w = w * is_w.square()
    adv = verl_F.masked_mean(b["advantages"], mask, axis=-1)
    w_sum = verl_F.masked_sum(w, mask, axis=-1)
    if is_w is not None:
        rho = verl_F.masked_mean(is_w, mask, axis=-1)
        w_orig = verl_F.masked_sum(w / torch.clamp(is_w.square(), min=1e-10), mask, axis=-1).clamp(min=0.0)
        proxy2 = (rho.square() * adv.square() * w_orig).mean()
    else:
        proxy2 = (adv.square() * w_sum.clamp(min=0.0)).mean()
    proxy1 = None if gradient_norm is None else float(gradient_norm) ** 2
    proxy3 = 0.0
    n = adv.shape[0]
    if proxy1 is not None and n > 1:
        proxy3 = max(0.0, (float(proxy2) - proxy1) / (n - 1))
    return {
        "variance_proxy/proxy1_signal_strength": proxy1 if proxy1 is not None else 0.0,
        "variance_proxy/proxy2_total_power": float(proxy2),
        "variance_proxy/proxy3_pure_noise": proxy3,
        "variance_proxy/expected_a_squared": float(adv.square().mean()),
        "variance_proxy/expected_w": float(w_sum.mean()),
    }


def compute_timing_metrics(batch, timing_raw: dict[str, float]) -> dict[str, float]:
    """`timing_s/{phase}` for every timed phase and `timing_per_token_ms/{phase}`.

    Per-token times divide by the tokens the phase processed: generation by response tokens,
    the forward/backward phases by prompt + response tokens; 0.0 when there were none.
    """
    lengths = _compute_response_info(batch)
    n_resp = float(lengths["response_length"].sum().item())
    n_all = n_resp + float(lengths["prompt_length"].sum().item())
    tokens = {
        "gen": n_resp,
        **{k: n_all for k in ("ref", "old_log_prob", "values", "adv", "update_critic", "update_actor", "reward")},
    }
    metrics = {f"timing_s/{k}": float(v) for k, v in timing_raw.items()}
    for k, v in timing_raw.items():
        if k in tokens:
            metrics[f"timing_per_token_ms/{k}"] = 1000.0 * float(v) / tokens[k] if tokens[k] > 0 else 0.0
    return metrics


def compute_throughout_metrics(batch, timing_raw: dict[str, float], n_gpus: int) -> dict[str, float]:
    """Tokens of the step, time per step and tokens/s/worker.

    The tokens are `meta_info["global_token_num"]` (valid tokens per sequence, set by the
    trainer before the update) when present, else the valid tokens of `attention_mask`.
    (Upstream's spelling "throughout" is kept for compatibility.)
    """
    if "global_token_num" in batch.meta_info:
        total_tokens = int(sum(batch.meta_info["global_token_num"]))
    else:
        total_tokens = int(batch.batch["attention_mask"].sum().item())
    step_time = float(timing_raw["step"])
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": step_time,
        "perf/throughput": total_tokens / max(step_time * max(n_gpus, 1), 1e-9),
    }


compute_throughput_metrics = compute_throughout_metrics


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Mean of each list-valued metric (upstream moved it to `verl.utils.metric`; same function)."""
    from verl.utils.metric import reduce_metrics as _reduce

    return _reduce(metrics)


def _bootstrap_indices(n: int, k: int, n_bootstrap: int, seed: int) -> np.ndarray:
    """[n_bootstrap, k] draws with replacement from range(n): the indices `bootstrap_metric`
    draws with the same seed (so both give the same numbers)."""
    return np.random.default_rng(seed).integers(0, n, size=(n_bootstrap, k))


def bootstrap_metric(
    data: Sequence[Any],
    subset_size: int,
    reduce_fns: Sequence[Callable[[np.ndarray], float]],
    n_bootstrap: int = 1000,
    seed: int = 42,
) -> list[tuple[float, float]]:
    """Bootstrap estimate (mean, std) of each `reduce_fn` over random subsets of `subset_size`
    drawn with replacement from `data` (e.g. best-of-k from n samples). (Upstream helper;
    `process_validation_metrics` computes the same numbers vectorised.)"""
    data = np.asarray(data, dtype=object)
    idx = _bootstrap_indices(len(data), subset_size, n_bootstrap, seed)
    out = []
    for fn in reduce_fns:
        vals = np.array([fn(data[row]) for row in idx], dtype=np.float64)
        out.append((float(vals.mean()), float(vals.std())))
    return out


def calc_maj_val(data: Sequence[dict], vote_key: str, val_key: str) -> float:
    """Value `val_key` of the answer that wins the majority vote on `vote_key` (first seen wins ties)."""
    votes = Counter(d[vote_key] for d in data)
    winner = max(votes, key=lambda k: votes[k])
    return next(float(d[val_key]) for d in data if d[vote_key] == winner)


def _numeric(values: list[Any]) -> bool:
    return all(isinstance(v, (int, float, bool, np.integer, np.floating)) and not isinstance(v, str) for v in values)


def _majority_positions(codes: np.ndarray) -> np.ndarray:
    """Per row of `codes` [S, k] (integer answer ids), the position of the first occurrence of
    the answer with the most votes (ties: the answer seen first), as `calc_maj_val` picks it."""
    counts = np.zeros((codes.shape[0], int(codes.max()) + 1), dtype=np.int64)  # [S, answers]
    np.add.at(counts, (np.arange(codes.shape[0])[:, None], codes), 1)
    votes = np.take_along_axis(counts, codes, axis=1)  # [S, k]: votes of each position's answer
    return votes.argmax(axis=1)  # argmax returns the first position holding the maximum


def process_validation_metrics(
    data_sources: Sequence[str],
    sample_uids: Sequence[Any],
    infos_dict: dict[str, list[Any]],
    seed: int = 42,
    n_bootstrap: int = 1000,
) -> dict[str, dict[str, dict[str, float]]]:
    """Per data source, per variable, per statistic: `{ds: {var: {"mean@n": x, ...}}}`.

    Samples are grouped by `sample_uids` (the n responses to one prompt). For each numeric
    variable of `infos_dict` (e.g. `reward`, `acc`): `mean@n` and `std@n` (mean over prompts of
    the per-prompt mean / std of its n samples), and for n > 1 `best@k/mean`, `worst@k/mean`
    (bootstrap over k of the n samples, k = 2, 4, ..., n) and, when `infos_dict` has a `pred`
    column, `maj@k/mean` (the variable of the majority-voted prediction). The `/std` entries are
    the bootstrap spreads. Same numbers as `bootstrap_metric` with `calc_maj_val`, vectorised:
    the draws depend only on (n, k, seed), and the vote of a prompt is shared by its variables.
    """
    n_total = len(data_sources)
    for k, v in infos_dict.items():
        if len(v) != n_total:
            raise ValueError(f"validation info {k!r} has {len(v)} values for {n_total} samples")
    groups: dict[str, dict[Any, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (ds, uid) in enumerate(zip(data_sources, sample_uids, strict=False)):
        groups[ds][uid].append(i)
    variables = {
        var: np.asarray(values, dtype=np.float64)
        for var, values in infos_dict.items()
        if var != "pred" and _numeric(values)
    }
    preds = infos_dict.get("pred")
    draws: dict[tuple[int, int], np.ndarray] = {}

    result: dict[str, dict[str, dict[str, float]]] = {}
    for ds, by_uid in groups.items():
        per_prompt: dict[str, dict[str, list[float]]] = {var: defaultdict(list) for var in variables}
        for rows in by_uid.values():
            n = len(rows)
            ks = sorted({2**p for p in range(1, int(math.log2(n)) + 1)} | {n}) if n > 1 else []
            codes = None
            if preds is not None and ks:
                answer_ids: dict[Any, int] = {}
                codes = np.array([answer_ids.setdefault(preds[i], len(answer_ids)) for i in rows])
            # per k: the bootstrap draws and, with predictions, the majority-voted position of each draw
            boot = []
            for k in ks:
                idx = draws.get((n, k))
                if idx is None:
                    idx = draws[(n, k)] = _bootstrap_indices(n, k, n_bootstrap, seed)
                maj_pick = None
                if codes is not None:
                    maj_pick = idx[np.arange(len(idx)), _majority_positions(codes[idx])]
                boot.append((k, idx, maj_pick))
            for var, all_values in variables.items():
                vals = all_values[rows]
                out = per_prompt[var]
                out[f"mean@{n}"].append(vals.mean())
                out[f"std@{n}"].append(vals.std() if n > 1 else 0.0)
                for k, idx, maj_pick in boot:
                    sub = vals[idx]
                    best, worst = sub.max(axis=1), sub.min(axis=1)
                    out[f"best@{k}/mean"].append(best.mean())
                    out[f"best@{k}/std"].append(best.std())
                    out[f"worst@{k}/mean"].append(worst.mean())
                    out[f"worst@{k}/std"].append(worst.std())
                    if maj_pick is not None:
                        maj = vals[maj_pick]
                        out[f"maj@{k}/mean"].append(maj.mean())
                        out[f"maj@{k}/std"].append(maj.std())
        result[ds] = {var: {name: float(np.mean(v)) for name, v in stats.items()} for var, stats in per_prompt.items()}
    return result


# ------------------------------------------------------------------- MoE load balance
# A rollout engine that reports the experts its router picked returns `routed_experts`
# [B, S, layers, top_k] (expert ids per token, S >= R covering the response at the end). The
# metrics say how far each layer's expert load is from uniform: with `share` the fraction of a
# layer's assignments that went to an expert and E experts, `violation = share * E - 1` (0 for a
# perfectly balanced layer, E - 1 when one expert takes everything).

# architectures whose `num_local_experts` is the global expert count (elsewhere it is per rank)
_NUM_LOCAL_EXPERTS_MODEL_TYPES = frozenset({"gpt_oss", "mixtral"})


def _config_field(config: Any, name: str, default: Any = None) -> Any:
    """`config[name]` for mappings / OmegaConf / our dataclasses, else the attribute."""
    if hasattr(config, "get"):
        return config.get(name, default)
    return getattr(config, name, default)


def get_hf_config_override_kwargs(override_config: Any) -> dict[str, Any]:
    """The Hugging Face config overrides of `model.override_config`: its `model_config` part when
    it has one (upstream's nested form), else the whole mapping; {} when empty."""
    if isinstance(override_config, DictConfig):
        override_config = OmegaConf.to_container(override_config, resolve=True)
    if not override_config:
        return {}
    return dict(override_config.get("model_config", override_config))


def infer_moe_num_experts(model_config: Any) -> int | None:
    """The number of routed experts named by a model config (or the `model` section of ours),
    looking at it, its `hf_config` (and that one's `text_config`), its `text_config` and its
    `override_config` (and that one's `model_config` / `text_config`), in this order. Reads
    `num_experts`, `n_routed_experts`, and `num_local_experts` for the architectures where that
    is the global count; None when no candidate names one."""
    candidates = [model_config]
    hf_config = _config_field(model_config, "hf_config")
    if hf_config is not None:
        candidates += [hf_config, _config_field(hf_config, "text_config")]
    candidates.append(_config_field(model_config, "text_config"))
    override = _config_field(model_config, "override_config")
    if override is not None:
        candidates += [override, _config_field(override, "model_config"), _config_field(override, "text_config")]
    for candidate in candidates:
        if candidate is None:
            continue
        for name in ("num_experts", "n_routed_experts"):
            value = _config_field(candidate, name)
            if value is not None:
                return int(value)
        if _config_field(candidate, "model_type") in _NUM_LOCAL_EXPERTS_MODEL_TYPES:
            value = _config_field(candidate, "num_local_experts")
            if value is not None:
                return int(value)
    return None


def infer_rollout_moe_num_experts(model_config: Any) -> int | None:
    """`infer_moe_num_experts`, reading the model's Hugging Face config from disk (with the
    overrides of `override_config` applied) when the in-memory config does not say."""
    found = infer_moe_num_experts(model_config)
    if found is not None:
        return found
    path = (
        _config_field(model_config, "local_hf_config_path")
        or _config_field(model_config, "hf_config_path")
        or _config_field(model_config, "path")
    )
    if path is None:
        return None
    local = copy_to_local(path, use_shm=_config_field(model_config, "use_shm", False))
    hf_config = AutoConfig.from_pretrained(
        local, trust_remote_code=_config_field(model_config, "trust_remote_code", False)
    )
    overrides = get_hf_config_override_kwargs(_config_field(model_config, "override_config", {}))
    if overrides:
        update_model_config(hf_config, overrides)
    return infer_moe_num_experts(hf_config)


def _routed_response_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """`response_mask` [B, R] without each row's last valid position: the last sampled token is
    never fed back through the model, so its `routed_experts` slot is filler, not a record."""
    mask = response_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = torch.where(mask, positions, -1).amax(dim=-1, keepdim=True)  # [B, 1]; -1: empty row
    return mask & (positions != last)


def _compute_rollout_moe_load_counts(
    routed_experts: torch.Tensor | None, response_mask: torch.Tensor | None, num_experts: int | None
) -> torch.Tensor | None:
    """Assignments per (layer, expert) [layers, E] over the response tokens that were routed.

    `routed_experts` [B, S, layers, top_k] (its last R positions are the response),
    `response_mask` [B, R]. None (with a log line for malformed input) when there is nothing
    to count, the shapes do not fit, or an expert id lies outside [0, num_experts)."""
    if routed_experts is None or response_mask is None or not num_experts or num_experts <= 0:
        return None
    if routed_experts.dim() != 4:
        logger.warning("routed_experts must be [batch, seq, layers, top_k], got shape %s", tuple(routed_experts.shape))
        return None
    if response_mask.dim() != 2 or response_mask.shape[0] != routed_experts.shape[0]:
        logger.warning(
            "response_mask shape %s does not fit routed_experts %s",
            tuple(response_mask.shape),
            tuple(routed_experts.shape),
        )
        return None
    width = response_mask.shape[1]
    if width == 0:
        return None  # (and routed_experts[:, -0:] would select everything)
    if routed_experts.shape[1] < width:
        logger.warning("routed_experts has %d positions for %d response tokens", routed_experts.shape[1], width)
        return None
    response_routed = routed_experts[:, -width:]
    mask = _routed_response_mask(response_mask.to(response_routed.device))
    ids = response_routed[mask].detach().to("cpu", torch.long)  # [tokens, layers, top_k]
    if ids.numel() == 0:
        return None
    if ids.min() < 0 or ids.max() >= num_experts:
        logger.warning(
            "Skipping rollout MoE load-balance metrics: routed expert ids span [%d, %d], outside [0, %d)",
            ids.min().item(),
            ids.max().item(),
            num_experts,
        )
        return None
    n_layers = ids.shape[1]
    # one bincount over (layer, expert) pairs: no [tokens, layers, top_k, E] one-hot tensor
    flat = ids + torch.arange(n_layers).view(1, n_layers, 1) * num_experts
    return torch.bincount(flat.reshape(-1), minlength=n_layers * num_experts).view(n_layers, num_experts)


def _compute_rollout_moe_load_balance_metrics_from_counts(
    load_counts: torch.Tensor | None, prefix: str = "rollout/moe"
) -> dict[str, float]:
    """`{prefix}/{max,min,avg}_vio/layer_{i}` per layer and their `/max` and `/avg` over layers,
    from `load_counts` [layers, E]; avg_vio is the mean absolute violation."""
    if load_counts is None or load_counts.numel() == 0:
        return {}
    counts = load_counts.double()
    share = counts / counts.sum(dim=1, keepdim=True).clamp_min(1.0)
    violation = share * counts.shape[1] - 1.0  # [layers, E]
    per_layer = {
        "max_vio": violation.max(dim=1).values,
        "min_vio": violation.min(dim=1).values,
        "avg_vio": violation.abs().mean(dim=1),
    }
    metrics = {}
    for name, values in per_layer.items():
        for layer, value in enumerate(values.tolist()):
            metrics[f"{prefix}/{name}/layer_{layer}"] = value
    for name, values in per_layer.items():
        metrics[f"{prefix}/{name}/max"] = values.max().item()
        metrics[f"{prefix}/{name}/avg"] = values.mean().item()
    return metrics


def compute_rollout_moe_load_balance_metrics(
    routed_experts: torch.Tensor | None,
    response_mask: torch.Tensor | None,
    num_experts: int | None,
    prefix: str = "rollout/moe",
) -> dict[str, float]:
    """Load-balance violations of one batch's rollout routing ({} when nothing can be counted);
    shapes as `_compute_rollout_moe_load_counts`."""
    counts = _compute_rollout_moe_load_counts(routed_experts, response_mask, num_experts)
    return _compute_rollout_moe_load_balance_metrics_from_counts(counts, prefix=prefix)


class RolloutMoELoadBalanceMetricsAccumulator:
    """Expert assignment counts summed over the steps of one logging interval.

    One instance per trainer (its state is the interval's counts, the one-time warnings and
    when to ask the rollout for `routed_experts` again); `model_config` is read once, on the
    first update without an explicit `num_experts`, to find the expert count."""

    def __init__(self, model_config: Any | None = None):
        self.model_config = model_config
        self.load_counts: torch.Tensor | None = None  # [layers, E]
        self.num_experts: int | None = None
        self.num_experts_initialized = False
        self.routed_experts_retry_after_step = 0
        self.warned_skip_keys: set[str] = set()

    def should_request_routed_experts(self, global_steps: int) -> bool:
        return global_steps >= self.routed_experts_retry_after_step

    def defer_routed_experts_retry(self, global_steps: int, interval: int) -> None:
        """Do not ask for `routed_experts` again before the next logging interval."""
        self.routed_experts_retry_after_step = global_steps + max(interval, 1)

    def warn_skip_once(self, key: str, message: str) -> None:
        """Log `message` the first time `key` is seen."""
        if key not in self.warned_skip_keys:
            self.warned_skip_keys.add(key)
            logger.warning(message)

    def _infer_num_experts(self) -> int | None:
        if not self.num_experts_initialized:
            self.num_experts_initialized = True
            if self.model_config is not None:
                try:
                    self.num_experts = infer_rollout_moe_num_experts(self.model_config)
                except Exception as exc:  # noqa: BLE001 - a metric: skip it, say why once
                    self.warn_skip_once("num_experts_exception", f"Failed to infer rollout MoE num_experts: {exc}")
            if self.num_experts is None:
                self.warn_skip_once(
                    "num_experts_missing",
                    "Skipping rollout MoE load-balance metrics: num_experts could not be inferred from "
                    "actor_rollout_ref.model or the Hugging Face config.",
                )
        return self.num_experts

    def update(
        self, routed_experts: torch.Tensor | None, response_mask: torch.Tensor | None, num_experts: int | None = None
    ) -> bool:
        """Add one batch's counts; False when it had none to add."""
        if num_experts is None:
            num_experts = self._infer_num_experts()
        counts = _compute_rollout_moe_load_counts(routed_experts, response_mask, num_experts)
        if counts is None:
            return False
        if self.load_counts is not None and self.load_counts.shape != counts.shape:
            logger.warning(
                "Rollout MoE load counts changed shape from %s to %s: restarting the interval",
                tuple(self.load_counts.shape),
                tuple(counts.shape),
            )
            self.load_counts = None
        self.load_counts = counts if self.load_counts is None else self.load_counts + counts
        return True

    def compute(self, prefix: str = "rollout/moe") -> dict[str, float]:
        return _compute_rollout_moe_load_balance_metrics_from_counts(self.load_counts, prefix=prefix)

    def total_assignments(self) -> int:
        return 0 if self.load_counts is None else int(self.load_counts.sum().item())

    def reset(self) -> None:
        self.load_counts = None

    def pop_metrics(self, prefix: str = "rollout/moe") -> dict[str, float]:
        """The interval's metrics; the counts start again from zero."""
        metrics = self.compute(prefix=prefix)
        self.reset()
        return metrics


def compute_moe_lb_metrics(
    metrics_batch,
    moe_lb_metrics_interval: int,
    global_steps: int,
    accumulator: RolloutMoELoadBalanceMetricsAccumulator,
) -> dict[str, float]:
    """Accumulate this step's `routed_experts` and, every `moe_lb_metrics_interval` steps, the
    interval's metrics plus `rollout/moe/routed_experts_found` and
    `rollout/moe/routed_expert_assignments`; {} on the other steps and when the interval is 0."""
    if moe_lb_metrics_interval <= 0:
        return {}
    updated = accumulator.update(
        routed_experts=metrics_batch.batch.get("routed_experts", None),
        response_mask=metrics_batch.batch.get("response_mask", None),
    )
    if global_steps % moe_lb_metrics_interval != 0:
        return {}
    assignments = accumulator.total_assignments()
    metrics = accumulator.pop_metrics()
    metrics["rollout/moe/routed_experts_found"] = float(assignments > 0)
    metrics["rollout/moe/routed_expert_assignments"] = assignments
    if not updated and assignments == 0:
        accumulator.warn_skip_once(
            "no_routed_expert_counts", "Skipping rollout MoE load-balance metrics: no routed expert counts were found."
        )
    return metrics


def get_metric_data_with_optional_routed_experts(
    keys: list[str],
    partition_id: str,
    fields: list[str],
    moe_lb_metrics_interval: int,
    global_steps: int,
    accumulator: RolloutMoELoadBalanceMetricsAccumulator,
    kv_batch_get: Callable[..., Any],
):
    """`kv_batch_get(keys=, partition_id=, select_fields=)` for the metric fields, asking for
    `routed_experts` too while load-balance metrics are on. A store without that field (a
    ValueError naming it) is asked again without it, and not asked for it again before the
    next interval."""
    if moe_lb_metrics_interval <= 0 or not accumulator.should_request_routed_experts(global_steps):
        return kv_batch_get(keys=keys, partition_id=partition_id, select_fields=fields)
    try:
        return kv_batch_get(keys=keys, partition_id=partition_id, select_fields=[*fields, "routed_experts"])
    except ValueError as exc:
        if "routed_experts" not in str(exc):
            raise
        accumulator.defer_routed_experts_retry(global_steps, moe_lb_metrics_interval)
        accumulator.warn_skip_once("missing_routed_experts", f"Skipping rollout MoE load-balance metrics: {exc}")
        return kv_batch_get(keys=keys, partition_id=partition_id, select_fields=fields)


# ---------------------------------------------------------------------------------- MFU
# dense bf16 tensor-core peaks (FLOP/s) of common accelerators, by a substring of the device name
_GPU_PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "H800": 989e12,
    "H20": 148e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40": 181e12,
    "A10": 125e12,
    "4090": 165e12,
    "3090": 71e12,
    "V100": 125e12,
    "T4": 65e12,
}


def peak_flops_per_worker(device: str) -> float | None:
    """Peak FLOP/s of one worker: a table lookup for known GPUs; on CPU, a short fp32 matmul
    measured in this process with its current torch threads (an achievable peak, not a
    datasheet figure). None when unknown."""
    if device == "cuda":
        if not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name()
        for key, flops in _GPU_PEAK_FLOPS.items():
            if key in name:
                return flops
        return None
    import time

    g = torch.Generator().manual_seed(0)  # not the global RNG: a resumed run's restored stream stays untouched
    a = torch.randn(512, 512, generator=g)
    b = torch.randn(512, 512, generator=g)
    a @ b  # warm-up
    reps = 8
    # the fastest of a few rounds: one round (~15 ms) that another process interrupts would set a
    # peak several times too low for the whole run (MFU above 1 was seen)
    elapsed = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        elapsed = min(elapsed, time.perf_counter() - t0)
    return 2 * 512**3 * reps / max(elapsed, 1e-9)


def count_model_params(model_path: str, trust_remote_code: bool = False) -> int | None:
    """Parameters of the causal LM at `model_path`, counted on the meta device (no weights read);
    None when unknown."""
    if not model_path:
        return None
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=trust_remote_code)
        return sum(p.numel() for p in model.parameters())
    except Exception:  # noqa: BLE001 - an estimate only; the metric is left out
        return None


def compute_mfu_metrics(
    batch,
    timing_raw: dict[str, float],
    n_params: int | None,
    peak_flops: float | None,
    n_workers: int,
    actor_epochs: int = 1,
    critic_epochs: int = 1,
) -> dict[str, float]:
    """Model FLOPs utilisation estimates: `perf/mfu/step` and per phase `perf/mfu/{phase}`.

    FLOPs use the 2N-per-token rule (forward) and 6N (forward + backward) with N the policy's
    parameters (the critic is assumed to be of the same size), over the valid tokens of the batch
    (prompt + response for log-prob/value/update passes, prompt + response for generation);
    attention FLOPs are ignored (short sequences). Divided by time x workers x peak FLOP/s.
    """
    if not n_params or not peak_flops:
        return {}
    tokens = float(batch.batch["attention_mask"].sum().item())
    per_phase = {
        "gen": 2 * n_params * tokens,
        "old_log_prob": 2 * n_params * tokens,
        "ref": 2 * n_params * tokens,
        "values": 2 * n_params * tokens,
        "update_actor": 6 * n_params * tokens * actor_epochs,
        "update_critic": 6 * n_params * tokens * critic_epochs,
    }
    capacity = n_workers * peak_flops
    metrics = {}
    total = 0.0
    for phase, flops in per_phase.items():
        t = timing_raw.get(phase)
        if t and t > 1e-3:
            metrics[f"perf/mfu/{phase}"] = flops / (t * capacity)
            total += flops
    if timing_raw.get("step"):
        metrics["perf/mfu/step"] = total / (timing_raw["step"] * capacity)
    return metrics
