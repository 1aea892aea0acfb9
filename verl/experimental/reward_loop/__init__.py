"""The reward loop (upstream's `verl.experimental.reward_loop`): reward workers that score each
sample on its own, concurrently, configured under `reward.*`. See docs/reward_loop.md."""

from verl.experimental.reward_loop.reward_loop import (
    RewardLoopManager,
    RewardLoopWorker,
    load_compute_score,
    migrate_legacy_reward_impl,
    resolve_reward_manager_cls,
    uses_reward_loop,
)

__all__ = [
    "RewardLoopManager",
    "RewardLoopWorker",
    "load_compute_score",
    "migrate_legacy_reward_impl",
    "resolve_reward_manager_cls",
    "uses_reward_loop",
]
