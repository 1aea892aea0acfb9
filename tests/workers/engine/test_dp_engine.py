"""Engine helpers that the actor / critic tests do not reach directly."""

from __future__ import annotations

import warnings

import torch

from verl.workers.engine.dp_engine import StepMeter, clip_and_step, step_lr_scheduler


def test_a_skipped_first_step_advances_the_schedule_without_warning():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
    p.grad = torch.tensor([float("nan"), 0.0])
    meter = StepMeter()
    meter.new_step()
    assert not clip_and_step(opt, [p], 1.0, meter, "actor")  # non-finite norm: no optimizer step
    assert p.grad is None and torch.equal(p.detach(), torch.ones(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step_lr_scheduler(sched)
    assert sched.get_last_lr() == [0.5]  # the schedule counts the skipped step
    assert meter.reduce(None, 1)["actor/lr"] == [1.0]
