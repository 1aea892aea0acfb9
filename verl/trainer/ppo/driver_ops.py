"""Driver-side batch operations of the PPO loop: pure functions on `DataProto` (CPU tensors).

KL in the reward, advantages through the estimator registry, the generation input, dynamic
sampling's group selection and trimming, prompt padding alignment, row-wise worker calls, and
the decoded rows of a batch (rollout dumps, validation samples). `ray_trainer` re-exports the
upstream names (`compute_response_mask`, `apply_kl_penalty`, `compute_advantage`).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto, DataProtoConfig
from verl.trainer.ppo import core_algos
from verl.utils.py_functional import config_get
from verl.utils.torch_functional import masked_mean, response_span
from verl.utils.tracking import to_jsonable


def compute_response_mask(data: DataProto) -> torch.Tensor:
    """[B, R] mask of the response tokens: the last R columns of `attention_mask`."""
    width = data.batch["responses"].shape[-1]
    return data.batch["attention_mask"][:, -width:]


def apply_kl_penalty(data: DataProto, kl_ctrl, kl_penalty: str = "kl") -> tuple[DataProto, dict[str, float]]:
    """KL in the reward: `token_level_rewards = token_level_scores - beta * kl(old_log_probs, ref_log_prob)`.

    `beta` is the controller's current value; the controller is then updated with the batch's
    mean per-sequence KL (masked mean over valid tokens, then mean over sequences).
    Reads `token_level_scores`, `old_log_probs`, `ref_log_prob`, `response_mask` [B, R]; writes
    `token_level_rewards` [B, R].
    """
    mask = data.batch["response_mask"]
    kld = core_algos.kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty=kl_penalty)
    kld = kld * mask
    beta = kl_ctrl.value
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - beta * kld
    current_kl = masked_mean(kld, mask, axis=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def _accepted_kwargs(fn, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` restricted to the parameters `fn` declares, unless it takes `**kwargs`: an
    estimator written for upstream (fixed parameter list) must not fail on our extra inputs."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return kwargs
    names = {
        p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return {k: v for k, v in kwargs.items() if k in names}


AGENT_FIELDS = ("agent_name", "extra_info", "tools_kwargs", "index")


def _add_agent_fields(gen_in: DataProto, batch: DataProto) -> None:
    """Per-sample fields the agent loops read (`agent_name`, `extra_info.tools_kwargs`, ...),
    copied into the generation input; the batch keeps them for the reward."""
    for key in AGENT_FIELDS:
        if key in batch.non_tensor_batch:
            gen_in.non_tensor_batch[key] = batch.non_tensor_batch[key]


def compute_advantage(
    data: DataProto,
    adv_estimator: str,
    gamma: float = 1.0,
    lam: Any = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> DataProto:
    """`advantages`, `returns` [B, R] from the estimator registered as `adv_estimator`.

    Precedence of the explicit arguments, as upstream: `gamma`/`lam` are used by `gae` and
    `norm_adv_by_std_in_grpo` by `grpo`; every other estimator reads these values from `config`
    (`algorithm`), so the defaults of this function never override the config (with
    `config=None` the explicit values are passed on instead).

    The estimator gets by keyword what it may need (`token_level_rewards`, `response_mask`,
    `index` = uid array, `config`, and when in the batch `values`, `reward_baselines`,
    `token_level_scores`, `turn_ids`, `step_end_mask`, `old_log_probs`, `sum_pi_squared`,
    `rollout_is_weights`; `non_tensor_batch` and `batch` for `gdpo`); an estimator without
    `**kwargs` gets only the parameters it declares. With `algorithm.use_pf_ppo` (gae only, as
    upstream) the batch is then resampled by `core_algos.compute_pf_ppo_reweight_data`.
    (`num_repeat` is accepted for upstream compatibility: groups come from `uid`.)
    """
    if "response_mask" not in data.batch.keys():
        data.batch["response_mask"] = compute_response_mask(data)
    name = adv_estimator.value if isinstance(adv_estimator, core_algos.AdvantageEstimator) else adv_estimator
    fn = core_algos.get_adv_estimator_fn(name)
    kwargs: dict[str, Any] = dict(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch.get("uid"),
        config=config,
    )
    if name == "gae" or config is None:
        kwargs.update(gamma=gamma, lam=lam)
    if name == "grpo" or config is None:
        kwargs["norm_adv_by_std_in_grpo"] = norm_adv_by_std_in_grpo
    for key in (
        "values",
        "reward_baselines",
        "token_level_scores",
        "turn_ids",
        "step_end_mask",
        "old_log_probs",
        "sum_pi_squared",
        "rollout_is_weights",
    ):
        if key in data.batch.keys():
            kwargs[key] = data.batch[key]
    if name == "gdpo":
        kwargs["non_tensor_batch"] = data.non_tensor_batch
        kwargs["batch"] = data.batch
    advantages, returns = fn(**_accepted_kwargs(fn, kwargs))
    data.batch["advantages"] = advantages.detach()
    data.batch["returns"] = returns.detach()
    if name == "gae" and config is not None and config_get(config, "use_pf_ppo", False):
        pf = config_get(config, "pf_ppo", None)
        data = core_algos.compute_pf_ppo_reweight_data(
            data, config_get(pf, "reweight_method", "pow"), config_get(pf, "weight_pow", 2.0)
        )
    return data


FILTER_SCORE_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")


GEN_BATCH_KEYS = ("input_ids", "attention_mask", "position_ids")
GEN_NON_TENSOR_KEYS = ("raw_prompt_ids", "raw_prompt", "multi_modal_data")


def generation_input(batch: DataProto, meta: dict[str, Any]) -> DataProto:
    """The rollout's input, popped from `batch` (repeated prompts): the prompt tensors
    `input_ids` / `attention_mask` / `position_ids` [B, P] with the all-padding leading columns
    dropped (`trim_left_padding`), the raw prompts and multi-modal data, the agent loops' per-row
    fields (copied: the batch keeps them for the reward), and `meta` in `meta_info`. Training and
    validation build their generation input here, so prompts are prepared one way."""
    gen_keys = [k for k in GEN_BATCH_KEYS if k in batch.batch.keys()]
    nt_keys = [k for k in GEN_NON_TENSOR_KEYS if k in batch.non_tensor_batch]
    gen_in = trim_left_padding(batch.pop(batch_keys=gen_keys, non_tensor_batch_keys=nt_keys))
    _add_agent_fields(gen_in, batch)
    gen_in.meta_info.update(meta)
    return gen_in


def decode_rows(batch: DataProto, tokenizer, step: int) -> list[dict]:
    """One dict per row of a scored batch: `step`, `input` (the prompt text), `output` (the
    response up to its last valid token), `score` (summed `token_level_scores`), `ground_truth`
    and, for multi-turn rollouts, `trace`. Reads `prompts` [B, P], `responses` / `response_mask`
    [B, R] and `attention_mask` [B, P+R]."""
    width = batch.batch["responses"].shape[-1]
    prompt_mask = batch.batch["attention_mask"][:, :-width].bool()
    resp_lens = response_span(batch.batch["response_mask"]).tolist()
    prompts = tokenizer.batch_decode(
        [batch.batch["prompts"][i][prompt_mask[i]].tolist() for i in range(len(batch))], skip_special_tokens=True
    )
    resps = tokenizer.batch_decode(
        [batch.batch["responses"][i, : int(n)].tolist() for i, n in enumerate(resp_lens)], skip_special_tokens=True
    )
    scores = batch.batch["token_level_scores"].sum(-1).tolist()
    gts = [
        rm.get("ground_truth") if isinstance(rm, dict) else None
        for rm in batch.non_tensor_batch.get("reward_model", [None] * len(batch))
    ]
    rows = [
        {"step": step, "input": p, "output": r, "score": s, "ground_truth": to_jsonable(g)}
        for p, r, s, g in zip(prompts, resps, scores, gts, strict=False)
    ]
    if "agent_trace" in batch.non_tensor_batch:  # multi-turn: turns, tool calls and results per sample
        for row, trace in zip(rows, batch.non_tensor_batch["agent_trace"], strict=False):
            row["trace"] = to_jsonable(trace)
    return rows


def dump_rows(rows: list[dict], out_dir: str, step: int) -> str:
    """Write `rows` as `<out_dir>/<step>.jsonl` (one JSON object per line); returns the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{step}.jsonl")
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return path


