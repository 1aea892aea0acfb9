"""Training health: the known ways an RL run fails, detected from the step's metrics (docs/health.md).

Pure logic, no trainer: `batch_stats` turns one scored rollout batch into a few numbers
(vectorised torch, on the driver), `HealthMonitor.observe` takes each step's metric dict (the
trainer's metrics plus those numbers) and returns the signals that tripped this step. A condition
trips after holding `patience` consecutive steps and warns once per episode: the episode ends
after `clear_after` healthy steps (hysteresis). The trainer glue is `health_callback.py`.

Inputs are upstream's metric names: `actor/entropy`, `actor/grad_norm`, `actor/kl_loss`,
`critic/grad_norm`, `response_length/clip_ratio`,
`rollout_mismatch/kl_k3`, `agent/tool_call_rate`, `actor/nonfinite_*`, `val-core/...`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl.trainer.config.health import HEALTH_SIGNALS, HealthConfig

# odd 64-bit multiplier of the polynomial n-gram / sequence hashes (int64 products wrap)
_HASH_MUL = 0x9E3779B97F4A7C15
_INVALID = torch.iinfo(torch.int64).min  # the hash of a masked n-gram

REMEDIES = {
    "entropy_collapse": "raise the temperature or the entropy bonus (actor.entropy_coeff), clip-higher "
    "(actor.clip_ratio_high), lower the learning rate, add KL to the reference",
    "degenerate_output": "lower the learning rate, add KL to the reference (actor.use_kl_loss), a repetition "
    "or length penalty in the reward, check the chat template and the stop tokens",
    "length_growth": "a length penalty (reward_model.reward_kwargs.overlong_buffer_cfg), a lower "
    "max_response_length, token-mean loss aggregation; ignore if long reasoning is intended",
    "length_clip": "raise data.max_response_length, an overlong penalty (overlong_buffer_cfg), lower the "
    "learning rate if the responses degenerate",
    "reward_val_divergence": "the reward has a shortcut: inspect high-reward samples (trainer.rollout_data_dir), "
    "fix the reward function, add KL to the reference, stop at the best validation checkpoint",
    "reward_length_corr": "the reward pays for length: normalise or penalise length in the reward, "
    "token-mean loss aggregation (actor.loss_agg_mode)",
    "tool_call_collapse": "the reward does not need the tool: make it need the tool (or reward correct "
    "tool use), check the tool's errors (agent/tool_error_rate)",
    "rollout_mismatch": "rollout correction (algorithm.rollout_correction.rollout_is=token), the same dtype "
    "in rollout and trainer, check the weight sync",
    "kl_spike": "lower the learning rate, a larger KL coefficient, grad clipping (actor.grad_clip), look "
    "at the step's samples",
    "grad_norm_spike": "lower the learning rate, grad clipping (actor.grad_clip), larger batches",
    "nonfinite": "lower the learning rate, fp32 or bf16 instead of fp16, check the reward for nan/inf",
    "dead_signal": "lower the learning rate (the policy may have collapsed), dynamic sampling "
    "(algorithm.filter_groups.enable), more responses per prompt (rollout.n), an easier or denser reward",
}


# ============================================================================ batch statistics
@functools.lru_cache(maxsize=16)
def _hash_powers(n: int) -> torch.Tensor:
    """[n] int64: the multiplier's powers modulo 2**64, as signed int64 (a pure function, cached)."""
    out = []
    for k in range(n):
        p = pow(_HASH_MUL, k, 1 << 64)
        out.append(p - (1 << 64) if p >= (1 << 63) else p)
    return torch.tensor(out, dtype=torch.int64)


def _hash_windows(tokens: torch.Tensor, n: int) -> torch.Tensor:
    """Polynomial hash of every length-`n` window of `tokens` [B, R] -> [B, R-n+1] int64 (the
    int64 products and sums wrap: a hash modulo 2**64)."""
    return (tokens.unfold(1, n, 1) * _hash_powers(n)).sum(-1)


