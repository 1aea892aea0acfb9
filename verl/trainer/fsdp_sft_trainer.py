"""Supervised fine-tuning with FSDP2: `python -m verl.trainer.fsdp_sft_trainer key=value ...`.

One process (no torchrun needed: a single-process gloo/nccl group is created) or N processes under
`torchrun --nproc_per_node=N -m verl.trainer.fsdp_sft_trainer ...`. Config: `config/sft_trainer.yaml`.

What a step does (per process):
1. take `train_batch_size / world_size` sequences from a DistributedSampler shard (seeded per epoch);
2. split them into micro-batches of `micro_batch_size_per_gpu`; for each, next-token cross-entropy on
   response tokens only (`loss_mask` from `SFTDataset`);
3. the loss is the exact token mean over the whole global batch: every micro-batch contributes
   sum(nll * mask) / (response tokens in the global batch), times world_size because FSDP2 averages
   gradients across ranks; so the result does not depend on how the batch is split;
4. clip the global gradient norm, AdamW step (skipped, and counted, when the norm is not finite),
   scheduler step (linear warm-up then cosine/constant).

Validation (if `data.val_files`): token-mean loss over the whole validation set every
`trainer.test_freq` steps and at the end. The model and tokenizer are saved as a Hugging Face
directory `trainer.default_local_dir/global_step_{N}` every `trainer.save_freq` steps and at the end.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from dataclasses import dataclass, field

import hydra
import torch
import torch.distributed as dist
from omegaconf import DictConfig, ListConfig, OmegaConf
from torch.utils.data import DataLoader, DistributedSampler

from verl.trainer.ppo.utils import resolve_device
from verl.utils.fsdp_utils import build_lr_scheduler, build_optimizer, resolve_compute_dtype
from verl.utils.model import build_causal_lm
from verl.workers.config import FSDPEngineConfig, HFModelConfig, OptimizerConfig
from verl.workers.engine.dp_engine import step_lr_scheduler
from verl.workers.engine.fsdp_model import build_fsdp_model

logger = logging.getLogger(__name__)

__all__ = ["FSDPSFTTrainer", "create_sft_dataset", "run_sft", "main"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _resolve_device(name: str) -> str:
    if name not in ("auto", "cpu", "cuda"):
        raise ValueError(f"trainer.device={name!r} is not allowed; choose auto, cpu or cuda")
    return resolve_device(name)


def _local_batch(data, world_size: int, num_train: int) -> int:
    """Sequences per process and optimizer step, with the divisibility rules checked."""
    if data.train_batch_size % world_size:
        raise ValueError(
            f"data.train_batch_size={data.train_batch_size} must be divisible by the number of processes {world_size}"
        )
    local = data.train_batch_size // world_size
    if local % data.micro_batch_size_per_gpu:
        raise ValueError(
            f"data.micro_batch_size_per_gpu={data.micro_batch_size_per_gpu} must divide the per-process batch "
            f"{local} (= data.train_batch_size {data.train_batch_size} / {world_size} processes)"
        )
    if num_train < data.train_batch_size:
        raise ValueError(
            f"the SFT training set has {num_train} sequences, fewer than data.train_batch_size={data.train_batch_size}"
        )
    return local


def _optim_config(optim, total_steps: int) -> OptimizerConfig:
    """The SFT `optim` keys (upstream's SFT names) as the shared `OptimizerConfig`: AdamW, linear
    warm-up of `warmup_steps_ratio` x the optimizer steps, then cosine or constant."""
    if optim.lr_scheduler not in ("cosine", "constant"):
        raise ValueError(f"optim.lr_scheduler={optim.lr_scheduler!r} is not allowed; choose cosine or constant")
    return OptimizerConfig(
        lr=float(optim.lr),
        betas=tuple(optim.betas),
        eps=float(optim.get("eps", 1e-8)),
        weight_decay=float(optim.weight_decay),
        lr_warmup_steps_ratio=float(optim.warmup_steps_ratio),
        total_training_steps=int(total_steps),
        lr_scheduler_type=optim.lr_scheduler,
        min_lr_ratio=float(optim.get("min_lr_ratio", 0.0)),
    )


def _fsdp_config(fsdp_cfg) -> FSDPEngineConfig:
    """The SFT `model.fsdp_config` keys as the shared `FSDPEngineConfig`."""
    wrap_policy = fsdp_cfg.get("wrap_policy") or {}
    if isinstance(wrap_policy, DictConfig):
        wrap_policy = OmegaConf.to_container(wrap_policy, resolve=True)
    return FSDPEngineConfig(
        model_dtype=fsdp_cfg.get("model_dtype", "fp32"),
        cpu_autocast_bf16=bool(fsdp_cfg.get("cpu_autocast_bf16", False)),
        reshard_after_forward=bool(fsdp_cfg.get("reshard_after_forward", True)),
        wrap_policy=dict(wrap_policy),
    )


def init_process_group(device: str) -> bool:
    """Initialise torch.distributed (gloo on cpu, nccl on cuda) unless it already is.

    Under torchrun the usual env variables are used; without them a single-process group on a free
    loopback port is created. Returns True when this call created the group (the caller destroys it).
    """
    if dist.is_initialized():
        return False
    backend = "nccl" if device == "cuda" else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend=backend)
    else:
        dist.init_process_group(backend=backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return True


def create_sft_dataset(data_paths, data_config, tokenizer):
    """`data.custom_cls` when set, else `SFTDataset` (upstream name and signature)."""
    from verl.utils.dataset.sft_dataset import SFTDataset

    custom = data_config.get("custom_cls") or {}
    cls = SFTDataset
    if custom.get("path"):
        from verl.utils.import_utils import load_extern_type

        cls = load_extern_type(custom["path"], custom.get("name"))
    return cls(data_paths, tokenizer=tokenizer, config=data_config)


@dataclass
class SFTState:
    global_step: int = 0
    epoch: int = 0
    skipped_steps: int = 0  # optimizer steps skipped because the gradient norm was not finite
    history: list[dict] = field(default_factory=list)


class FSDPSFTTrainer:
    """Holds model, optimizer, schedule and data of one SFT run; `fit()` trains.

    Args:
        config: the full SFT config (see sft_trainer.yaml).
        tokenizer: tokenizer saved next to the model at every checkpoint.
        train_dataset / val_dataset: map-style datasets returning the SFTDataset dict of tensors.
        device_mesh: optional 1-D device mesh; by default one over all ranks.
    """

    def __init__(self, config, tokenizer, train_dataset, val_dataset=None, device_mesh=None):
        self.config = config
        self.tokenizer = tokenizer
        self.device = _resolve_device(config.trainer.device)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.local_batch = _local_batch(config.data, self.world_size, len(train_dataset))
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        self.train_sampler = DistributedSampler(
            train_dataset,
            num_replicas=self.world_size,
            rank=self.rank,
            shuffle=bool(config.data.get("shuffle", True)),
            seed=int(config.data.get("seed", 1)),
            drop_last=True,
        )
        self.train_loader = DataLoader(
            train_dataset, batch_size=self.local_batch, sampler=self.train_sampler, drop_last=True, num_workers=0
        )
        self.steps_per_epoch = len(self.train_loader)
        tr = config.trainer
        self.total_steps = (
            int(tr.total_training_steps) if tr.get("total_training_steps") else tr.total_epochs * self.steps_per_epoch
        )
        if self.total_steps <= 0:
            raise ValueError(
                f"no training steps: {self.steps_per_epoch} steps per epoch x trainer.total_epochs={tr.total_epochs}"
            )
        torch.manual_seed(int(tr.seed))
        self._build_model(device_mesh)
        optim_config = _optim_config(config.optim, self.total_steps)
        self.optimizer = build_optimizer(self.model.parameters(), optim_config)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, optim_config)
        self.state = SFTState()
        self._tracking = None
        backends = [b for b in (tr.get("logger") or []) if b != "console"]
        self._console = "console" in (tr.get("logger") or [])
        if backends and self.rank == 0:
            from verl.utils.tracking import Tracking

            self._tracking = Tracking(
                tr.project_name, tr.experiment_name, backends, config=OmegaConf.to_container(config, resolve=True)
            )

    def _build_model(self, device_mesh) -> None:
        """The policy model as the RL workers build it (`build_fsdp_model`: gradient checkpointing,
        a LoRA adapter before sharding, FSDP2), from the SFT `model` keys."""
        model_cfg = self.config.model
        self.lora_config = _lora_model_config(model_cfg)
        model_config = self.lora_config or HFModelConfig(path=model_cfg.get("partial_pretrain"))
        model_config = dataclasses.replace(
            model_config,
            trust_remote_code=bool(model_cfg.get("trust_remote_code", False)),
            enable_gradient_checkpointing=bool(model_cfg.get("enable_gradient_checkpointing", False)),
        )
        fsdp_config = _fsdp_config(model_cfg.fsdp_config)
        self.model = build_fsdp_model(
            build_causal_lm,
            model_cfg.partial_pretrain,
            model_config,
            fsdp_config,
            self.device,
            self.world_size,
            train=True,
            lora_task="CAUSAL_LM",
            mesh=device_mesh,
        )
        self.model.config.use_cache = False  # training: no KV cache (save_checkpoint writes True)
        self.compute_dtype = resolve_compute_dtype(fsdp_config, self.device)

    # ------------------------------------------------------------------------------------------------
    def _autocast(self):
        from verl.utils.fsdp_utils import autocast_context

        return autocast_context(self.device, self.compute_dtype)

    def _nll_sum(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Sum of response-token NLL and the number of response tokens of one micro-batch.

        batch tensors are (b, max_length); logits (b, max_length, vocab); the loss uses positions
        0..max_length-2 predicting tokens 1..max_length-1, weighted by loss_mask[:, :-1].
        """
        input_ids = batch["input_ids"].to(self.device)
        attention_mask = batch["attention_mask"].to(self.device)
        position_ids = batch["position_ids"].to(self.device)
        loss_mask = batch["loss_mask"][:, :-1].to(self.device)
        with self._autocast():
            logits = self.model(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            ).logits
        logits = logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1), reduction="none"
        ).view_as(loss_mask)
        return (nll * loss_mask).sum(), loss_mask.sum()

    def _all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        value = value.detach().to(self.device, torch.float64 if self.device == "cpu" else torch.float32)
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value

    def training_step(self, batch: dict) -> dict:
        """One optimizer step on this process's share of the global batch; returns metrics."""
        from verl.utils.fsdp_utils import clip_grad_norm_

        self.model.train()
        mbs = self.config.data.micro_batch_size_per_gpu
        n = batch["input_ids"].shape[0]
        global_tokens = self._all_reduce_sum(batch["loss_mask"][:, :-1].sum()).item()
        if global_tokens <= 0:
            raise ValueError("a training batch has no response tokens (every loss_mask is 0); check the data")
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float64)
        for start in range(0, n, mbs):
            micro = {k: v[start : start + mbs] for k, v in batch.items()}
            nll_sum, _ = self._nll_sum(micro)
            # exact global token mean; x world_size undoes FSDP2's gradient averaging over ranks
            (nll_sum * (self.world_size / global_tokens)).backward()
            loss_sum += nll_sum.detach().double().cpu()
        loss = self._all_reduce_sum(loss_sum).item() / global_tokens
        grad_norm = clip_grad_norm_(self.model.parameters(), self.config.optim.clip_grad)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            self.state.skipped_steps += 1
            logger.warning(
                "step %d: gradient norm is %s, optimizer step skipped", self.state.global_step + 1, grad_norm.item()
            )
        lr = self.lr_scheduler.get_last_lr()[0]
        step_lr_scheduler(self.lr_scheduler)
        self.optimizer.zero_grad(set_to_none=True)
        return {
            "train/loss": loss,
            "train/grad_norm": float(grad_norm),
            "train/lr": lr,
            "train/response_tokens": global_tokens,
        }

    @torch.no_grad()
    def validation_loss(self) -> float:
        """Token-mean response NLL over the whole validation set (all ranks together)."""
        if self.val_dataset is None:
            raise ValueError("no validation set (data.val_files is null)")
        self.model.eval()
        mbs = self.config.data.micro_batch_size_per_gpu
        n = len(self.val_dataset)
        own = list(range(self.rank, n, self.world_size))  # every sample on exactly one rank
        # FSDP2 forwards are collectives: every rank runs the same number of micro-batches; short ones
        # are filled with a repeat of sample 0 whose loss mask is zeroed.
        per_rank = -(-n // self.world_size)
        total = torch.zeros(2, dtype=torch.float64)
        for start in range(0, per_rank, mbs):
            chunk = own[start : start + mbs]
            weights = [1.0] * len(chunk) + [0.0] * (mbs - len(chunk))
            chunk = chunk + [0] * (mbs - len(chunk))
            items = [self.val_dataset[i] for i in chunk]
            batch = {k: torch.stack([it[k] for it in items]) for k in items[0]}
            batch["loss_mask"] = batch["loss_mask"] * torch.tensor(weights)[:, None]
            nll_sum, tokens = self._nll_sum(batch)
            total += torch.stack([nll_sum.double().cpu(), tokens.double().cpu()])
        total = self._all_reduce_sum(total)
        return (total[0] / total[1].clamp_min(1)).item()

    def save_checkpoint(self, step: int) -> str:
        """Write the full model (safetensors) and tokenizer to default_local_dir/global_step_{step}.

        LoRA: the directory holds the merged model (base + adapter, loads without peft), and
        `lora_adapter/` the adapter in peft format (the RL trainer's `model.lora_adapter_path`).
        """
        from verl.utils.fsdp_utils import get_full_state_dict, get_lora_merged_state_dict

        path = os.path.join(self.config.trainer.default_local_dir, f"global_step_{step}")
        state_dict = get_full_state_dict(self.model, rank0_only=True)  # collective
        model_to_save = self.model
        if self.lora_config is not None:
            from verl.utils.checkpoint.fsdp_checkpoint_manager import save_lora_adapter

            if self.rank == 0:
                save_lora_adapter(self.model, state_dict, os.path.join(path, "lora_adapter"), self.tokenizer)
            state_dict = get_lora_merged_state_dict(self.model, rank0_only=True)  # collective
            model_to_save = self.model.get_base_model()
        if self.rank == 0:
            os.makedirs(path, exist_ok=True)
            model_to_save.config.use_cache = True
            model_to_save.save_pretrained(path, state_dict=state_dict)
            model_to_save.config.use_cache = False
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(path)
                _pin_tokenizer_class(path, self.tokenizer)
            with open(
                os.path.join(self.config.trainer.default_local_dir, "latest_checkpointed_iteration.txt"), "w"
            ) as f:
                f.write(str(step))
        dist.barrier()
        return path

    # ------------------------------------------------------------------------------------------------
    def _log(self, metrics: dict, step: int) -> None:
        self.state.history.append({"step": step, **metrics})
        if self.rank != 0:
            return
        if self._tracking is not None:
            self._tracking.log(metrics, step)
        tr = self.config.trainer
        if self._console and (
            step % max(1, int(tr.get("log_freq", 10))) == 0 or step == self.total_steps or "val/loss" in metrics
        ):
            shown = " | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
            print(f"sft step {step}/{self.total_steps} | {shown}", flush=True)

    def fit(self) -> dict:
        """Train for `total_steps`; returns {"final_checkpoint", "history", "rank", "skipped_steps", "seconds"}."""
        tr = self.config.trainer
        t0 = time.time()
        last_path = None
        while self.state.global_step < self.total_steps:
            self.train_sampler.set_epoch(self.state.epoch)
            for batch in self.train_loader:
                t_step = time.time()
                metrics = self.training_step(batch)
                self.state.global_step += 1
                step = self.state.global_step
                metrics["train/epoch"] = self.state.epoch
                metrics["perf/time_per_step"] = time.time() - t_step
                is_last = step >= self.total_steps
                if self.val_dataset is not None and ((tr.test_freq > 0 and step % tr.test_freq == 0) or is_last):
                    metrics["val/loss"] = self.validation_loss()
                self._log(metrics, step)
                if is_last or (tr.save_freq > 0 and step % tr.save_freq == 0):
                    last_path = self.save_checkpoint(step)
                if is_last:
                    break
            self.state.epoch += 1
        if self._tracking is not None:
            self._tracking.finish()
        return {
            "final_checkpoint": last_path,
            "history": self.state.history,
            "rank": self.rank,
            "skipped_steps": self.state.skipped_steps,
            "seconds": time.time() - t0,
        }


def _lora_model_config(model_cfg):
    """The validated LoRA keys of the SFT `model` section (the RL trainer's names) as an
    `HFModelConfig`, or None without LoRA (`lora_rank` 0 and no `lora_adapter_path`)."""
    from verl.workers.config.model import HFModelConfig

    def plain(value):
        return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value

    cfg = HFModelConfig(
        path=model_cfg.get("partial_pretrain"),
        lora_rank=int(model_cfg.get("lora_rank", 0) or 0),
        lora_alpha=int(model_cfg.get("lora_alpha", 16)),
        target_modules=plain(model_cfg.get("target_modules", "all-linear")),
        exclude_modules=plain(model_cfg.get("exclude_modules")),
        lora_adapter_path=model_cfg.get("lora_adapter_path"),
    )
    return cfg if cfg.use_lora else None


def _pin_tokenizer_class(path: str, tokenizer) -> None:
    """Record the tokenizer's own class in tokenizer_config.json.

    transformers 5 may otherwise pick a tokenizer class from the model's config.json (e.g. Qwen2 ->
    Qwen2Tokenizer) that rebuilds the pipeline differently from tokenizer.json.
    """
    import json

    cfg_path = os.path.join(path, "tokenizer_config.json")
    if not os.path.exists(cfg_path):
        return
    with open(cfg_path) as f:
        cfg = json.load(f)
    name = type(tokenizer).__name__
    if name == "TokenizersBackend":  # what PreTrainedTokenizerFast resolves to in transformers 5
        name = "PreTrainedTokenizerFast"
    if cfg.get("tokenizer_class") != name:
        cfg["tokenizer_class"] = name
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=2, ensure_ascii=False)
            f.write("\n")


