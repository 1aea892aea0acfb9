"""Supervised fine-tuning with upstream main's entry point and config (`sft_trainer_engine.yaml`):

    python -m verl.trainer.sft_trainer data.train_files=... model.path=... [engine=fsdp] ...
    torchrun --standalone --nproc_per_node=N -m verl.trainer.sft_trainer ...

One process without torchrun (a one-process gloo/nccl group is created), N processes under it. The
model is built as the RL actor is (`build_fsdp_model`: FSDP2, gradient checkpointing, a LoRA adapter
with `model.lora_rank > 0`), and trained by the RL engine (`DataParallelEngine.train`): padding-free
micro-batches of `data.micro_batch_size_per_gpu` rows or, with `data.use_dynamic_bsz`, of at most
`data.max_token_len_per_gpu` tokens; the loss (`sft_loss`) is the exact token mean over the trained
tokens of the whole global batch, whatever the split. Data: `MultiTurnSFTDataset` (conversations,
loss on assistant turns only; single-turn prompt/response rows too).

Steps: `data.train_batch_size` sequences per optimizer step (split over the processes), for
`trainer.total_training_steps` or `trainer.total_epochs` epochs. Validation loss (token mean over
the whole validation set) every `trainer.test_freq` steps and at the end.

Checkpoints (every `trainer.save_freq` steps and at the end) have the RL trainer's guarantees
(`verl.trainer.ppo.checkpoint`): written under a hidden directory and renamed when complete, a
manifest with every file's SHA-256 (verified before resuming), `.pt` files loaded with
`weights_only=True`, the tracker file written last. Layout of `global_step_N/`:

    huggingface/                 the model (and tokenizer) as a Hugging Face directory
    lora_adapter/                with LoRA: the adapter in peft format (huggingface/ is merged)
    optim.pt, extra_state_world_size_W_rank_R.pt, checkpoint_meta.json   (FSDPCheckpointManager)
    data_R.pt                    rank R's data-loader position
    trainer_state.pt             global step, tokens so far, world size
    manifest.json

Resume (`trainer.resume_mode=auto|resume_path`) is exact, mid-epoch and at an epoch boundary: N
steps in one run equal N/2 steps, a restart and N/2 more (losses and weights), with the same number
of processes.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from functools import partial
from types import SimpleNamespace

import hydra
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from verl.trainer.sft_checkpoint import SFTCheckpointer
from verl.trainer.sft_config import check_sft_config, fsdp_engine_config, model_config, optimizer_config, resolve_freq

logger = logging.getLogger(__name__)

__all__ = ["SFTTrainer", "create_sft_dataset", "run_sft", "main"]


def create_sft_dataset(data_paths, data_config, tokenizer, processor=None, max_samples: int = -1):
    """`data.custom_cls` when set, else `MultiTurnSFTDataset` (upstream's name and signature)."""
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    custom = data_config.get("custom_cls") or {}
    cls = MultiTurnSFTDataset
    if custom.get("path"):
        from verl.utils.import_utils import load_extern_type

        cls = load_extern_type(custom["path"], custom.get("name"))
    return cls(data_paths, tokenizer=tokenizer, config=data_config, processor=processor, max_samples=max_samples)


def load_tokenizer(model_cfg):
    """The tokenizer of `model.tokenizer_path` (default `model.path`), with `custom_chat_template`
    and a pad token (eos when it has none)."""
    from transformers import AutoTokenizer

    path = model_cfg.get("tokenizer_path") or model_cfg.path
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=bool(model_cfg.get("trust_remote_code")))
    if model_cfg.get("custom_chat_template"):
        tokenizer.chat_template = model_cfg.custom_chat_template
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


