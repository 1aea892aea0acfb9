"""Policy engines."""

from verl.workers.actor.base import BasePPOActor
from verl.workers.actor.dp_actor import DataParallelPPOActor

__all__ = ["BasePPOActor", "DataParallelPPOActor"]
