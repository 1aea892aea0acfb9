"""Does the job fit the Ray cluster? What the resource pools ask for, per node and per role pool,
against what the cluster's nodes have.

A request Ray cannot place waits forever (its autoscaler prints a line every ~35 s). So
`check_cluster_fits` runs before any worker starts: on the private single-node Ray (`fail_now`)
a job that cannot fit fails at once; on a real cluster, where nodes may still join, it only
warns, and the placement itself gives up after `trainer.placement_timeout_s` with the same
description (`RayResourcePool.request_description`).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

__all__ = ["cluster_description", "check_cluster_fits", "pool_request", "pools_request_description"]

logger = logging.getLogger(__name__)


def pool_request(pool: Any, roles: list[str], name: str) -> str:
    """`critic (pool critic): 1 node(s) x 1 process(es) of {'CPU': 0.5}`-style text of one pool."""
    bundle = pool.bundle("cuda" if pool.use_gpu else "cpu")
    per_node = ", ".join(f"node {i}: {n} process(es)" for i, n in enumerate(pool.store))
    return f"pool {name} ({', '.join(roles)}): {per_node}; each process {bundle}"


def cluster_description() -> str:
    """Each alive node's total resources (CPU, GPU, memory in GB) and what is free now."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    parts = []
    for n in nodes:
        res = n.get("Resources", {})
        shown = {k: res[k] for k in ("CPU", "GPU") if k in res}
        parts.append(f"{n.get('NodeManagerAddress')} {shown}")
    return f"{len(nodes)} node(s): {'; '.join(parts)}; free now {_plain(ray.available_resources())}"


def _plain(res: dict) -> dict:
    return {k: v for k, v in res.items() if k in ("CPU", "GPU")}


def _demands(pools: dict[str, Any]) -> list[dict[str, float]]:
    """One resource demand per placement group (a node's share of a pool: STRICT_PACK)."""
    out = []
    for pool in pools.values():
        bundle = pool.bundle("cuda" if pool.use_gpu else "cpu")
        out += [{k: v * n for k, v in bundle.items()} for n in pool.store]
    return out


def _fits(demands: list[dict[str, float]], nodes: list[dict[str, float]]) -> bool:
    """First-fit decreasing of the placement groups onto the nodes' totals."""
    free = [dict(n) for n in nodes]
    for d in sorted(demands, key=lambda d: -d.get("GPU", 0) * 1e6 - d.get("CPU", 0)):
        for node in free:
            if all(node.get(k, 0.0) + 1e-9 >= v for k, v in d.items()):
                for k, v in d.items():
                    node[k] = node.get(k, 0.0) - v
                break
        else:
            return False
    return True


def pools_request_description(pools: dict[str, Any], mapping: dict) -> str:
    roles_of: dict[str, list[str]] = {}
    for role, pool_name in mapping.items():
        roles_of.setdefault(pool_name, []).append(getattr(role, "name", str(role)))
    total: Counter = Counter()
    for d in _demands(pools):
        total.update(d)
    lines = [pool_request(p, sorted(roles_of.get(name, [])), name) for name, p in pools.items()]
    return f"{' | '.join(lines)} (in all {dict(total)})"


def check_cluster_fits(pools: dict[str, Any], mapping: dict, fail_now: bool) -> None:
    """Raise (`fail_now`) or warn when the pools' placement groups cannot all be placed on the
    alive nodes' total resources; a description of both is set on every pool for the timeout."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    asked = pools_request_description(pools, mapping)
    for pool in pools.values():
        pool.request_description = asked
    if _fits(_demands(pools), nodes):
        return
    message = (
        f"the job asks for more than the Ray cluster has. Asked: {asked}. The cluster has {cluster_description()}. "
        "Use fewer processes (trainer.nnodes, trainer.n_gpus_per_node, trainer.role_pools), a smaller "
        "trainer.cpus_per_worker, or a larger cluster"
    )
    if fail_now:
        raise RuntimeError(message)
    logger.warning("%s; waiting up to trainer.placement_timeout_s for nodes to join", message)
