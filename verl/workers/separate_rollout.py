"""Weight sync to a rollout with workers of its own (`actor_rollout_ref.hybrid_engine=False`).

`WeightSyncMixin` gives `ActorRolloutRefWorker` the methods the trainer drives through the
checkpoint engine (`verl.checkpoint_engine`):

- actor group: `checkpoint_engine_prepare` (rank 0 opens the engine's store), then
  `checkpoint_engine_init`, and after each update `send_weights(global_steps)`: every actor rank
  takes part in gathering the full state dict, rank 0 broadcasts it with the actor's log-probs of
  the probe sequence (`_probe`) as one more tensor;
- rollout group: `checkpoint_engine_init`, then `receive_weights(global_steps)`: the buckets are
  applied to the engine (strict: every parameter, nothing else), the probe's log-probs recomputed
  by the rollout and compared with the actor's, and only then the rollout's weight version
  becomes `global_steps`.

Every generation request names the version it must be generated with (`meta_info
["weights_version"]`); a rollout rank holding another version raises (a skipped sync), and the
output carries `rollout_versions` [b, R] (the version that sampled each token) and upstream's
per-trajectory `min_global_steps` / `max_global_steps`. Every failure names the step and the rank.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from verl.checkpoint_engine import CheckpointEngineRegistry, resolve_backend
from verl.protocol import DataProto
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.fsdp_utils import get_full_state_dict, get_lora_merged_state_dict
from verl.utils.import_utils import import_external_libs
from verl.utils.model import is_peft_model

__all__ = ["PROBE_TENSOR", "WeightSyncMixin"]

# the actor's log-probs of the probe sequence travel with the weights under this name
PROBE_TENSOR = "__verl_probe_log_probs__"


class WeightSyncMixin:
    """Checkpoint-engine endpoints of the policy worker (see the module docstring)."""

    _checkpoint_engine = None
    _rollout_version: int = 0  # the initial weights are the model's, version 0

    # ------------------------------------------------------------------ building the group
    def _new_checkpoint_engine(self):
        ce = self.rollout_config.checkpoint_engine
        if ce.custom_backend_module:
            import_external_libs([ce.custom_backend_module])
        backend = resolve_backend(ce.backend, self.device_name)
        kwargs = dict((ce.engine_kwargs or {}).get(backend, {}) or {})
        return CheckpointEngineRegistry.new(
            backend, ce.update_weights_bucket_megabytes << 20, self.device_name, **kwargs
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def checkpoint_engine_prepare(self) -> dict[str, Any] | None:
        """On the actor's rank 0: build the engine and return where receivers connect."""
        if self.actor is None:
            raise RuntimeError(f"checkpoint_engine_prepare runs on the actor; this worker's role is {self.role!r}")
        if self.rank != 0:
            return None
        self._checkpoint_engine = self._new_checkpoint_engine()
        return self._checkpoint_engine.prepare(self._get_node_ip().strip("[]"))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def checkpoint_engine_init(self, world_size: int, connection: dict[str, Any]) -> None:
        """Join the engine's group: the actor's rank 0 as group rank 0, rollout rank r as 1 + r
        (the other actor ranks are not members)."""
        if self.actor is not None:
            if self.rank == 0:
                self._checkpoint_engine.init_process_group(0, world_size, **connection)
            return
        self._checkpoint_engine = self._new_checkpoint_engine()
        self._checkpoint_engine.init_process_group(1 + self.rank, world_size, **connection)

    # ------------------------------------------------------------------ one sync
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def send_weights(self, global_steps: int) -> dict[str, float]:
        """Gather the actor's full weights (every actor rank) and broadcast them from rank 0,
        stamped with `global_steps`, with the probe's log-probs."""
        if self.actor is None:
            raise RuntimeError(f"send_weights runs on the actor; this worker's role is {self.role!r}")
        start = time.perf_counter()
        with self._actor_resident(optimizer=False):
            if is_peft_model(self.actor_module):  # the rollout has no adapter layers: W + delta W
                state = get_lora_merged_state_dict(self.actor_module, rank0_only=False)
            else:
                state = get_full_state_dict(self.actor_module, rank0_only=False)
            probe_lp, _ = self.actor.compute_log_prob(self._probe())
        if self.rank != 0:
            return {}
        state[PROBE_TENSOR] = probe_lp.detach().float().cpu()
        stats = self._checkpoint_engine.send_weights(state.items(), global_steps)
        return {"buckets": stats["buckets"], "bytes": stats["bytes"], "seconds": time.perf_counter() - start}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def receive_weights(self, global_steps: int) -> dict[str, float]:
        """Apply the update of version `global_steps`, check it with the probe, then adopt the
        version. Raises RuntimeError naming the step and this rollout rank otherwise."""
        if self.rollout is None or self.actor is not None:
            raise RuntimeError(f"receive_weights runs on a standalone rollout; this worker's role is {self.role!r}")
        try:
            state = dict(self._checkpoint_engine.receive_weights(global_steps))
            actor_lp = state.pop(PROBE_TENSOR, None)
            if actor_lp is None:
                raise RuntimeError("the update carried no probe log-probs")
            self.rollout.update_weights(state)
            del state
            diff = self._check_probe(actor_lp, self._rollout_probe_log_probs())
        except Exception as exc:
            raise RuntimeError(
                f"weight sync of step {global_steps} failed on rollout rank {self.rank}: {type(exc).__name__}: {exc}"
            ) from exc
        self._rollout_version = int(global_steps)
        return {"max_logp_diff": diff, "version": self._rollout_version}

    def _rollout_probe_log_probs(self) -> torch.Tensor:
        """The probe's log-probs under the rollout's weights. An engine holding a torch module
        (hf) is read through the actor's own log-prob code, so equal weights give exactly equal
        numbers; other engines (vllm) through their `probe_log_probs`."""
        probe = self._probe()
        module = getattr(self.rollout, "module", None)
        if not isinstance(module, torch.nn.Module):
            b = probe.batch
            return self.rollout.probe_log_probs(b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"])
        if getattr(self, "_probe_policy", None) is None:
            from verl.workers.actor.dp_actor import DataParallelPPOActor

            self._probe_policy = DataParallelPPOActor(
                self.actor_config,
                module,
                None,
                compute_dtype=self.compute_dtype,
                use_remove_padding=self.model_config.use_remove_padding,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        log_probs, _ = self._probe_policy.compute_log_prob(probe)
        return log_probs

    # ------------------------------------------------------------------ generation
    def _check_weights_version(self, meta: dict) -> None:
        """A request naming a version this standalone rollout does not hold is a skipped sync."""
        wanted = meta.get("weights_version")
        if self.actor is None and wanted is not None and int(wanted) != self._rollout_version:
            raise RuntimeError(
                f"rollout rank {self.rank} holds the weights of step {self._rollout_version} but step "
                f"{meta.get('global_steps')} asked for the weights of step {wanted}: a weight sync was skipped"
            )

    def _stamp_versions(self, output: DataProto) -> None:
        """The version that sampled each token: `rollout_versions` [b, R] int64 and upstream's
        per-trajectory `min_global_steps` / `max_global_steps` (one engine call, one version)."""
        if self.actor is not None or "responses" not in output.batch.keys():
            return
        responses = output.batch["responses"]
        version = self._rollout_version
        output.batch["rollout_versions"] = torch.full(responses.shape, version, dtype=torch.int64)
        rows = responses.shape[0]
        output.non_tensor_batch["min_global_steps"] = np.full(rows, version, dtype=object)
        output.non_tensor_batch["max_global_steps"] = np.full(rows, version, dtype=object)
