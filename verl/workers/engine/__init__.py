"""Data-parallel engines: the epoch x mini-batch x micro-batch loop (`dp_engine`) and the padding-free
model forwards (`padding_free`) shared by the actor, the critic and the reward model."""

from verl.workers.engine.dp_engine import DataParallelEngine, InferOutput, LossShare, StepMeter, TrainOutput

__all__ = ["DataParallelEngine", "InferOutput", "LossShare", "StepMeter", "TrainOutput"]
