"""The custom-loss example of docs/algorithms.md registers its loss on import and the loss runs,
with an actor config dataclass and with a dict, inside and outside the micro-batch context."""

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from verl.trainer.ppo import core_algos
from verl.workers.config.actor import ActorConfig

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "docs" / "examples" / "custom_policy_loss.py"


@pytest.fixture
def example_module():
    core_algos.POLICY_LOSS_REGISTRY.pop("truncated_pg", None)
    spec = importlib.util.spec_from_file_location("verl_docs_example_custom_policy_loss", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    core_algos.POLICY_LOSS_REGISTRY.pop("truncated_pg", None)


def test_import_registers_the_loss(example_module):
    fn = core_algos.get_policy_loss_fn("truncated_pg")
    assert fn is example_module.compute_policy_loss_truncated_pg


def test_example_loss_runs_and_matches_its_formula(example_module):
    fn = core_algos.get_policy_loss_fn("truncated_pg")
    old = torch.zeros(2, 3)
    logp = torch.log(torch.tensor([[3.0, 1.0, 0.5], [1.0, 1.0, 1.0]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    for config in (ActorConfig(), {"policy_loss": {"extra": {"truncation": 2.0}}}):
        loss, metrics = core_algos.unpack_policy_loss_output(fn(old, logp, adv, mask, "token-mean", config))
        weight = torch.tensor([[2.0, 1.0, 0.5], [1.0, 1.0, 1.0]])
        expected = (-(weight * adv * logp.detach()) * mask).sum() / mask.sum()
        assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
        assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 5)
        (grad,) = torch.autograd.grad(loss, logp)
        torch.testing.assert_close(grad, -(weight * adv) * mask / 5)
    # the knob is read from actor.policy_loss.extra
    tight, _ = fn(old, logp, adv, mask, "token-mean", {"policy_loss": {"extra": {"truncation": 1.0}}})
    expected_tight = (-(torch.clamp(weight, max=1.0) * adv * logp.detach()) * mask).sum() / mask.sum()
    assert tight.item() == pytest.approx(expected_tight.item(), abs=1e-6)


def test_example_loss_is_micro_batch_exact(example_module):
    fn = core_algos.get_policy_loss_fn("truncated_pg")
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(6, 4, generator=gen) * 0.1 - 1
    logp = (old + 0.2 * torch.randn(6, 4, generator=gen)).requires_grad_(True)
    adv = torch.randn(6, 4, generator=gen)
    mask = (torch.rand(6, 4, generator=gen) > 0.3).float()
    full, _ = fn(old, logp, adv, mask, "seq-mean-token-mean", {})
    stats = core_algos.compute_batch_loss_stats(mask)
    parts = torch.zeros(())
    for rows in np.array_split(np.arange(6), 4):
        cfg = {"global_batch_info": core_algos.make_global_batch_info(stats)}
        part, _ = fn(old[rows], logp[rows], adv[rows], mask[rows], "seq-mean-token-mean", cfg)
        parts = parts + part
    torch.testing.assert_close(parts, full, atol=1e-6, rtol=1e-6)


def test_docs_embed_the_example_file_verbatim():
    """docs/algorithms.md shows the example's code; keep the two in sync."""
    doc = (ROOT / "docs" / "algorithms.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    source = EXAMPLE.read_text()
    body = source[source.index("import torch") :]
    assert any(block.strip() == body.strip() for block in blocks)


def test_docs_list_every_registered_name():
    doc = (ROOT / "docs" / "algorithms.md").read_text()
    names = (
        set(core_algos.POLICY_LOSS_REGISTRY) - {"truncated_pg"}
        | {e.value for e in core_algos.AdvantageEstimator}
        | set(core_algos.LOSS_AGG_MODES)
        | {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"}
    )
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, f"docs/algorithms.md does not mention {missing}"
