"""`python -m verl.experimental.one_step_off_policy.main_ppo key=value ...` (upstream's entry point).

Config `one_step_off_ppo_trainer`: the PPO config plus the top-level `rollout.nnodes` /
`rollout.n_gpus_per_node` (the rollout's own processes), `hybrid_engine=False`, the checkpoint
engine, and the rollout's log-probs as the old ones (`bypass_mode`). Batch t+1 is generated with
the weights after step t-1 while step t trains: the asynchronous trainer with

    trainer.v1.trainer_mode=separate_async, separate_async.num_warmup_batches=1,
    separate_async.parameter_sync_step = train_batch_size / ppo_mini_batch_size,
    sampler.max_off_policy_threshold=2 (staleness 1), sampler.max_off_policy_strategy=wait

set here (`one_step_off_config`); `trainer.v1.*` on this command line is refused (use
`python -m verl.trainer.main_ppo` for other modes).
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config")
CONFIG_NAME = "one_step_off_ppo_trainer"
# the embedded toy job (no model given) runs one rollout process, as it runs one actor process
EMBEDDED_ROLLOUT = {"rollout.n_gpus_per_node": 1}

__all__ = ["CONFIG_NAME", "load_config", "main", "one_step_off_config"]


def one_step_off_config(config: DictConfig, overrides: list[str] | None = None) -> DictConfig:
    """The run config of this entry point from the composed `one_step_off_ppo_trainer` config:
    the top-level `rollout` section moved into `actor_rollout_ref.rollout`, and the one-step-off
    settings of `trainer.v1`. `overrides`: the command line (its `trainer.v1.*` are refused)."""
    from verl.trainer.config.upstream_keys import _is_embedded_model, override_keys

    user = override_keys(overrides)
    mine = sorted(k for k in user if k == "trainer.v1" or k.startswith("trainer.v1."))
    if mine:
        raise ValueError(
            f"{', '.join(mine)}: python -m verl.experimental.one_step_off_policy.main_ppo sets trainer.v1 itself "
            "(separate_async, one batch ahead); for other settings use python -m verl.trainer.main_ppo "
            "actor_rollout_ref.hybrid_engine=False trainer.v1.trainer_mode=separate_async ..."
        )
    config = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    with open_dict(config):
        section = config.pop("rollout", None) or {}
        if _is_embedded_model(OmegaConf.select(config, "actor_rollout_ref.model.path")):
            for key, value in EMBEDDED_ROLLOUT.items():
                if key not in user:
                    section[key.split(".", 1)[1]] = value
        for key in ("nnodes", "n_gpus_per_node"):
            if key in section:
                config.actor_rollout_ref.rollout[key] = section[key]
        tbs = int(config.data.train_batch_size)
        mini = int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
        v1 = config.trainer.v1
        v1.trainer_mode = "separate_async"
        v1.separate_async.num_warmup_batches = 1
        # one step trains the whole batch in its mini-batches, then syncs (checked: mini divides tbs)
        v1.separate_async.parameter_sync_step = max(1, tbs // mini) if mini > 0 else 1
        v1.sampler.max_off_policy_threshold = 2
        v1.sampler.max_off_policy_strategy = "wait"
    return config


def load_config(overrides: list[str] | None = None) -> DictConfig:
    """The run config of `python -m verl.experimental.one_step_off_policy.main_ppo <overrides>`
    without running it (tests, notebooks)."""
    from hydra import compose, initialize_config_dir

    from verl.trainer.config.upstream_keys import apply_embedded_preset, normalize_overrides

    overrides = normalize_overrides(list(overrides or []))
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name=CONFIG_NAME, overrides=overrides)
    cfg = apply_embedded_preset(cfg, overrides)
    return one_step_off_config(cfg, overrides)


@hydra.main(config_path="config", config_name=CONFIG_NAME, version_base=None)
def main(config: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from verl.trainer.config.upstream_keys import apply_embedded_preset
    from verl.trainer.main_ppo import run_ppo

    overrides = list(HydraConfig.get().overrides.task)
    with open_dict(config):
        config.pop("hydra", None)
    run_ppo(one_step_off_config(apply_embedded_preset(config, overrides), overrides))


if __name__ == "__main__":
    from verl.trainer.main_ppo import _normalized_argv, exit_now

    sys.argv = _normalized_argv(sys.argv)
    main()
    exit_now(0)