class SFTTrainer:
    """Model, optimizer, schedule, data and checkpoints of one SFT run; `fit()` trains.

    Args:
        config: the full `sft_trainer_engine` config (checked with `check_sft_config`).
        tokenizer: saved with every checkpoint (default: loaded from `model.tokenizer_path` / `path`).
        train_dataset / val_dataset: default: `create_sft_dataset` of `data.train_files` / `val_files`.
    """

    def __init__(self, config, tokenizer=None, train_dataset=None, val_dataset=None):
        from verl.trainer.sft_config import resolve_sft_device

        self.config = config
        self.device = resolve_sft_device(config.trainer.device)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.model)
        d = config.data
        if train_dataset is None:
            train_dataset = create_sft_dataset(d.train_files, d, self.tokenizer, None, d.get("train_max_samples", -1))
            if d.get("val_files"):
                val_dataset = create_sft_dataset(d.val_files, d, self.tokenizer, None, d.get("val_max_samples", -1))
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        self.local_batch = check_sft_config(config, self.world_size, len(train_dataset))
        self._build_dataloader()
        tr = config.trainer
        self.steps_per_epoch = len(self.train_loader)
        total = tr.get("total_training_steps")
        self.total_steps = int(total) if total else int(tr.total_epochs) * self.steps_per_epoch
        if self.total_steps <= 0:
            raise ValueError(
                f"no training steps: {self.steps_per_epoch} steps per epoch x trainer.total_epochs={tr.total_epochs}"
            )
        self.save_freq = resolve_freq(tr.save_freq, "trainer.save_freq", self.steps_per_epoch)
        self.test_freq = resolve_freq(tr.test_freq, "trainer.test_freq", self.steps_per_epoch)
        self._build_model()
        self.global_step = 0
        self.total_tokens = 0
        self.history: list[dict] = []
        self.checkpointer = SFTCheckpointer(self)
        self.global_step = self.checkpointer.load()

    # -- building ------------------------------------------------------------------------------------
    def _build_dataloader(self) -> None:
        from torch.utils.data import DistributedSampler

        from verl.utils.dataset.dataloader import StatefulDataLoader
        from verl.utils.dataset.multiturn_sft_dataset import collate_sft_rows

        self.train_sampler = DistributedSampler(
            self.train_dataset,
            num_replicas=self.world_size,
            rank=self.rank,
            shuffle=True,
            seed=int(self.config.trainer.seed),
            drop_last=True,
        )
        self.collate = partial(collate_sft_rows, pad_token_id=self.tokenizer.pad_token_id)
        self.train_loader = StatefulDataLoader(
            self.train_dataset,
            batch_size=self.local_batch,
            sampler=self.train_sampler,
            collate_fn=self.collate,
            drop_last=True,
            num_workers=int(self.config.data.num_workers),
        )

    def _build_model(self) -> None:
        """The model as the RL actor builds it, its AdamW, schedule and data-parallel engine."""
        from verl.utils.fsdp_utils import build_lr_scheduler, build_optimizer, resolve_compute_dtype
        from verl.utils.model import build_causal_lm
        from verl.workers.engine.dp_engine import DataParallelEngine
        from verl.workers.engine.fsdp_model import build_fsdp_model

        cfg = self.config
        self.model_config = model_config(cfg.model)
        fsdp_config = fsdp_engine_config(cfg.engine, self.device)
        torch.manual_seed(int(cfg.engine.seed))
        self.model = build_fsdp_model(
            build_causal_lm,
            cfg.model.path,
            self.model_config,
            fsdp_config,
            self.device,
            self.world_size,
            train=True,
            lora_task="CAUSAL_LM",
        )
        self.model.config.use_cache = False
        self.optim_config = optimizer_config(cfg.optim, self.total_steps)
        self.optimizer = build_optimizer(self.model.parameters(), self.optim_config)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, self.optim_config)
        self.engine = DataParallelEngine(
            self.model,
            self.optimizer,
            None,
            resolve_compute_dtype(fsdp_config, self.device),
            bool(cfg.model.use_remove_padding),
            self.tokenizer.pad_token_id,
        )
        d = cfg.data
        # the engine's update settings: one mini-batch (the rank's share of the global batch) per step
        self.update_config = SimpleNamespace(
            ppo_epochs=1,
            shuffle=False,
            data_loader_seed=0,
            ppo_mini_batch_size=self.local_batch,
            ppo_micro_batch_size_per_gpu=int(d.micro_batch_size_per_gpu),
            use_dynamic_bsz=bool(d.use_dynamic_bsz),
            ppo_max_token_len_per_gpu=int(d.max_token_len_per_gpu),
            grad_clip=float(cfg.optim.clip_grad),
            loss_agg_mode="token-mean",
        )

    # -- one step ------------------------------------------------------------------------------------
    def _as_engine_batch(self, batch: dict):
        """The collated rows as the engine's TensorDict: every column is a "response" column
        (`responses` = `input_ids`, `response_mask` = `loss_mask` [b, T]); the logits at t - 1 predict
        token t, and token 0, which nothing predicts, is never trained."""
        from tensordict import TensorDict

        mask = batch["loss_mask"].clone()
        mask[:, 0] = 0
        td = {**batch, "responses": batch["input_ids"], "response_mask": mask}
        td.pop("loss_mask")
        return TensorDict(td, batch_size=[batch["input_ids"].shape[0]])

    def _forward(self, micro):
        """Log-probs [m, T] of every token given its prefix (0 where nothing is read)."""
        from verl.utils.torch_functional import logprobs_from_logits

        logits, valid, stats = self.engine.response_outputs(micro)
        log_probs = logprobs_from_logits(logits.float(), micro["responses"].to(logits.device))
        return {"log_probs": torch.where(valid, log_probs, torch.zeros_like(log_probs))}, stats

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        if self.world_size > 1:
            from verl.utils.fsdp_utils import collective_device

            t = t.to(collective_device(None))
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.cpu().tolist()

    def training_step(self, batch: dict) -> dict:
        """One optimizer step on this rank's share of the global batch; returns the step's metrics."""
        from verl.workers.engine.dp_engine import step_lr_scheduler
        from verl.workers.utils.losses import sft_loss

        td = self._as_engine_batch(batch)
        tokens, trained = self._sum_over_ranks([float(td["attention_mask"].sum()), float(td["response_mask"].sum())])
        if trained <= 0:
            raise ValueError("a training batch has no tokens to train on (every loss_mask is 0); check the data")
        out = self.engine.train(
            td, self._forward, partial(sft_loss, None), self.update_config, "train", row_separable=True
        )
        step_lr_scheduler(self.lr_scheduler)
        self.total_tokens += int(tokens)
        metrics = {name: values[-1] for name, values in out.metrics.items()}
        metrics["train/global_tokens"] = int(tokens)
        metrics["train/total_tokens(B)"] = self.total_tokens / 1e9
        metrics["train/trained_tokens"] = int(trained)
        return metrics

    @torch.no_grad()
    def validation_loss(self) -> float:
        """Token mean of -log p over the trained tokens of the whole validation set (all ranks)."""
        n = len(self.val_dataset)
        per_rank = -(-n // self.world_size)
        own = list(range(self.rank, n, self.world_size))
        # every rank runs the same micro-batches (FSDP forwards are collectives): short ranks repeat row 0
        # with its loss mask zeroed
        rows = [self.val_dataset[i] for i in own] + [self.val_dataset[0]] * (per_rank - len(own))
        batch = self.collate(rows)
        batch["loss_mask"][len(own) :] = 0
        td = self._as_engine_batch(batch)
        d = self.config.data
        out = self.engine.infer(
            td,
            self._forward,
            int(d.micro_batch_size_per_gpu),
            bool(d.use_dynamic_bsz),
            int(d.max_token_len_per_gpu),
        )
        nll = -(out.outputs["log_probs"].double() * td["response_mask"].double()).sum()
        total, count = self._sum_over_ranks([float(nll), float(td["response_mask"].sum())])
        return total / max(count, 1.0)

    # -- the loop ------------------------------------------------------------------------------------
    def fit(self) -> dict:
        """Train from `global_step` (0, or the resumed step) to `total_steps`.

        Returns {"final_checkpoint", "history" (this run's steps), "rank", "seconds", "global_step"}."""
        from verl.utils.tracking import Tracking

        tr = self.config.trainer
        tracking = None
        if self.rank == 0:
            tracking = Tracking(
                tr.project_name,
                tr.experiment_name,
                list(tr.logger) if not isinstance(tr.logger, str) else tr.logger,
                config=OmegaConf.to_container(self.config, resolve=True),
            )
        t0 = time.time()
        last_path = self.checkpointer.latest_path
        while self.global_step < self.total_steps:
            for batch in self.train_loader:
                last_path = self._step(batch, tracking) or last_path
                if self.global_step >= self.total_steps:
                    break
        if tracking is not None:
            tracking.finish()
        return {
            "final_checkpoint": last_path,
            "history": self.history,
            "rank": self.rank,
            "seconds": time.time() - t0,
            "global_step": self.global_step,
        }

    def _step(self, batch, tracking) -> str | None:
        t_step = time.time()
        metrics = self.training_step(batch)
        self.global_step += 1
        step = self.global_step
        metrics["train/epoch"] = (step - 1) // self.steps_per_epoch
        metrics["perf/time_per_step"] = time.time() - t_step
        is_last = step >= self.total_steps
        if self.val_dataset is not None and (is_last or (self.test_freq > 0 and step % self.test_freq == 0)):
            metrics["val/loss"] = self.validation_loss()
        self.history.append({"step": step, **metrics})
        if tracking is not None:
            tracking.log(metrics, step)
        if is_last or (self.save_freq > 0 and step % self.save_freq == 0):
            return self.checkpointer.save(step)
        return None


def run_sft(config) -> dict:
    """Check `config`, set up the process group, build an `SFTTrainer` and train (its `fit()`)."""
    from verl.trainer.fsdp_sft_trainer import init_process_group
    from verl.trainer.sft_config import resolve_sft_device

    if not isinstance(config, DictConfig):
        config = OmegaConf.create(config)
    for key in ("data.train_files", "model.path"):
        if OmegaConf.select(config, key) is None:
            raise ValueError(f"{key} is required (got null)")
    check_sft_config(config)
    if config.model.get("external_lib"):
        from verl.utils.import_utils import import_external_libs

        import_external_libs(config.model.external_lib)
    created = init_process_group(resolve_sft_device(config.trainer.device))
    try:
        return SFTTrainer(config).fit()
    finally:
        if created:
            dist.destroy_process_group()


def _refuse_other_engines(argv: list[str]) -> None:
    """`engine=megatron` (or `optim=megatron`, ...) on the command line: named before Hydra reads
    the group, which would fail on the group's own keys first."""
    for arg in argv:
        for group in ("engine", "optim"):
            if arg.startswith(f"{group}=") and arg.split("=", 1)[1] != "fsdp":
                raise SystemExit(
                    f"{arg}: the {arg.split('=', 1)[1]} engine is not available in this verl; sft_trainer runs "
                    f"{group}=fsdp (FSDP2) only"
                )


@hydra.main(config_path="config", config_name="sft_trainer_engine", version_base=None)
def _hydra_main(config: DictConfig) -> None:
    result = run_sft(config)
    if result["rank"] == 0:
        print(
            f"SFT finished at step {result['global_step']} in {result['seconds']:.1f}s; "
            f"final checkpoint: {result['final_checkpoint']}"
        )


def main() -> None:
    _refuse_other_engines(sys.argv[1:])
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    _hydra_main()


if __name__ == "__main__":
    main()