def select_groups_with_variance(batch: DataProto, metric: str) -> tuple[DataProto, int, int]:
    """Rows of the groups (same `uid`) whose per-response `metric` is not constant.

    `metric` is a reward extra-info column (e.g. `acc`), or `score` / `seq_reward` /
    `seq_final_reward` for the summed `token_level_scores` (`acc` falls back to the score when
    the scorer reports no `acc`). The reward extra-info columns are those listed in
    `batch.meta_info["reward_extra_keys"]` (set by `compute_reward`; without it, any non-tensor
    column). An unknown metric fails, naming the metrics that exist. Returns (kept rows, kept
    groups, dropped groups).
    """
    reward_keys = batch.meta_info.get("reward_extra_keys")
    columns = (
        list(batch.non_tensor_batch) if reward_keys is None else [k for k in reward_keys if k in batch.non_tensor_batch]
    )
    if metric in columns:
        values = []
        for i, v in enumerate(batch.non_tensor_batch[metric]):
            try:
                values.append(float(v))
            except (TypeError, ValueError):
                raise ValueError(
                    f"algorithm.filter_groups.metric={metric!r}: row {i} holds {v!r}, not a number "
                    "(does the scoring function report it for every response?)"
                ) from None
    elif metric in FILTER_SCORE_METRICS:
        values = batch.batch["token_level_scores"].sum(-1).tolist()
    else:
        what = "columns of the batch" if reward_keys is None else "metrics the reward function reports"
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r} is not produced by this run's reward; {what}: "
            f"{sorted(columns)}, and from the summed score: {list(FILTER_SCORE_METRICS)}"
        )
    by_uid: dict[Any, list[float]] = defaultdict(list)
    for uid, v in zip(batch.non_tensor_batch["uid"], values, strict=False):
        by_uid[uid].append(v)
    keep_uids = {u for u, vs in by_uid.items() if len(vs) > 1 and np.std(vs) > 0}
    keep = [i for i, u in enumerate(batch.non_tensor_batch["uid"]) if u in keep_uids]
    return batch.select_idxs(np.array(keep, dtype=np.int64)), len(keep_uids), len(by_uid) - len(keep_uids)


