"""Worker classes driven by the trainer (upstream names): `ActorRolloutRefWorker`, `CriticWorker`,
`RewardModelWorker`.

Each is a `Worker` (one per process of a worker group) whose `@register`ed methods take and return
`DataProto`s. Data-parallel methods (`Dispatch.DP_COMPUTE_PROTO`) receive this rank's consecutive
chunk of the driver's batch; the group concatenates the results in rank order. `init_model`,
`save_checkpoint` and `load_checkpoint` run on every rank with the same arguments (ONE_TO_ALL).

Engine: FSDP2 over the group's default process group (gloo on CPU, nccl on CUDA) with one
process; a single process runs the plain module (see `verl.utils.fsdp_utils`).

Batch sizes (upstream semantics; the plan of `verl/workers/config/batch_plan.py`, handed over by the
trainer as `settings`, or derived in `__init__` for a worker built by hand, numbers named):
- `actor.ppo_mini_batch_size` counts prompts: inside the worker it becomes
  `ppo_mini_batch_size * rollout.n / world_size` sequences per rank (must divide exactly);
- `*_micro_batch_size_per_gpu` count sequences per rank and must divide the per-rank mini-batch;
- or `use_dynamic_bsz=True` with a token budget per rank (`ppo_max_token_len_per_gpu`, ...).

Temperature: `compute_log_prob` and `update_actor` divide logits by `meta_info["temperature"]`,
default `rollout.temperature`, the temperature the rollout sampled with (see dp_actor).

LoRA (`model.lora_rank > 0` or `model.lora_adapter_path`, peft): the actor and the critic wrap
their model in a peft adapter before sharding (frozen base, trainable adapter; see docs/lora.md).
The reference log-probs then come from the actor with the adapter disabled (no reference model
is built), the shared hf rollout samples from the adapter model itself, and an engine with its own
weights (`lora.merge`, a separate hf copy, vLLM) receives the merged weights W + delta_W.

Old log-probs shortcut: when `meta_info["use_current_as_old_log_prob"]` is True (valid only for
one mini-batch and one epoch, checked), `update_actor` uses the detached log-probs of its own
forward as `old_log_probs` (ratio exactly 1) and returns them as `old_log_probs` / `entropys`
in the output batch, with the usual metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.base.worker import Worker
from verl.utils.fsdp_utils import (
    all_reduce_scalar,
    build_lr_scheduler,
    build_optimizer,
    cpu_has_fast_bf16,
    get_full_state_dict,
    get_lora_merged_state_dict,
    resolve_compute_dtype,
)
from verl.utils.import_utils import import_external_libs
from verl.utils.model import (
    build_causal_lm,
    build_reward_model,
    build_value_model,
    compute_position_id_with_mask,
    is_peft_model,
    resolve_model_path,
    torch_dtype_from_name,
)
from verl.utils.tokenizer import hf_processor, hf_tokenizer
from verl.workers.config import ActorConfig, CriticConfig, HFModelConfig, RefConfig, RewardModelConfig, RolloutConfig
from verl.workers.config.batch_plan import WorkerSettings, default_loss_scale_factor
from verl.workers.engine.dp_engine import step_lr_scheduler
from verl.workers.engine.fsdp_model import build_fsdp_model
from verl.workers.separate_rollout import WeightSyncMixin
from verl.workers.worker_common import (  # the helpers every worker class shares
    _apply_batch_plan,
    _deterministic,
    _OffloadMixin,
    _reject_agent_names,
    _section,
    _setup_process,
    _to_dataclass,
    memory_metrics,
    worker_seed,
)

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "RewardModelWorker", "AsyncActorRolloutRefWorker"]

logger = logging.getLogger(__name__)

ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")


# ---------------------------------------------------------------------------------------------
# actor / rollout / reference
# ---------------------------------------------------------------------------------------------


class ActorRolloutRefWorker(Worker, _OffloadMixin, WeightSyncMixin):
    """Policy roles in one process: `actor` (training), `rollout` (generation), `ref` (frozen
    reference log-probs), or the combinations `actor_rollout`, `actor_rollout_ref`.

    Args:
        config: the `actor_rollout_ref` section (DictConfig or dict): `model`, `actor`, `rollout`, `ref`.
        role: one of `ROLES`.
    """

    def __init__(self, config, role: str, settings: WorkerSettings | None = None, **kwargs):
        Worker.__init__(self)
        if role not in ROLES:
            raise ValueError(f"ActorRolloutRefWorker role={role!r}; expected one of {list(ROLES)}")
        self.role = role
        self.device_name = _setup_process(self, _deterministic(settings))
        self.config = config
        self._is_actor = role in ("actor", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref")
        self.model_config: HFModelConfig = _to_dataclass(_section(config, "model"), HFModelConfig)
        import_external_libs(self.model_config.external_lib)
        self.rollout_config: RolloutConfig = _to_dataclass(_section(config, "rollout"), RolloutConfig)
        self.actor_config: ActorConfig = _to_dataclass(_section(config, "actor"), ActorConfig)
        self.ref_config: RefConfig = _to_dataclass(_section(config, "ref"), RefConfig)
        if self._is_actor:
            _apply_batch_plan(
                "actor_rollout_ref.actor", self.actor_config, self.rollout_config.n, self.world_size, settings
            )
            if self.actor_config.loss_scale_factor is None:
                # a copy: config dataclasses are frozen once built (BaseConfig)
                self.actor_config = dataclasses.replace(
                    self.actor_config,
                    loss_scale_factor=default_loss_scale_factor(self.actor_config, self.rollout_config.response_length),
                )
        self.actor = None
        self.rollout = None
        self.ref_policy = None
        self.actor_module = None
        self.ref_module = None
        self._weights_version = 0
        self._synced_version = -1
        # sampling randomness: a distinct, reproducible stream per rank (saved in checkpoints);
        # the trainer passes trainer.seed in `settings`
        torch.manual_seed(worker_seed(self.rank, None if settings is None else settings.seed))

    # -- building ---------------------------------------------------------------------------------

    def _model_path(self) -> str:
        return resolve_model_path(self.model_config.path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        """Load tokenizer and models, shard them, build optimizer, schedule, engines."""
        from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
        from verl.workers.actor.dp_actor import DataParallelPPOActor

        path = self._model_path()
        self.tokenizer = hf_tokenizer(
            self.model_config.tokenizer_path or path,
            trust_remote_code=self.model_config.trust_remote_code,
            chat_template=self.model_config.custom_chat_template,
        )
        self.processor = hf_processor(
            self.model_config.tokenizer_path or path, trust_remote_code=self.model_config.trust_remote_code
        )
        pad_id = self.tokenizer.pad_token_id
        fsdp_cfg = self.actor_config.fsdp_config
        self.compute_dtype = resolve_compute_dtype(fsdp_cfg, self.device_name)
        if self.device_name == "cpu" and self.compute_dtype == torch.bfloat16 and cpu_has_fast_bf16() is False:
            logger.warning(
                "fsdp_config.cpu_autocast_bf16=True but this CPU has no AMX/AVX512-BF16: bf16 matrix products are "
                "emulated and much slower than fp32 here"
            )

        if self._is_actor:
            self.actor_module = build_fsdp_model(
                build_causal_lm,
                path,
                self.model_config,
                fsdp_cfg,
                self.device_name,
                self.world_size,
                train=True,
                lora_task="CAUSAL_LM",
            )
            self.actor_optimizer = build_optimizer(self.actor_module.parameters(), self.actor_config.optim)
            self.actor_lr_scheduler = build_lr_scheduler(self.actor_optimizer, self.actor_config.optim)
            self.actor = DataParallelPPOActor(
                self.actor_config,
                self.actor_module,
                self.actor_optimizer,
                compute_dtype=self.compute_dtype,
                use_remove_padding=self.model_config.use_remove_padding,
                pad_token_id=pad_id,
            )
            self.checkpoint_manager = FSDPCheckpointManager(
                self.actor_module,
                self.actor_optimizer,
                self.actor_lr_scheduler,
                processing_class=self.processor or self.tokenizer,
                checkpoint_config=self.actor_config.checkpoint,
            )
        if self._is_rollout:
            self.rollout = self._build_rollout(path)
        if self._is_ref and self._ref_from_actor():
            # LoRA: the reference policy is the frozen base, i.e. the actor with its adapter
            # switched off (compute_ref_log_prob); no second copy of the model
            self._is_ref = False
        if self._is_ref:
            ref_fsdp = self.ref_config.fsdp_config
            self.ref_module = build_fsdp_model(
                build_causal_lm, path, self.model_config, ref_fsdp, self.device_name, self.world_size, train=False
            )
            self.ref_policy = DataParallelPPOActor(
                self.actor_config,
                self.ref_module,
                None,
                compute_dtype=resolve_compute_dtype(ref_fsdp, self.device_name),
                use_remove_padding=self.model_config.use_remove_padding,
                pad_token_id=pad_id,
            )
        if self._is_actor:
            self._offload(self.actor_module, self.actor_optimizer, fsdp_cfg)
        if self._is_ref:
            self._offload(self.ref_module, None, self.ref_config.fsdp_config)

    def _ref_from_actor(self) -> bool:
        """True when this worker's actor is a peft LoRA model: its reference log-probs are the
        actor's with the adapter disabled."""
        return self.actor_module is not None and is_peft_model(self.actor_module)

    def _build_rollout(self, path: str):
        from verl.workers.rollout.base import get_rollout_class
        from verl.workers.rollout.hf_rollout import HFRollout

        cfg = self.rollout_config
        cls = get_rollout_class(cfg.name)
        engine_kwargs = dict((cfg.engine_kwargs or {}).get(cfg.name, {}) or {})
        if cls is HFRollout:
            separate = bool(engine_kwargs.get("separate_copy", False)) or self.actor_module is None
            # LoRA with lora.merge: generate from merged weights in a copy without adapter layers
            separate = separate or (self._ref_from_actor() and self.model_config.lora.merge)
            if not separate:
                return HFRollout(self.actor_module, cfg, compute_dtype=self.compute_dtype)
            # a separate, unsharded copy (standalone rollout role, or e.g. a bf16 copy for speed)
            dtype = engine_kwargs.get("dtype", "fp32")
            module = build_causal_lm(
                path, self.model_config.override_config, dtype, self.model_config.trust_remote_code
            )
            module.requires_grad_(False)
            if self.device_name == "cuda":
                module.to(torch.device("cuda", torch.cuda.current_device()))
            owned_dtype = torch_dtype_from_name(dtype)
            return HFRollout(
                module,
                cfg,
                compute_dtype=None if owned_dtype != torch.float32 else self.compute_dtype,
                owns_module=True,
            )
        if self._ref_from_actor():
            # an engine with its own weights (vLLM) has no adapter layers here: every sync sends
            # W + delta_W (vLLM's own LoRA path, which would send only the adapter, is not used)
            logger.info("LoRA with rollout.name=%s: the engine receives merged weights at every weight sync", cfg.name)
        return cls(
            model_path=path, config=cfg, tokenizer=self.tokenizer, trust_remote_code=self.model_config.trust_remote_code
        )

    # -- weight sync ------------------------------------------------------------------------------

    def _probe(self) -> DataProto:
        """A fixed short sequence used to check a rollout engine's weights against the actor's."""
        ids = self.tokenizer("1+2=3, 40+2=42", add_special_tokens=False)["input_ids"]
        vocab = len(self.tokenizer)
        ids = [i for i in ids if 0 <= i < vocab][:16] or list(range(min(16, vocab)))
        ids = torch.tensor([ids], dtype=torch.long)
        resp_len = max(1, ids.shape[1] // 2)
        mask = torch.ones_like(ids)
        return DataProto.from_dict(
            tensors={
                "input_ids": ids,
                "attention_mask": mask,
                "position_ids": compute_position_id_with_mask(mask),
                "responses": ids[:, -resp_len:],
                "response_mask": mask[:, -resp_len:],
            },
            meta_info={"micro_batch_size": 1, "temperature": 1.0},
        )

    def _sync_rollout_weights(self) -> dict[str, float]:
        """Push the actor's weights into a rollout engine with its own copy, then verify them."""
        if self.rollout is None or self.actor is None or self.rollout.shares_weights_with(self.actor_module):
            return {}
        if self._synced_version == self._weights_version:
            return {}
        start = time.perf_counter()
        if is_peft_model(self.actor_module):
            # the engine has no adapter layers: it gets W + (alpha/r) B A under the plain names
            state = get_lora_merged_state_dict(self.actor_module, rank0_only=False)  # collective
        else:
            state = get_full_state_dict(self.actor_module, rank0_only=False)  # collective
        self.rollout.update_weights(state)
        del state
        probe = self._probe()
        actor_lp, _ = self.actor.compute_log_prob(probe)
        b = probe.batch
        rollout_lp = self.rollout.probe_log_probs(
            b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"]
        )
        diff = self._check_probe(actor_lp, rollout_lp)
        self._synced_version = self._weights_version
        return {"rollout/weight_sync_s": time.perf_counter() - start, "rollout/weight_sync_max_logp_diff": diff}

    def _check_probe(self, actor_lp: torch.Tensor, rollout_lp: torch.Tensor) -> float:
        """max |log p_rollout - log p_actor| on the probe sequence; raises beyond the tolerance."""
        diff = float((rollout_lp.float() - actor_lp.float()).abs().max())
        engine_kwargs = dict((self.rollout_config.engine_kwargs or {}).get(self.rollout_config.name, {}) or {})
        low_precision = self.rollout_config.name != "hf" or engine_kwargs.get("dtype", "fp32") not in (
            "fp32",
            "float32",
        )
        tol = float(engine_kwargs.get("sync_check_tol", 0.1 if low_precision else 1e-3))
        if not diff <= tol:
            raise RuntimeError(
                f"rollout weight sync check failed: max |log p_rollout - log p_actor| = {diff:.3g} "
                "on the probe sequence "
                f"exceeds {tol} (rollout.engine_kwargs.{self.rollout_config.name}.sync_check_tol)"
            )
        return diff

    # -- data-parallel methods -------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Left-padded prompts -> responses (see `BaseRollout.generate_sequences`).

        meta_info in: `eos_token_id`, `pad_token_id` (default: the tokenizer's), `do_sample`,
        `validate`, optional `temperature` / `top_p` / `top_k`. meta_info out: `timing`
        (`generate_sequences` seconds, the slowest rank) and `metrics` (weight-sync figures).
        """
        if self.rollout is None:
            raise RuntimeError(f"generate_sequences needs a rollout role; this worker's role is {self.role!r}")
        meta = dict(prompts.meta_info)
        meta.setdefault("eos_token_id", self._eos_ids())
        meta.setdefault("pad_token_id", self.tokenizer.pad_token_id)
        prompts = DataProto(batch=prompts.batch, non_tensor_batch=prompts.non_tensor_batch, meta_info=meta)
        self._check_weights_version(meta)  # a rollout of its own: the version the driver expects
        with self._actor_resident(optimizer=False):
            sync_metrics = self._sync_rollout_weights()
            self.rollout.resume()
            start = time.perf_counter()
            if self.rollout_config.multi_turn.enable:
                output = self._agent_rollout().generate_sequences(prompts)
            else:
                _reject_agent_names(prompts)
                output = self.rollout.generate_sequences(prompts)
            elapsed = float(all_reduce_scalar(time.perf_counter() - start, dist.ReduceOp.MAX))
            self.rollout.release()
        output = output.to("cpu")
        self._stamp_versions(output)
        output.meta_info["timing"] = {"generate_sequences": elapsed}
        if sync_metrics:
            output.meta_info["metrics"] = sync_metrics
        return output

    def _agent_rollout(self):
        """The multi-turn front (agent loops over this rollout engine), built on first use."""
        if getattr(self, "_agent_rollout_obj", None) is None:
            from verl.workers.rollout.agent_rollout import AgentRollout

            self._agent_rollout_obj = AgentRollout(
                self.rollout, self.config, self.rollout_config, self.tokenizer, self.processor
            )
        return self._agent_rollout_obj

    def _eos_ids(self):
        gen_cfg = getattr(self.actor_module or getattr(self.rollout, "module", None), "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
        return eos if eos is not None else self.tokenizer.eos_token_id

    def _actor_resident(self, optimizer: bool = True):
        """The actor's weights (and optimizer state) resident for a `with` body; nothing to do on a
        worker without an actor (a standalone rollout)."""
        if self.actor_module is None:
            return contextlib.nullcontext()
        return self._resident(
            self.actor_module, self.actor_optimizer if optimizer else None, self.actor_config.fsdp_config
        )

    def _log_prob_pass(self, policy, module, fsdp_config, data, micro_cfg, entropy: bool, base_model: bool = False):
        """One log-prob pass of `policy` (an actor engine) over `data` with `module` resident.

        `micro_cfg` holds the pass's micro-batching (`log_prob_micro_batch_size_per_gpu`,
        `log_prob_use_dynamic_bsz`, `log_prob_max_token_len_per_gpu`: the rollout's for the old
        log-probs, the ref's for the reference); the temperature defaults to the rollout's.
        `base_model`: a LoRA actor with its adapter disabled. Returns the engine's `InferOutput` and
        the temperature of the pass.
        """
        meta = dict(data.meta_info)
        meta.update(
            micro_batch_size=micro_cfg.log_prob_micro_batch_size_per_gpu,
            use_dynamic_bsz=micro_cfg.log_prob_use_dynamic_bsz,
            max_token_len=micro_cfg.log_prob_max_token_len_per_gpu,
        )
        meta.setdefault("temperature", self.rollout_config.temperature)
        view = DataProto(batch=data.batch, non_tensor_batch=data.non_tensor_batch, meta_info=meta)
        with self._resident(module, None, fsdp_config):
            with module.disable_adapter() if base_model else contextlib.nullcontext():
                return policy.infer(view, calculate_entropy=entropy), meta["temperature"]

    def _actor_log_prob_micro(self) -> SimpleNamespace:
        """Micro-batching of the actor's log-prob pass: `actor.ppo_infer_micro_batch_size_per_gpu` /
        `actor.ppo_infer_max_token_len_per_gpu` when set, else the rollout's `log_prob_*` keys."""
        actor, rollout = self.actor_config, self.rollout_config
        return SimpleNamespace(
            log_prob_micro_batch_size_per_gpu=actor.ppo_infer_micro_batch_size_per_gpu
            or rollout.log_prob_micro_batch_size_per_gpu,
            log_prob_use_dynamic_bsz=rollout.log_prob_use_dynamic_bsz,
            log_prob_max_token_len_per_gpu=actor.ppo_infer_max_token_len_per_gpu
            or rollout.log_prob_max_token_len_per_gpu,
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """`old_log_probs` and `entropys` [b, R] of the responses under the current actor."""
        if self.actor is None:
            raise RuntimeError(f"compute_log_prob needs the actor role; this worker's role is {self.role!r}")
        fsdp_cfg = self.actor_config.fsdp_config
        out, temperature = self._log_prob_pass(
            self.actor, self.actor_module, fsdp_cfg, data, self._actor_log_prob_micro(), True
        )
        log_probs = out.outputs["log_probs"]
        metrics = {"actor/padding_waste_log_prob": out.padding["padding_waste"]}
        if "rollout_log_probs" in data.batch.keys():
            from verl.trainer.ppo.algos.rollout_rejection import compute_mismatch_metrics

            metrics.update(
                compute_mismatch_metrics(
                    log_probs, data.batch["rollout_log_probs"], data.batch["response_mask"], prefix="rollout_mismatch/"
                )
            )
        return DataProto.from_dict(
            tensors={"old_log_probs": log_probs, "entropys": out.outputs["entropys"]},
            meta_info={"temperature": temperature, "metrics": metrics},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """`ref_log_prob` [b, R] of the responses under the frozen reference policy: the ref model,
        or with a LoRA actor the actor with its adapter disabled (= the frozen base the adapter was
        put on; with `lora_adapter_path`, the base without that adapter). Micro-batching follows
        `ref.log_prob_*`."""
        if self.ref_policy is not None:
            out, _ = self._log_prob_pass(
                self.ref_policy, self.ref_module, self.ref_config.fsdp_config, data, self.ref_config, False
            )
        elif self._ref_from_actor():
            fsdp_cfg = self.actor_config.fsdp_config
            out, _ = self._log_prob_pass(self.actor, self.actor_module, fsdp_cfg, data, self.ref_config, False, True)
        else:
            raise RuntimeError(f"compute_ref_log_prob needs the ref role; this worker's role is {self.role!r}")
        return DataProto.from_dict(tensors={"ref_log_prob": out.outputs["log_probs"]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """One PPO update (see `DataParallelPPOActor.update_policy`); metrics in meta_info.

        The learning-rate schedule advances once per call.
        """
        if self.actor is None:
            raise RuntimeError(f"update_actor needs the actor role; this worker's role is {self.role!r}")
        meta = dict(data.meta_info)
        meta.setdefault("temperature", self.rollout_config.temperature)
        data = DataProto(batch=data.batch, non_tensor_batch=data.non_tensor_batch, meta_info=meta)
        with self._actor_resident():
            start = time.perf_counter()
            out = self.actor.update(data)
            elapsed = time.perf_counter() - start
            lr = self.actor_lr_scheduler.get_last_lr()[0]
            step_lr_scheduler(self.actor_lr_scheduler)
            self._weights_version += 1
        metrics = out.metrics
        metrics["actor/lr"] = [lr]
        tokens = float(data.batch["attention_mask"].sum()) * self.actor_config.ppo_epochs
        metrics["perf/actor_update_tokens_per_s"] = [tokens / elapsed if elapsed > 0 else 0.0]
        metrics.update(memory_metrics(self.device_name, "perf/actor_memory"))
        if out.old_log_probs is not None:  # the use_current_as_old_log_prob shortcut
            tensors = {"old_log_probs": out.old_log_probs}
            if out.entropys is not None:
                tensors["entropys"] = out.entropys
            return DataProto.from_dict(tensors=tensors, meta_info={"metrics": metrics})
        return DataProto(meta_info={"metrics": metrics})

    # -- checkpoints ---------------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        """Save the actor (weights as a Hugging Face directory, optimizer, schedule, RNG)."""
        if self.actor is None:
            raise RuntimeError(f"save_checkpoint needs the actor role; this worker's role is {self.role!r}")
        with self._actor_resident():
            self.checkpoint_manager.save_checkpoint(
                local_path, hdfs_path=hdfs_path, global_step=global_step, max_ckpt_to_keep=max_ckpt_to_keep
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def finalize_checkpoint(self):
        """Wait for an asynchronous save (`checkpoint.async_save`) and publish it; a no-op otherwise."""
        if self.actor is None:
            raise RuntimeError(f"finalize_checkpoint needs the actor role; this worker's role is {self.role!r}")
        self.checkpoint_manager.finalize_save()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        """Restore the actor; a rollout engine with its own copy is re-synced before generating."""
        if self.actor is None:
            raise RuntimeError(f"load_checkpoint needs the actor role; this worker's role is {self.role!r}")
        with self._actor_resident():
            meta = self.checkpoint_manager.load_checkpoint(
                local_path, hdfs_path=hdfs_path, del_local_after_load=del_local_after_load
            )
            self._weights_version += 1
        return meta


class AsyncActorRolloutRefWorker(ActorRolloutRefWorker):
    """Upstream name; rollout here is synchronous (`rollout.mode=sync`)."""


# ---------------------------------------------------------------------------------------------
# critic
# ---------------------------------------------------------------------------------------------


class CriticWorker(Worker, _OffloadMixin):
    """Value model: `init_model`, `compute_values`, `update_critic`, checkpoints.

    Args:
        config: the `critic` section (DictConfig or dict).
    """

    def __init__(self, config, settings: WorkerSettings | None = None, **kwargs):
        Worker.__init__(self)
        self.device_name = _setup_process(self, _deterministic(settings))
        self.config: CriticConfig = _to_dataclass(config, CriticConfig)
        import_external_libs(self.config.model.external_lib)
        _apply_batch_plan("critic", self.config, self.config.rollout_n, self.world_size, settings)
        self.critic = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
        from verl.workers.critic.dp_critic import DataParallelPPOCritic

        mc = self.config.model
        path = resolve_model_path(mc.path)
        self.tokenizer = hf_tokenizer(
            mc.tokenizer_path or path, trust_remote_code=mc.trust_remote_code, chat_template=mc.custom_chat_template
        )
        fsdp_cfg = self.config.fsdp_config
        self.critic_module = build_fsdp_model(
            build_value_model, path, mc, fsdp_cfg, self.device_name, self.world_size, train=True, lora_task="TOKEN_CLS"
        )
        self.critic_optimizer = build_optimizer(self.critic_module.parameters(), self.config.optim)
        self.critic_lr_scheduler = build_lr_scheduler(self.critic_optimizer, self.config.optim)
        self.critic = DataParallelPPOCritic(
            self.config,
            self.critic_module,
            self.critic_optimizer,
            compute_dtype=resolve_compute_dtype(fsdp_cfg, self.device_name),
            use_remove_padding=mc.use_remove_padding,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        self.checkpoint_manager = FSDPCheckpointManager(
            self.critic_module,
            self.critic_optimizer,
            self.critic_lr_scheduler,
            processing_class=self.tokenizer,
            checkpoint_config=self.config.checkpoint,
        )
        self._offload(self.critic_module, self.critic_optimizer, fsdp_cfg)

    def _critic_resident(self):
        return self._resident(self.critic_module, self.critic_optimizer, self.config.fsdp_config)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """`values` [b, R]: V(s) before each response token (0 on padding)."""
        cfg = self.config
        meta = dict(data.meta_info)
        meta.update(
            micro_batch_size=cfg.forward_micro_batch_size_per_gpu or cfg.ppo_micro_batch_size_per_gpu,
            use_dynamic_bsz=cfg.use_dynamic_bsz,
            max_token_len=cfg.forward_max_token_len_per_gpu,
        )
        data = DataProto(batch=data.batch, non_tensor_batch=data.non_tensor_batch, meta_info=meta)
        with self._resident(self.critic_module, None, cfg.fsdp_config):
            values = self.critic.compute_values(data)
        return DataProto.from_dict(tensors={"values": values})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        """Value-loss updates; metrics in meta_info. The lr schedule advances once per call."""
        with self._critic_resident():
            metrics = self.critic.update_critic(data)
            lr = self.critic_lr_scheduler.get_last_lr()[0]
            step_lr_scheduler(self.critic_lr_scheduler)
            metrics["critic/lr"] = [lr]
            metrics.update(memory_metrics(self.device_name, "perf/critic_memory"))
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        with self._critic_resident():
            self.checkpoint_manager.save_checkpoint(
                local_path, hdfs_path=hdfs_path, global_step=global_step, max_ckpt_to_keep=max_ckpt_to_keep
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def finalize_checkpoint(self):
        """Wait for an asynchronous save (`checkpoint.async_save`) and publish it; a no-op otherwise."""
        self.checkpoint_manager.finalize_save()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        with self._critic_resident():
            return self.checkpoint_manager.load_checkpoint(
                local_path, hdfs_path=hdfs_path, del_local_after_load=del_local_after_load
            )


# ---------------------------------------------------------------------------------------------
# reward model
# ---------------------------------------------------------------------------------------------


def _same_tokenizer(a, b) -> bool:
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)


class RewardModelWorker(Worker, _OffloadMixin):
    """Sequence-classification reward model: `init_model`, `compute_rm_score`.

    Args:
        config: the `reward_model` section. `model.path` must name a sequence-classification
            checkpoint; `model.input_tokenizer` is the policy's tokenizer (re-templating happens when
            it differs from the reward model's).
    """

    def __init__(self, config, **kwargs):
        Worker.__init__(self)
        self.device_name = _setup_process(self)
        self.config: RewardModelConfig = _to_dataclass(config, RewardModelConfig)
        import_external_libs(self.config.model.external_lib)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        from verl.workers.reward_model.dp_reward_model import DataParallelRewardModel

        mc = self.config.model
        if mc.path is None:
            raise ValueError(
                "reward_model.enable=True needs reward_model.model.path: a sequence-classification "
                "reward model directory"
            )
        if mc.use_lora:
            raise ValueError(
                f"reward_model.model.lora_rank={mc.lora_rank} / lora_adapter_path={mc.lora_adapter_path!r}: "
                "the reward model is "
                "frozen and takes no adapter; merge a LoRA reward model into its base first "
                "(PeftModel.merge_and_unload)"
            )
        self.rm_tokenizer = hf_tokenizer(
            mc.tokenizer_path or mc.path, trust_remote_code=mc.trust_remote_code, chat_template=mc.custom_chat_template
        )
        # the policy's tokenizer (null = the embedded default policy, as the yaml interpolates the
        # actor's model.path); responses are re-templated only when it differs from the RM's
        input_tokenizer = None
        try:
            policy_path = resolve_model_path(mc.input_tokenizer)
        except RuntimeError:
            policy_path = None
        if policy_path is not None and os.path.abspath(policy_path) != os.path.abspath(mc.tokenizer_path or mc.path):
            policy_tok = hf_tokenizer(policy_path, trust_remote_code=mc.trust_remote_code)
            if not _same_tokenizer(policy_tok, self.rm_tokenizer):
                input_tokenizer = policy_tok
        fsdp_cfg = self.config.fsdp_config
        self.rm_module = build_fsdp_model(
            build_reward_model, mc.path, mc, fsdp_cfg, self.device_name, self.world_size, train=False
        )
        self.reward_model = DataParallelRewardModel(
            self.config,
            self.rm_module,
            rm_tokenizer=self.rm_tokenizer,
            input_tokenizer=input_tokenizer,
            compute_dtype=resolve_compute_dtype(fsdp_cfg, self.device_name),
            use_remove_padding=mc.use_remove_padding,
        )
        self._offload(self.rm_module, None, fsdp_cfg)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """`rm_scores` [b, R]: the reward model's score at the last valid response token."""
        with self._resident(self.rm_module, None, self.config.fsdp_config):
            scores = self.reward_model.compute_rm_score(data)
        return DataProto.from_dict(tensors={"rm_scores": scores})
