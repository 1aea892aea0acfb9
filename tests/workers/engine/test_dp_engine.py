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


def test_loss_denominators_are_taken_after_the_mini_batch_hook():
    """A hook that rejects rows (rollout rejection rewrites the mask) must change the denominators:
    token-mean over the kept tokens only, summed exactly over micro-batches of one row."""
    import types

    from tensordict import TensorDict

    from verl.trainer.ppo import core_algos
    from verl.workers.engine.dp_engine import DataParallelEngine

    module = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        module.weight.fill_(1.0)
    opt = torch.optim.SGD(module.parameters(), lr=1.0)
    engine = DataParallelEngine(module, opt)
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    batch = TensorDict(
        {"x": x, "response_mask": torch.ones(3, 2), "attention_mask": torch.ones(3, 2, dtype=torch.long)},
        batch_size=[3],
    )

    def forward(micro):
        return {"out": module.weight[0, 0] * micro["x"]}, (0, 0)

    def loss_fn(model_output, micro, batch_info):
        loss = core_algos.agg_loss(model_output["out"], micro["response_mask"], "token-mean", **batch_info)
        return loss, {"loss": float(loss.detach())}

    def reject_last_row(mb, _meter):
        mask = mb["response_mask"].clone()
        mask[2] = 0
        mb["response_mask"] = mask

    cfg = types.SimpleNamespace(
        ppo_epochs=1,
        shuffle=False,
        data_loader_seed=0,
        ppo_mini_batch_size=3,
        ppo_micro_batch_size_per_gpu=1,
        use_dynamic_bsz=False,
        ppo_max_token_len_per_gpu=None,
        grad_clip=1e9,
        loss_agg_mode="token-mean",
    )
    out = engine.train(batch, forward, loss_fn, cfg, "actor", on_mini_batch=reject_last_row)
    # d/dw of mean(w * x) over the 4 kept tokens = (1 + 2 + 3 + 4) / 4 = 2.5; SGD step from 1.0
    assert float(module.weight.detach()) == 1.0 - 2.5
    assert out.metrics["actor/grad_norm"] == [2.5]
    assert out.metrics["actor/nonfinite_loss_skipped"] == [0.0]
