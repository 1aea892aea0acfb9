"""`core_algos` as the surface of the `algos` package: the same objects under both names, the
built-ins registered whichever module is imported first, one batch-info context."""

import importlib
import subprocess
import sys

import torch

from verl.trainer.ppo import core_algos
from verl.trainer.ppo.algos import aggregation, policy_losses

SUBMODULES = (
    "aggregation",
    "kl",
    "policy_losses",
    "normalization",
    "gae_lambda",
    "advantages",
    "token_baselines",
    "rewards",
)


def test_every_exported_name_is_the_submodule_object():
    owners = {}
    for short in SUBMODULES:
        module = importlib.import_module(f"verl.trainer.ppo.algos.{short}")
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) == module.__name__:
                owners[name] = value
    assert len(core_algos.__all__) == len(set(core_algos.__all__))
    moved = [n for n in core_algos.__all__ if n in owners]
    assert len(moved) > 50  # the functions and classes of the sections now live in the submodules
    for name in core_algos.__all__:
        assert hasattr(core_algos, name), name
        if name in owners:
            assert getattr(core_algos, name) is owners[name], name
    # constants and the registries' values too
    assert core_algos.LOSS_AGG_MODES is aggregation.LOSS_AGG_MODES
    assert core_algos.batch_info_of is aggregation.batch_info_of
    assert core_algos.POLICY_LOSS_REGISTRY["vanilla"] is policy_losses.compute_policy_loss_vanilla


def test_both_names_aggregate_the_same_with_a_configs_batch_info():
    mat, mask = torch.tensor([[1.0, 3.0], [2.0, 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # token-mean over 3 tokens is 2; with a global count of 6 tokens the micro-batch share is 1
    assert core_algos.agg_loss(mat, mask, "token-mean").item() == 2.0
    cfg = {"clip_ratio": 0.2, "global_batch_info": {"batch_num_tokens": 6}}
    assert aggregation.agg_loss(mat, mask, "token-mean", **core_algos.batch_info_of(cfg)).item() == 1.0
    loss, _ = core_algos.compute_policy_loss_vanilla(
        torch.zeros(2, 2), torch.zeros(2, 2), -mat, mask, "token-mean", cfg
    )
    assert loss.item() == 1.0  # ratio 1: the loss is -advantage, aggregated with the config's info


def test_importing_a_submodule_first_registers_every_builtin():
    code = (
        "import verl.trainer.ppo.algos.advantages as a\n"
        "from verl.trainer.ppo import core_algos as c\n"
        "assert c.get_adv_estimator_fn('grpo') is a.compute_grpo_outcome_advantage\n"
        "assert len(c.ADV_ESTIMATOR_REGISTRY) == 16 and 'vanilla' in c.POLICY_LOSS_REGISTRY\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
