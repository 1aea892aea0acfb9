"""Rollout engines (`actor_rollout_ref.rollout.name`): `hf` (default, CPU and GPU) and `vllm`
(optional, GPU only, imported lazily)."""

from verl.workers.rollout.base import BaseRollout, get_rollout_class, register_rollout
from verl.workers.rollout.hf_rollout import HFRollout

__all__ = ["BaseRollout", "HFRollout", "get_rollout_class", "register_rollout"]