def run_sft(config) -> dict:
    """Build tokenizer, datasets and trainer from `config` and train (returns `FSDPSFTTrainer.fit()`)."""
    from transformers import AutoTokenizer

    if not isinstance(config, DictConfig):
        config = OmegaConf.create(config)
    for key in ("data.train_files", "model.partial_pretrain"):
        if OmegaConf.select(config, key) is None:
            raise ValueError(f"{key} is required (got null)")
    if config.trainer.get("torch_threads"):
        torch.set_num_threads(int(config.trainer.torch_threads))
    if config.model.get("external_lib"):
        from verl.utils.import_utils import import_external_libs

        import_external_libs(config.model.external_lib)
    device = _resolve_device(config.trainer.device)
    created = init_process_group(device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            config.model.partial_pretrain, trust_remote_code=bool(config.model.trust_remote_code)
        )
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        train_ds = create_sft_dataset(config.data.train_files, config.data, tokenizer)
        val_ds = (
            create_sft_dataset(config.data.val_files, config.data, tokenizer) if config.data.get("val_files") else None
        )
        trainer = FSDPSFTTrainer(config, tokenizer, train_ds, val_ds)
        return trainer.fit()
    finally:
        if created:
            dist.destroy_process_group()


@hydra.main(config_path="config", config_name="sft_trainer", version_base=None)
def main(config: DictConfig) -> None:
    result = run_sft(config)
    if result["rank"] == 0:
        print(f"SFT finished in {result['seconds']:.1f}s; final model: {result['final_checkpoint']}")


if __name__ == "__main__":
    main()
