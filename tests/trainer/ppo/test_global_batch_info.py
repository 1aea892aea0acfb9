"""`ActorConfig.global_batch_info` is a plain dict of one config (upstream main): writing into it
changes the losses that are given that config, and nothing else in the process."""

import pytest
import torch

from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig

# two rows, 3 + 1 valid tokens, per-token loss 1..4 on the valid ones
MAT = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_writing_one_configs_batch_info_changes_no_later_plain_agg_loss():
    cfg = ActorConfig()
    cfg.global_batch_info["dp_size"] = 2
    # plain call: (1+2+3+4) / 4 tokens, whatever any config holds
    assert core_algos.agg_loss(MAT, MASK, "token-mean").item() == pytest.approx(2.5)
    # seq-mean-token-sum: (6 + 4) / 2 rows, no "global_batch_size is required when dp_size > 1"
    assert core_algos.agg_loss(MAT, MASK, "seq-mean-token-sum").item() == pytest.approx(5.0)
    assert ActorConfig().global_batch_info == {}


def test_batch_info_is_per_config_and_reaches_the_losses_given_that_config():
    cfg, other = ActorConfig(), ActorConfig()
    cfg.global_batch_info.update(dp_size=2, batch_num_tokens=8)
    assert other.global_batch_info == {}
    assert cfg.global_batch_info is not other.global_batch_info
    # upstream's call shape: 10 / 8 * 2
    assert core_algos.agg_loss(MAT, MASK, "token-mean", **cfg.global_batch_info).item() == pytest.approx(2.5)
    vanilla = core_algos.get_policy_loss_fn("vanilla")
    # ratio 1, A = 1 on 4 valid tokens: per-token loss -1
    args = (torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), MASK, "token-mean")
    assert vanilla(*args, other)[0].item() == pytest.approx(-1.0)
    assert vanilla(*args, cfg)[0].item() == pytest.approx(-4 / 8 * 2)


def test_agg_loss_reads_no_module_state():
    assert not hasattr(core_algos, "global_batch_info_view")
    assert not hasattr(core_algos, "_BASE_GLOBAL_BATCH_INFO")


def _loss_inputs():
    gen = torch.Generator().manual_seed(3)
    old = torch.randn(4, 5, generator=gen) * 0.2 - 1.5
    logp = old + torch.randn(4, 5, generator=gen) * 0.3
    adv = torch.randn(4, 5, generator=gen)
    mask = torch.ones(4, 5)
    mask[0, 3:] = 0
    return old, logp, adv, mask


def _config(**extra):
    rc = {"loss_type": "ppo_clip", "rollout_is": "token", "rollout_is_threshold": 2.0}
    return {"clip_ratio": 0.2, "clip_ratio_c": 3.0, "policy_loss": {"rollout_correction": rc}, **extra}


@pytest.mark.parametrize("name", sorted(core_algos.POLICY_LOSS_REGISTRY))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_every_registered_loss_passes_its_configs_batch_info(name, mode):
    """Doubling every global denominator halves the loss: the loss aggregates with the config's
    `global_batch_info`, not with the micro-batch's own counts."""
    old, logp, adv, mask = _loss_inputs()
    fn = core_algos.get_policy_loss_fn(name)
    plain, _ = core_algos.unpack_policy_loss_output(fn(old, logp, adv, mask, mode, _config()))
    doubled = {"batch_num_tokens": 2 * int(mask.sum()), "global_batch_size": 2 * mask.shape[0]}
    scaled, _ = core_algos.unpack_policy_loss_output(fn(old, logp, adv, mask, mode, _config(global_batch_info=doubled)))
    assert abs(plain.item()) > 1e-4, name  # a loss of 0 would prove nothing
    assert scaled.item() == pytest.approx(plain.item() / 2, rel=1e-5, abs=1e-7), name
