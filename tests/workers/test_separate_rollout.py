"""The standalone rollout's version checks (`WeightSyncMixin`) on a stand-in worker."""

from __future__ import annotations

import pytest
import torch

from verl.protocol import DataProto
from verl.workers.separate_rollout import WeightSyncMixin


class Standalone(WeightSyncMixin):
    actor = None  # a rollout of its own
    rank = 1


def test_a_request_for_another_version_is_a_skipped_sync():
    w = Standalone()
    w._rollout_version = 3
    w._check_weights_version({"weights_version": 3, "global_steps": 5})
    with pytest.raises(RuntimeError, match="rollout rank 1 holds the weights of step 3 but step 5 asked for .* step 4"):
        w._check_weights_version({"weights_version": 4, "global_steps": 5})


def test_every_token_carries_the_version_it_was_sampled_with():
    w = Standalone()
    w._rollout_version = 7
    out = DataProto.from_dict(tensors={"responses": torch.zeros(3, 4, dtype=torch.long)})
    w._stamp_versions(out)
    assert torch.equal(out.batch["rollout_versions"], torch.full((3, 4), 7))
    assert list(out.non_tensor_batch["min_global_steps"]) == list(out.non_tensor_batch["max_global_steps"]) == [7] * 3