def repeated_ngram_rate(responses: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """Per response [B] float: share of its valid n-grams that occur earlier in the same response
    (0 for a response with no n-gram). An n-gram is valid when its n positions are all in `mask`.

    responses [B, R] token ids, mask [B, R] 0/1."""
    b, r = responses.shape
    if r < n:
        return torch.zeros(b)
    valid = mask.bool().unfold(1, n, 1).all(-1)  # [B, R-n+1]
    hashes = torch.where(valid, _hash_windows(responses.long(), n), torch.full_like(valid, _INVALID, dtype=torch.long))
    sorted_h, order = hashes.sort(dim=1)
    sorted_valid = valid.gather(1, order)
    repeats = ((sorted_h[:, 1:] == sorted_h[:, :-1]) & sorted_valid[:, 1:] & sorted_valid[:, :-1]).sum(-1)
    return repeats.float() / valid.sum(-1).clamp(min=1).float()


def single_symbol_rows(
    responses: torch.Tensor, mask: torch.Tensor, char_of_token: torch.Tensor | None = None
) -> torch.Tensor:
    """Per response [B] bool: all its valid tokens are one token, or (with `char_of_token` [V]:
    the code point of a token that decodes to one repeated character, else -1) one character."""
    m = mask.bool()
    big = torch.iinfo(torch.long).max
    tok = responses.long()
    same_tok = torch.where(m, tok, -1).amax(-1) == torch.where(m, tok, big).amin(-1)
    if char_of_token is None:
        return same_tok
    ch = char_of_token[tok.clamp(0, char_of_token.numel() - 1)]
    all_chars = (~m | (ch >= 0)).all(-1)
    same_ch = torch.where(m, ch, -1).amax(-1) == torch.where(m, ch, big).amin(-1)
    return same_tok | (all_chars & same_ch)


def group_ids(uids: np.ndarray) -> torch.Tensor:
    """Group index [B] (0..G-1) of each row's `uid`."""
    _, inverse = np.unique(np.asarray(uids, dtype=str), return_inverse=True)
    return torch.from_numpy(inverse.reshape(-1).astype(np.int64))


def duplicate_rows(responses: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Per response [B] bool: an earlier row of its group (same `groups` id) has the same valid
    tokens (a sequence hash of the masked tokens and the length)."""
    tok = torch.where(mask.bool(), responses.long(), -1)
    hashes = _hash_windows(tok, tok.shape[1]).squeeze(1) * 31 + mask.sum(-1).long()
    key = np.stack([hashes.numpy(), groups.numpy()])
    order = np.lexsort(key)  # by group, then hash
    dup_sorted = np.zeros(len(order), dtype=bool)
    same = (key[0][order][1:] == key[0][order][:-1]) & (key[1][order][1:] == key[1][order][:-1])
    dup_sorted[1:] = same
    out = np.zeros(len(order), dtype=bool)
    out[order] = dup_sorted
    return torch.from_numpy(out)


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    denom = (x.square().sum() * y.square().sum()).sqrt()
    return float((x * y).sum() / denom) if denom > 0 else 0.0


def batch_stats(
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    scores: torch.Tensor,
    uids: np.ndarray,
    cfg: HealthConfig,
    *,
    best_score: float,
    log_probs: torch.Tensor | None = None,
    char_of_token: torch.Tensor | None = None,
    special_ids: torch.Tensor | None = None,
) -> dict[str, float]:
    """The `health/*` numbers of one scored batch (responses [B, R], response_mask [B, R] 0/1,
    scores [B] sequence scores, uids [B] group ids, log_probs [B, R] of the sampled tokens;
    `special_ids`: token ids (eos, pad) left out of the one-token/character test).

    - `health/repeat_ngram_rate`: mean over responses of their repeated n-gram share;
    - `health/single_char_share`: share of responses (of >= `degenerate_min_tokens` tokens) that
      are one repeated token or character;
    - `health/identical_share`: share of responses (of >= `degenerate_min_tokens` tokens) equal to
      an earlier response of their group;
    - `health/dead_group_share`: share of groups of >= 2 responses whose scores are all equal,
      not counting groups all at the solved score (`solved_score_ratio` x the best score seen);
    - `health/reward_length_corr`: Pearson correlation of score and response length;
    - `health/score_mean`, `health/length_mean`, `health/best_score`;
    - `health/entropy_estimate`: mean -log p of the sampled tokens (with `log_probs`).
    """
    mask = response_mask.bool()
    lengths = mask.sum(-1)
    content = mask if special_ids is None else mask & ~torch.isin(responses, special_ids)
    long_enough = content.sum(-1) >= cfg.degenerate_min_tokens
    n_long = int(long_enough.sum())
    groups = group_ids(uids)
    scores = scores.double()
    best = max(best_score, float(scores.max())) if len(scores) else best_score
    out = {
        "health/repeat_ngram_rate": float(repeated_ngram_rate(responses, mask, cfg.ngram_size).mean()),
        "health/single_char_share": float((single_symbol_rows(responses, content, char_of_token) & long_enough).sum())
        / max(n_long, 1),
        "health/identical_share": float((duplicate_rows(responses, mask, groups) & long_enough).sum()) / max(n_long, 1),
        "health/reward_length_corr": _pearson(scores, lengths),
        "health/score_mean": float(scores.mean()),
        "health/length_mean": float(lengths.double().mean()),
        "health/best_score": best,
    }
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    size = torch.bincount(groups, minlength=n_groups)
    g_max = torch.full((n_groups,), -math.inf, dtype=torch.float64).scatter_reduce(0, groups, scores, "amax")
    g_min = torch.full((n_groups,), math.inf, dtype=torch.float64).scatter_reduce(0, groups, scores, "amin")
    multi = size >= 2
    dead = multi & (g_max == g_min) & (g_max < cfg.solved_score_ratio * best if best > 0 else True)
    out["health/dead_group_share"] = float(dead.sum()) / max(int(multi.sum()), 1)
    if log_probs is not None:
        out["health/entropy_estimate"] = float(-(log_probs.double() * mask).sum() / mask.sum().clamp(min=1))
    return out


def action_of(cfg: HealthConfig, signal: str) -> str:
    """The action of `signal`: its entry in `trainer.health.actions`, else `trainer.health.action`."""
    return cfg.actions.get(signal, cfg.action)


# ============================================================================ the monitor
@dataclass
class Trip:
    """A signal that tripped: its name, the step, the one-line evidence and the configured action."""

    signal: str
    step: int
    evidence: str
    action: str

    def message(self) -> str:
        return f"health: {self.signal} at step {self.step}: {self.evidence}; usual remedies: {REMEDIES[self.signal]}"


@dataclass
class SignalState:
    """Hysteresis of one signal: `bad`/`good` count the consecutive steps its condition did or did
    not hold; `episodes` are [start_step, end_step or None] of the tripped periods."""

    active: bool = False
    bad: int = 0
    good: int = 0
    episodes: list[list[Any]] = field(default_factory=list)


def _finite(values: list[float]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _mean(values: list[float]) -> float | None:
    vals = _finite(values)
    return float(np.mean(vals)) if vals else None


def _span(pts: list[tuple[int, float]]) -> str:
    return f"step {pts[0][0]}" if len(pts) == 1 else f"steps {pts[0][0]}-{pts[-1][0]}"


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.3e}"


# metric inputs: health name -> upstream (or batch) metric names, the first present wins
INPUTS = {
    "entropy": ("actor/entropy", "health/entropy_estimate"),
    "score": ("health/score_mean", "filter_groups/raw_score_mean", "critic/score/mean"),
    "length": ("health/length_mean", "response_length/mean"),
    "clip_ratio": ("response_length/clip_ratio",),
    "tool_rate": ("agent/tool_call_rate",),
    "mismatch": ("rollout_mismatch/kl_k3",),
    # the KL loss (k3 / low_var_kl: non-negative, low variance); KL in reward is k1 by default,
    # signed and noisy around 0, and spikes of it are noise
    "kl": ("actor/kl_loss",),
    "grad_norm": ("actor/grad_norm",),
    "critic_grad_norm": ("critic/grad_norm",),
}
NONFINITE_KEYS = (
    "actor/nonfinite_loss_skipped",
    "actor/nonfinite_grad_skipped_steps",
    "critic/nonfinite_loss_skipped",
    "critic/nonfinite_grad_skipped_steps",
)
BATCH_KEYS = (
    "health/repeat_ngram_rate",
    "health/single_char_share",
    "health/identical_share",
    "health/dead_group_share",
    "health/reward_length_corr",
    "health/best_score",
)


def thresholds(cfg: HealthConfig) -> dict[str, tuple[float | None, str]]:
    """Signal -> (threshold of its `health/<signal>` value, "above" or "below": the side that trips)."""
    return {
        "entropy_collapse": (cfg.entropy_ratio_min, "below"),
        "degenerate_output": (1.0, "above"),
        "length_growth": (cfg.length_growth_max, "above"),
        "length_clip": (cfg.clip_ratio_max, "above"),
        "reward_val_divergence": (None, "above"),
        "reward_length_corr": (cfg.reward_length_corr_max, "above"),
        "tool_call_collapse": (cfg.tool_rate_drop_ratio, "below"),
        "rollout_mismatch": (cfg.mismatch_kl_max, "above"),
        "kl_spike": (cfg.spike_factor, "above"),
        "grad_norm_spike": (cfg.spike_factor, "above"),
        "nonfinite": (0.0, "above"),
        "dead_signal": (cfg.dead_group_share_max, "above"),
    }


# values a spike is judged against, at least: the first steps of a run (a KL growing from 0, a
# critic's first gradients) are its settling, not spikes
SPIKE_MIN_HISTORY = 10
# trip at once (no patience): a spike or a skip is an event, not a trend
IMMEDIATE = ("kl_spike", "grad_norm_spike", "nonfinite")


def _as_float(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f


def validation_accuracy(metrics: dict[str, Any]) -> float | None:
    """Mean of the `val-core/<source>/acc/mean@n` entries, else of `val-core/<source>/reward/mean@n`."""
    for var in ("acc", "reward"):
        vals = [
            _as_float(v)
            for k, v in metrics.items()
            if k.startswith("val-core/") and f"/{var}/mean@" in k and _as_float(v) is not None
        ]
        if vals:
            return float(np.mean(vals))
    return None


class HealthMonitor:
    """Signals over a run's metric stream (see the module docstring and docs/health.md).

    `observe(step, metrics)` once per step, `observe_validation(step, metrics)` per validation;
    `history` keeps every signal's value per step for the end-of-run report. The whole state is
    plain data (`state_dict` / `load_state_dict`: a resumed run continues its episodes).
    """

    def __init__(self, cfg: HealthConfig):
        self.cfg = cfg
        self.series: dict[str, list[tuple[int, float]]] = {}  # input name -> (step, value)
        self.val: list[tuple[int, float]] = []  # (step, validation accuracy)
        self.states = {name: SignalState() for name in HEALTH_SIGNALS}
        self.history: dict[str, list[tuple[int, float]]] = {name: [] for name in HEALTH_SIGNALS}
        self.trips: list[Trip] = []
        self.step = 0
        self._now: dict[str, float] = {}  # this step's raw inputs

    # ------------------------------------------------------------------ inputs
    def observe_validation(self, step: int, metrics: dict[str, Any]) -> None:
        acc = validation_accuracy(metrics)
        if acc is not None:
            self.val = [(s, v) for s, v in self.val if s != step] + [(step, acc)]

    def _record(self, step: int, metrics: dict[str, Any]) -> None:
        self._now = {}
        for name, keys in INPUTS.items():
            for key in keys:
                v = _as_float(metrics.get(key))
                if v is not None:
                    self._now[name] = v
                    if math.isfinite(v):
                        self.series.setdefault(name, []).append((step, v))
                    break
        for key in BATCH_KEYS:
            v = _as_float(metrics.get(key))
            if v is not None:
                self._now[key] = v
        skips = sum(_as_float(metrics.get(k)) or 0.0 for k in NONFINITE_KEYS)
        bad_norms = [k for k in ("grad_norm", "critic_grad_norm") if k in self._now and not math.isfinite(self._now[k])]
        if any(k in metrics for k in NONFINITE_KEYS) or bad_norms:
            self._now["nonfinite"] = skips + len(bad_norms)

    def _values(self, name: str) -> list[tuple[int, float]]:
        return self.series.get(name, [])

    def _start_now(self, name: str) -> tuple[float, float, str] | None:
        """(start, now, text): the mean of the first `warmup_steps` values and of the last
        `window` values after them; None before there is one value after the warm-up."""
        pts = self._values(name)
        w = self.cfg.warmup_steps
        if len(pts) <= w:
            return None
        first, last = pts[:w], pts[w:][-self.cfg.window :]
        start, now = float(np.mean([v for _, v in first])), float(np.mean([v for _, v in last]))
        text = f"{_fmt(now)} ({_span(last)}) against {_fmt(start)} ({_span(first)})"
        return start, now, text

    def _score_trend(self) -> tuple[float, float, str] | None:
        """(previous, recent, text): mean score of the `window` steps before the last `window`."""
        pts, w = self._values("score"), self.cfg.window
        if len(pts) < 2 * w:
            return None
        prev, recent = pts[-2 * w : -w], pts[-w:]
        p, r = float(np.mean([v for _, v in prev])), float(np.mean([v for _, v in recent]))
        return p, r, f"score {_fmt(p)} ({_span(prev)}) -> {_fmt(r)} ({_span(recent)})"

    def _solved(self, score: float) -> bool:
        best = self._now.get("health/best_score")
        return best is not None and best > 0 and score >= self.cfg.solved_score_ratio * best

    # ------------------------------------------------------------------ the signals
    # each returns (condition or None when there is no evidence this step, value, evidence)
    def _check_entropy_collapse(self):
        sn, trend = self._start_now("entropy"), self._score_trend()
        ratio = sn[1] / sn[0] if sn is not None and sn[0] > 0 else None
        same = self._now.get("health/identical_share")
        if trend is None or (ratio is None and same is None):
            return None, ratio, ""
        low = ratio is not None and ratio < self.cfg.entropy_ratio_min
        uniform = same is not None and same > self.cfg.identical_share_max
        stalled = trend[1] - trend[0] <= self.cfg.reward_stall_delta and not self._solved(trend[1])
        ent = f"entropy {sn[2]} is {ratio:.2f}x its start" if ratio is not None else "entropy n/a"
        text = (
            f"{ent} (threshold {self.cfg.entropy_ratio_min}), {_fmt(same)} of the responses repeat another of "
            f"their group (threshold {self.cfg.identical_share_max}), while {trend[2]}"
        )
        return (low or uniform) and stalled, ratio, text

    def _check_degenerate_output(self):
        c = self.cfg
        parts = [
            ("repeated n-gram rate", "health/repeat_ngram_rate", c.repeat_ngram_max),
            ("one-token/character responses", "health/single_char_share", c.single_char_share_max),
        ]
        if not all(key in self._now for _, key, _ in parts):
            return None, None, ""
        severity = max(self._now[key] / thr if thr > 0 else math.inf * self._now[key] for _, key, thr in parts)
        text = ", ".join(f"{label} {_fmt(self._now[key])} (threshold {thr})" for label, key, thr in parts)
        return severity > 1.0, severity, text

    def _check_length_growth(self):
        sn = self._start_now("length")
        if sn is None or sn[0] <= 0:
            return None, None, ""
        ratio = sn[1] / sn[0]
        text = f"mean response length {sn[2]}: {ratio:.2f}x (threshold {self.cfg.length_growth_max}x)"
        return ratio > self.cfg.length_growth_max, ratio, text

    def _check_length_clip(self):
        clip = self._now.get("clip_ratio")
        if clip is None:
            return None, None, ""
        text = f"{clip:.0%} of the responses end at max_response_length (threshold {self.cfg.clip_ratio_max:.0%})"
        return clip > self.cfg.clip_ratio_max, clip, text

    def _check_reward_length_corr(self):
        corr, sn, tools = (
            self._now.get("health/reward_length_corr"),
            self._start_now("length"),
            self._start_now("tool_rate"),
        )
        if corr is None or sn is None or sn[0] <= 0:
            return None, corr, ""
        if tools is not None and tools[1] > tools[0]:
            # agent loop: the responses that call the tool are the longer ones; while the tool-call
            # rate rises, a score-length correlation is the tool paying off, not length paying
            return False, corr, ""
        rising = sn[1] / sn[0] >= self.cfg.length_rise_min
        text = (
            f"score-length correlation {corr:.2f} (threshold {self.cfg.reward_length_corr_max}) while the mean "
            f"length grew to {sn[2]}"
        )
        return corr > self.cfg.reward_length_corr_max and rising, corr, text

    def _check_reward_val_divergence(self):
        k = self.cfg.val_window
        if len(self.val) <= k or self.val[-1][0] != self.step:
            return None, None, ""
        (s0, v0), (s1, v1) = self.val[-k - 1], self.val[-1]
        t0, t1 = self._score_at(s0), self._score_at(s1)
        if t0 is None or t1 is None:
            return None, None, ""
        d_train, d_val = t1 - t0, v1 - v0
        text = (
            f"train score {_fmt(t0)} -> {_fmt(t1)} (+{d_train:.3g}, threshold +{self.cfg.train_rise_min}) while "
            f"validation accuracy {_fmt(v0)} -> {_fmt(v1)} ({d_val:+.3g}) between steps {s0} and {s1}"
        )
        return d_train >= self.cfg.train_rise_min and d_val <= self.cfg.val_stall_delta, d_train - d_val, text

    def _score_at(self, step: int) -> float | None:
        """Mean train score of the `window` steps up to `step` (the first ones for step 0)."""
        pts = [(s, v) for s, v in self._values("score") if s <= step][-self.cfg.window :]
        if not pts and step <= 0:
            pts = self._values("score")[: self.cfg.window]
        return float(np.mean([v for _, v in pts])) if pts else None

    def _check_tool_call_collapse(self):
        sn, sc = self._start_now("tool_rate"), self._start_now("score")
        if sn is None or sc is None or sn[0] < 0.05:
            return None, None, ""
        ratio = sn[1] / sn[0]
        holds = sc[1] >= sc[0] - self.cfg.reward_hold_tolerance
        text = f"tool-call rate {sn[2]}: {ratio:.2f}x (threshold {self.cfg.tool_rate_drop_ratio}x) while score {sc[2]}"
        return ratio <= self.cfg.tool_rate_drop_ratio and holds, ratio, text

    def _check_rollout_mismatch(self):
        pts = self._values("mismatch")[-self.cfg.window :]
        if "mismatch" not in self._now or not pts:
            return None, None, ""
        level = float(np.median([abs(v) for _, v in pts]))
        first = self._values("mismatch")[0]
        text = (
            f"rollout_mismatch/kl_k3 median {_fmt(level)} over {_span(pts)} "
            f"(threshold {self.cfg.mismatch_kl_max}; {_fmt(abs(first[1]))} at step {first[0]})"
        )
        return level > self.cfg.mismatch_kl_max, level, text

    def _spike(self, name: str, floor: float) -> tuple[bool | None, float | None, str]:
        pts = self._values(name)
        if name not in self._now or not math.isfinite(self._now[name]) or len(pts) <= SPIKE_MIN_HISTORY:
            return None, None, ""
        # magnitudes: the k1 KL estimator is signed and noisy around 0
        hist = [abs(v) for _, v in pts[:-1][-self.cfg.spike_history :]]
        med, cur = float(np.median(hist)), abs(pts[-1][1])
        if med <= 0:
            return None, None, ""
        ratio = cur / med
        text = f"{INPUTS[name][0]} {_fmt(cur)} is {ratio:.1f}x the median {_fmt(med)} of the previous {len(hist)} steps"
        return ratio > self.cfg.spike_factor and cur > floor, ratio, text

    def _check_kl_spike(self):
        return self._spike("kl", self.cfg.kl_spike_min)

    def _check_grad_norm_spike(self):
        found = [r for r in (self._spike("grad_norm", 0.0), self._spike("critic_grad_norm", 0.0)) if r[0] is not None]
        if not found:
            return None, None, ""
        return max(found, key=lambda r: (r[0], r[1]))

    def _check_nonfinite(self):
        n = self._now.get("nonfinite")
        if n is None:
            return None, None, ""
        return n > 0, n, f"{n:g} non-finite loss/gradient skips or non-finite grad norms this step"

    def _check_dead_signal(self):
        share = self._now.get("health/dead_group_share")
        if share is None:
            return None, None, ""
        text = (
            f"{share:.0%} of the groups have all-equal rewards below the solved score (zero advantage; "
            f"threshold {self.cfg.dead_group_share_max:.0%}), score {_fmt(self._now.get('score'))}"
        )
        return share > self.cfg.dead_group_share_max, share, text

    # ------------------------------------------------------------------ the step
    def _patience(self, name: str) -> tuple[int, int]:
        """(steps to trip, healthy steps to clear): spikes and skips trip at once; the validation
        signal counts validations."""
        if name in IMMEDIATE:
            return 1, self.cfg.clear_after
        if name == "reward_val_divergence":
            return 1, min(self.cfg.clear_after, 2)
        return self.cfg.patience, self.cfg.clear_after

    def observe(self, step: int, metrics: dict[str, Any]) -> tuple[dict[str, float], list[Trip]]:
        """Take step `step`'s metrics; returns the `health/<signal>` values and
        `health/<signal>/active` flags of this step, and the signals that tripped at it."""
        self.step = step
        self._record(step, metrics)
        out: dict[str, float] = {}
        trips: list[Trip] = []
        for name in HEALTH_SIGNALS:
            cond, value, evidence = getattr(self, f"_check_{name}")()
            if value is not None and math.isfinite(value):
                out[f"health/{name}"] = float(value)
                self.history[name].append((step, float(value)))
            trip = self._advance(name, cond, step, evidence)
            if trip is not None:
                trips.append(trip)
            out[f"health/{name}/active"] = float(self.states[name].active)
        out["health/active"] = float(sum(st.active for st in self.states.values()))
        self.trips.extend(trips)
        return out, trips

    def _advance(self, name: str, cond: bool | None, step: int, evidence: str) -> Trip | None:
        st = self.states[name]
        if cond is None:
            return None
        to_trip, to_clear = self._patience(name)
        if cond:
            st.bad, st.good = st.bad + 1, 0
            if not st.active and st.bad >= to_trip:
                st.active = True
                st.episodes.append([step, None])
                since = f" (for {st.bad} steps)" if st.bad > 1 else ""
                return Trip(name, step, evidence + since, action_of(self.cfg, name))
        else:
            st.good, st.bad = st.good + 1, 0
            if st.active and st.good >= to_clear:
                st.active = False
                st.episodes[-1][1] = step
        return None

    def active(self) -> list[str]:
        return [name for name, st in self.states.items() if st.active]

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "series": {k: [list(p) for p in v] for k, v in self.series.items()},
            "val": [list(p) for p in self.val],
            "states": {k: vars(st).copy() for k, st in self.states.items()},
            "history": {k: [list(p) for p in v] for k, v in self.history.items()},
            "trips": [vars(t).copy() for t in self.trips],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.series = {k: [tuple(p) for p in v] for k, v in state.get("series", {}).items()}
        self.val = [tuple(p) for p in state.get("val", [])]
        for k, st in state.get("states", {}).items():
            if k in self.states:
                self.states[k] = SignalState(**st)
        for k, v in state.get("history", {}).items():
            if k in self.history:
                self.history[k] = [tuple(p) for p in v]
        self.trips = [Trip(**t) for t in state.get("trips", []) if t.get("signal") in REMEDIES]
