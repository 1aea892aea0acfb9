"""`Validator`: when the trainer validates, and the validation pass itself.

The validation set is generated with `rollout.val_kwargs` (through the same generation-input
helper as training), scored by the validation reward manager, and reduced to
`val-core/{data_source}/{reward|acc}/{mean@n, best@n, maj@n}` plus `val-aux/...` for the other
statistics, the extra-info columns and the multi-turn rollout figures.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from verl.protocol import DataProto
from verl.trainer.ppo.driver_ops import compute_response_mask, decode_rows, dp_compute, dump_rows
from verl.trainer.ppo.metric_utils import process_validation_metrics, reduce_metrics
from verl.trainer.ppo.reward import compute_reward
from verl.trainer.ppo.step_context import is_due


class Validator:
    """Validation cadence and pass of one `RayPPOTrainer` (which owns the workers and data).

    `validated_step` is the last step validated (a resumed run's current step counts: the run that
    wrote the checkpoint validated it), so a run that ends early is validated once at its end.
    """

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.validated_step: int | None = None

    def should_validate(self, step: int, is_last: bool) -> bool:
        """Every `trainer.test_freq` steps and at the last step, once per step, when there is a
        validation reward function."""
        t = self.trainer
        if t.val_reward_fn is None or step <= 0 or step == self.validated_step:
            return False
        return is_due(t.cfg.trainer.test_freq, step, is_last)

    def should_validate_before_training(self, step: int) -> bool:
        """`trainer.val_only` (validate the restored or initial policy, never train), or
        `trainer.val_before_train` on a fresh start."""
        tr = self.trainer.cfg.trainer
        return self.trainer.val_reward_fn is not None and (tr.val_only or (tr.val_before_train and step == 0))

    def validate(self) -> dict[str, float]:
        """Generate on the validation set with `rollout.val_kwargs`, score, log samples and dumps;
        returns the `val-core/...` and `val-aux/...` metrics (callbacks see them first)."""
        t = self.trainer
        data_sources: list[str] = []
        uids: list[str] = []
        infos: dict[str, list] = defaultdict(list)
        rows: list[dict] = []
        agent_val: dict[str, list[float]] = defaultdict(list)
        for b_idx, batch_dict in enumerate(t.val_dataloader):
            batch, extra, agent = self._generate_and_score(b_idx, batch_dict)
            for k, v in agent.items():
                agent_val[k].append(v)
            infos["reward"].extend(batch.batch["token_level_scores"].sum(-1).tolist())
            for k, v in extra.items():
                infos[k].extend(v)
            data_sources.extend(batch.non_tensor_batch.get(t.cfg.data.reward_fn_key, ["unknown"] * len(batch)))
            uids.extend(batch.non_tensor_batch["uid"])
            batch_rows = decode_rows(batch, t.tokenizer, t.global_steps)
            rows.extend(batch_rows)
            if "pred" not in extra:
                # majority vote (maj@n) needs each response's answer; without a `pred` from the scorer,
                # the whitespace-stripped response text is the answer
                infos["pred"].extend(r["output"].strip() for r in batch_rows)
        self._log_generations(rows)
        infos = {k: v for k, v in infos.items() if len(v) == len(data_sources)}
        metrics = validation_metrics(process_validation_metrics(data_sources, uids, infos))
        for k, v in agent_val.items():
            metrics[f"val-aux/{k}"] = float(np.mean(v))
        for cb in t.callbacks:
            cb.on_validation(t, metrics)
        return metrics

    def _generate_and_score(self, b_idx: int, batch_dict: dict) -> tuple[DataProto, dict, dict[str, float]]:
        """One validation batch: `val_kwargs.n` greedy (by default) responses per prompt, scored.
        Returns the batch (with `token_level_scores`), the scorer's extra columns and the
        rollout's multi-turn figures (`agent/...`, `num_turns/...`)."""
        t = self.trainer
        batch = DataProto.from_single_dict(batch_dict)
        batch.non_tensor_batch["uid"] = np.array([f"val-{b_idx}-{i}" for i in range(len(batch))], dtype=object)
        batch = batch.repeat(repeat_times=t.cfg.rollout.val_kwargs.n, interleave=True)
        gen_in = t._generation_input(batch, validate=True)
        out = dp_compute(t.generation_wg, "generate_sequences", gen_in)
        out.meta_info.pop("timing", None)
        rollout_metrics = reduce_metrics(out.meta_info.pop("metrics", None) or {})
        agent = {k: v for k, v in rollout_metrics.items() if k.startswith(("agent/", "num_turns/"))}
        batch = batch.union(out)
        if "response_mask" not in batch.batch.keys():
            batch.batch["response_mask"] = compute_response_mask(batch)
        if t.use_rm:
            batch = batch.union(dp_compute(t.rm_wg, "compute_rm_score", batch))
        scores, extra = compute_reward(batch, t.val_reward_fn)
        batch.batch["token_level_scores"] = scores
        return batch, extra, agent

    def _log_generations(self, rows: list[dict]) -> None:
        """`trainer.log_val_generations` fixed samples to the loggers; every row to
        `trainer.validation_data_dir/<step>.jsonl`."""
        t = self.trainer
        tr = t.cfg.trainer
        if tr.log_val_generations and rows:
            from verl.utils.tracking import ValidationGenerationsLogger

            samples = [(r["input"], r["output"], r["score"]) for r in rows]
            rng = np.random.RandomState(42)  # the same samples every validation: comparable over time
            pick = sorted(rng.permutation(len(samples))[: tr.log_val_generations].tolist())
            ValidationGenerationsLogger(t.tracking.log_dir).log(
                tr.logger, [samples[i] for i in pick], t.global_steps, t.tracking
            )
        if tr.validation_data_dir:
            dump_rows(rows, tr.validation_data_dir, t.global_steps)


def validation_metrics(nested: dict[str, dict[str, dict[str, Any]]]) -> dict[str, float]:
    """Flatten `process_validation_metrics` output (data source -> variable -> statistic) to
    metric names: `val-core/...` for the mean / maj / best of `reward` and `acc` at the largest
    `n`, `val-aux/...` for everything else."""
    metrics: dict[str, float] = {}
    for ds, var2 in nested.items():
        for var, stats in var2.items():
            n_max = max(int(name.split("@")[1].split("/")[0]) for name in stats)
            for name, val in stats.items():
                core = (
                    var in ("reward", "acc")
                    and f"@{n_max}" in name
                    and any(name.startswith(p) for p in ("mean", "maj", "best"))
                )
                metrics[f"{'val-core' if core else 'val-aux'}/{ds}/{var}/{name}"] = val
    return metrics
