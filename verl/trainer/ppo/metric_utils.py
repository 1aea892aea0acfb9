"""Metrics of a PPO step and of validation, under upstream verl's names.

All functions read CPU tensors of a `DataProto` on the driver:

- `responses` [B, R], `response_mask` [B, R] (1 on generated tokens that count),
  `attention_mask` [B, P+R];
- `token_level_scores` / `token_level_rewards` [B, R] (score on the last valid token; rewards
  may include the KL penalty), `advantages` / `returns` [B, R], `values` [B, R] with a critic.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

import verl.utils.torch_functional as verl_F


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    """mean/max/min of a flat tensor; an empty tensor gives nan (visible, not a fake 0)."""
    x = x.detach().float().flatten()
    if x.numel() == 0:
        nan = float("nan")
        return {f"{prefix}/mean": nan, f"{prefix}/max": nan, f"{prefix}/min": nan}
    return {f"{prefix}/mean": x.mean().item(), f"{prefix}/max": x.max().item(), f"{prefix}/min": x.min().item()}


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
    responses = b["responses"]
    resp_width = responses.shape[-1]
    mask = b["response_mask"].bool() if "response_mask" in b.keys() else b["attention_mask"][:, -resp_width:].bool()
    resp_len = mask.sum(-1).float()
    prompt_len = b["attention_mask"][:, :-resp_width].sum(-1).float()
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
    the forward/backward phases by prompt + response tokens.
    """
    b = batch.batch
    resp_width = b["responses"].shape[-1]
    n_resp = int(
        b["response_mask"].sum().item()
        if "response_mask" in b.keys()
        else b["attention_mask"][:, -resp_width:].sum().item()
    )
    n_all = int(b["attention_mask"].sum().item())
    tokens = {
        "gen": n_resp,
        **{k: n_all for k in ("ref", "old_log_prob", "values", "adv", "update_critic", "update_actor", "reward")},
    }
    metrics = {f"timing_s/{k}": float(v) for k, v in timing_raw.items()}
    for k, v in timing_raw.items():
        if k in tokens and tokens[k] > 0:
            metrics[f"timing_per_token_ms/{k}"] = 1000.0 * float(v) / tokens[k]
    return metrics


def compute_throughout_metrics(batch, timing_raw: dict[str, float], n_gpus: int) -> dict[str, float]:
    """Tokens of the step (prompt + response, valid only), time per step and tokens/s/worker.

    (Upstream's spelling "throughout" is kept for compatibility.)
    """
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
