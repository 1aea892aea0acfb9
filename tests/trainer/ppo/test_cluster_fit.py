"""A job asking for more than the Ray cluster has fails in bounded time, naming what was asked
(per node, per role pool) and what the cluster has: at once on the private single-node Ray,
after `trainer.placement_timeout_s` on a cluster that nodes might still join."""

from __future__ import annotations

import re
import time

import pytest

from verl.trainer.ppo.cluster_fit import _fits
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.worker_groups import ResourcePoolManager


def test_first_fit_packs_placement_groups_onto_nodes():
    two_nodes = [{"CPU": 1.0}, {"CPU": 1.0}]
    assert _fits([{"CPU": 1.0}, {"CPU": 1.0}], two_nodes)
    assert not _fits([{"CPU": 2.0}], two_nodes)  # one node's share must fit one node
    assert not _fits([{"CPU": 1.0}] * 3, two_nodes)
    assert _fits([{"CPU": 0.5}] * 4, two_nodes)
    assert not _fits([{"CPU": 1.0, "GPU": 1.0}], two_nodes)


def _manager(**kw):
    return ResourcePoolManager(
        resource_pool_spec={"global_pool": [2], "critic_pool": [1]},
        mapping={Role.ActorRollout: "global_pool", Role.Critic: "critic_pool"},
        use_gpu=False,
        num_cpus_per_worker=300.0,
        **kw,
    )


@pytest.mark.ray
def test_private_cluster_refuses_before_any_worker_starts(ray_session):
    pools = _manager(private_cluster=True)
    with pytest.raises(RuntimeError) as e:
        pools.create_resource_pool()
    msg = str(e.value)
    assert "asks for more than the Ray cluster has" in msg
    assert "pool global_pool (ActorRollout): node 0: 2 process(es); each process {'CPU': 300.0}" in msg
    assert "pool critic_pool (Critic): node 0: 1 process(es)" in msg and "in all {'CPU': 900.0}" in msg
    assert re.search(r"The cluster has 1 node\(s\): \S+ \{'CPU': \d", msg), msg


@pytest.mark.ray
def test_a_cluster_placement_gives_up_after_the_timeout(ray_session):
    pools = _manager(private_cluster=False, placement_timeout_s=1.0)
    pools.create_resource_pool()  # nodes could still join a real cluster: only a warning here
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"within 1.0 s. Asked: pool global_pool \(ActorRollout\)") as e:
        pools.resource_pool_dict["global_pool"].get_placement_groups(device_name="cpu")
    assert time.monotonic() - start < 30 and "trainer.placement_timeout_s" in str(e.value)
    pools.release()