def trim_to_whole_groups(
    batch: DataProto, max_groups: int, n: int, divisor: int, group_multiple: int = 1
) -> DataProto | None:
    """The first (in order of appearance) at most `max_groups` whole groups, fewer if needed so
    that groups * n rows split evenly over `divisor` data-parallel workers and the number of
    groups is a multiple of `group_multiple` (the mini-batch size in prompts, so the update's
    mini-batches are all full); None if no group fits."""
    uids = list(dict.fromkeys(batch.non_tensor_batch["uid"]))
    n_groups = min(len(uids), max_groups)
    while n_groups > 0 and ((n_groups * n) % divisor or n_groups % group_multiple):
        n_groups -= 1
    if n_groups == 0:
        return None
    keep_uids = set(uids[:n_groups])
    idx = [i for i, u in enumerate(batch.non_tensor_batch["uid"]) if u in keep_uids]
    return batch.select_idxs(np.array(idx, dtype=np.int64))


def trim_left_padding(data: DataProto, keys=("input_ids", "attention_mask", "position_ids")) -> DataProto:
    """Drop the leading columns that are padding in every row (left-padded prompts).

    Prompts are padded to `data.max_prompt_length`, usually far more than the longest prompt of a
    batch; the padding is masked, so removing the columns no row uses changes no result and
    saves the generation engine all the work on them (prefill and every decoding step attend to
    them). Position ids keep their values. In place; returns `data`.
    """
    mask = data.batch["attention_mask"]
    used = mask.bool().any(dim=0)
    if not bool(used.any()):
        return data
    first = int(used.int().argmax())
    if first > 0:
        for k in keys:
            if k in data.batch.keys():
                data.batch[k] = data.batch[k][..., first:]
    return data


def left_pad_prompts(data: DataProto, width: int, pad_token_id: int) -> DataProto:
    """Left-pad the prompt side of a generated batch to `width` prompt columns.

    Generation batches are trimmed to their own longest prompt (`trim_left_padding`), so two
    rounds of dynamic sampling can differ in prompt width; before they are concatenated both get
    the wider one. Pads `prompts` [B, P] and `input_ids` / `attention_mask` / `position_ids`
    [..., P+R] on the left (pad id, mask 0, position 0): masked columns change no result. In
    place; returns `data`.
    """
    extra = width - data.batch["prompts"].shape[-1]
    if extra <= 0:
        return data
    for key, value in (
        ("prompts", pad_token_id),
        ("input_ids", pad_token_id),
        ("attention_mask", 0),
        ("position_ids", 0),
    ):
        if key in data.batch.keys():
            data.batch[key] = torch.nn.functional.pad(data.batch[key], (extra, 0), value=value)
    return data


def concat_generated(parts: list[DataProto], pad_token_id: int) -> DataProto:
    """Concatenate generated batches whose prompt widths may differ (see `left_pad_prompts`)."""
    if all("prompts" in p.batch.keys() for p in parts):
        width = max(p.batch["prompts"].shape[-1] for p in parts)
        parts = [left_pad_prompts(p, width, pad_token_id) for p in parts]
    return DataProto.concat(parts)


def dp_compute(worker_group, method: str, data: DataProto) -> DataProto:
    """`worker_group.<method>(data)` for a row-wise inference call (generation, log-probs,
    values, reward-model scores) on a batch of any size.

    Padding is the dispatcher's (`Dispatch.DP_COMPUTE_PROTO` auto-padding, enabled for this call
    only through a view of `data` whose `meta_info` carries `DataProtoConfig.auto_padding_key`):
    rows are padded to a multiple of the group's workers and the padding rows dropped from the
    result. Training batches split evenly over the actor's workers, but not necessarily over a
    group of another size (`trainer.role_pools`), nor do validation batches. `data` itself is not
    modified, so a later update of the same batch is never padded (its batch is cut to whole
    groups that split evenly, see `trim_to_whole_groups`).
    """
    meta = {**data.meta_info, DataProtoConfig.auto_padding_key: True}
    out = getattr(worker_group, method)(
        DataProto(batch=data.batch, non_tensor_batch=data.non_tensor_batch, meta_info=meta)
    )
    out.meta_info.pop(DataProtoConfig.auto_padding_key, None)
    return out
