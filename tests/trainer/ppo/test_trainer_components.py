"""The trainer's components beside the loop: the validator's and the checkpointer's cadence, the
validation pass against a fake rollout, the checkpoint's trainer state, the generation input
shared by training and validation, and the upstream patch point `ray_trainer.compute_advantage`."""

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.main_ppo import load_default_config
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.checkpoint import TRAINER_STATE_FILE, TrainerCheckpointer
from verl.trainer.ppo.driver_ops import generation_input
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, StepContext
from verl.trainer.ppo.utils import validate_config
from verl.trainer.ppo.validation import Validator
from verl.utils.checkpoint.integrity import load_plain
from verl.workers.rollout.base import assemble_rollout_output


def bare_trainer(overrides=()):
    """A trainer without workers or data: `__init__` skipped, the config validated."""
    t = RayPPOTrainer.__new__(RayPPOTrainer)
    t.config = load_default_config(["algorithm.adv_estimator=grpo", *overrides])
    t.cfg = validate_config(t.config)
    t.callbacks, t.global_steps, t.epoch = [], 0, 0
    t.val_reward_fn = object()
    return t


def test_should_validate_every_test_freq_steps_at_the_last_and_once_per_step():
    t = bare_trainer(["trainer.test_freq=5"])
    v = t.validator
    assert [s for s in range(1, 13) if v.should_validate(s, is_last=s == 12)] == [5, 10, 12]
    v.validated_step = 12  # the end-of-run check does not validate the same step twice
    assert not v.should_validate(12, is_last=True)
    assert not v.should_validate(0, is_last=True)  # nothing trained yet
    t.val_reward_fn = None
    assert not Validator(t).should_validate(10, is_last=True)
    t = bare_trainer(["trainer.test_freq=-1"])
    assert not t.validator.should_validate(10, is_last=True)


@pytest.mark.parametrize(
    "overrides, step, expected",
    [
        ([], 0, True),  # val_before_train defaults to True on a fresh start
        ([], 3, False),  # a resumed run does not validate again before training
        (["trainer.val_before_train=False"], 0, False),
        (["trainer.val_only=True", "trainer.val_before_train=False"], 3, True),
    ],
)
def test_should_validate_before_training(overrides, step, expected):
    assert bare_trainer(overrides).validator.should_validate_before_training(step) is expected


def test_should_save_every_save_freq_steps_at_the_last_and_once_per_step():
    t = bare_trainer(["trainer.save_freq=4"])
    c = t.checkpointer
    assert [s for s in range(1, 11) if c.should_save(s, is_last=s == 10)] == [4, 8, 10]
    c.saved_step = 10
    assert not c.should_save(10, is_last=True)
    assert not bare_trainer(["trainer.save_freq=-1"]).checkpointer.should_save(8, is_last=True)


def test_components_are_created_once_and_can_be_replaced():
    t = bare_trainer()
    assert t.validator is t.validator and t.checkpointer is t.checkpointer
    mine = SimpleNamespace(validate=lambda: {"val-core/x": 1.0})
    t.validator = mine
    assert t._validate() == {"val-core/x": 1.0}


def left_padded(lens, width=4):
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lens])
    return DataProto.from_dict(
        tensors={"input_ids": mask * 7, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
        non_tensors={
            "raw_prompt": np.array(["a", "b"], dtype=object),
            "agent_name": np.array(["x", "y"], dtype=object),
        },
    )


def test_generation_input_pops_trims_and_copies_agent_fields():
    batch = left_padded([2, 1])
    gen_in = generation_input(batch, {"validate": True})
    # the prompt tensors leave the batch, the first 2 all-padding columns are dropped
    assert "input_ids" not in batch.batch.keys() and gen_in.batch["input_ids"].tolist() == [[7, 7], [0, 7]]
    assert "raw_prompt" not in batch.non_tensor_batch and list(gen_in.non_tensor_batch["raw_prompt"]) == ["a", "b"]
    # agent fields are copied: the batch keeps them for the reward
    assert list(batch.non_tensor_batch["agent_name"]) == list(gen_in.non_tensor_batch["agent_name"]) == ["x", "y"]
    assert gen_in.meta_info["validate"] is True


class CharTokenizer:
    eos_token_id, pad_token_id = 1, 0

    def batch_decode(self, seqs, skip_special_tokens=True):
        return ["".join(str(i) for i in s) for s in seqs]


class FakeRollout:
    """Answers token 5 twice to even prompts rows, token 6 twice to odd rows; records its inputs."""

    world_size = 1

    def __init__(self):
        self.meta = []

    def generate_sequences(self, p):
        self.meta.append(dict(p.meta_info))
        resp = torch.tensor([[5, 5] if i % 2 == 0 else [6, 6] for i in range(len(p))])
        return assemble_rollout_output(
            p.batch["input_ids"], p.batch["attention_mask"], p.batch["position_ids"], resp, None, [], 0
        )


def test_validate_generates_with_val_kwargs_and_reduces_per_data_source():
    t = bare_trainer(["actor_rollout_ref.rollout.val_kwargs.n=2"])
    t.tokenizer, t.use_rm, t.actor_rollout_wg = CharTokenizer(), False, FakeRollout()
    t.global_steps = 7
    batch = left_padded([2, 1])
    t.val_dataloader = [{k: v for k, v in batch.batch.items()} | {"data_source": np.array(["d", "d"], dtype=object)}]

    def score_55(data, return_dict):  # 1 on the last response token when the response is "55"
        r = torch.zeros(len(data), 2)
        r[:, -1] = (data.batch["responses"][:, 0] == 5).float()
        return {"reward_tensor": r, "reward_extra_info": {"acc": r[:, -1].tolist()}}

    t.val_reward_fn = score_55
    seen = []
    t.callbacks = [SimpleNamespace(on_validation=lambda tr, m: seen.append(dict(m)))]
    metrics = t._validate()
    meta = t.actor_rollout_wg.meta[0]
    assert meta["validate"] is True and meta["do_sample"] is False and meta["global_steps"] == 7
    # 2 prompts x 2 responses: rows 0 and 2 answer "55" (1.0), rows 1 and 3 "66" (0.0); each
    # prompt's pair is one of each, so mean@2 = 0.5 and best@2 = 1 (both samples are drawn)
    assert metrics["val-core/d/reward/mean@2"] == pytest.approx(0.5)
    assert metrics["val-core/d/acc/mean@2"] == pytest.approx(0.5)
    assert "val-core/d/reward/best@2/mean" in metrics and "val-aux/d/reward/std@2" in metrics
    assert seen == [metrics]


class FakeGroup:
    def __init__(self):
        self.loaded = []

    def save_checkpoint(self, path, hdfs, step, max_ckpt_to_keep=None):
        os.makedirs(path)
        open(os.path.join(path, "model.pt"), "w").write(str(step))

    def load_checkpoint(self, path, hdfs, del_local_after_load=False):
        self.loaded.append(path)


class FakeLoader:
    def __init__(self, pos):
        self.pos = pos

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


def test_checkpointer_saves_the_trainer_state_keys_and_resumes_them(tmp_path):
    t = bare_trainer([f"trainer.default_local_dir={tmp_path}", "trainer.resume_mode=auto"])
    t.actor_rollout_wg, t.use_critic, t.kl_ctrl_in_reward = FakeGroup(), False, None
    t.train_dataloader = FakeLoader(3)
    t.global_steps, t.epoch = 6, 1
    path = t._save_checkpoint({"x": 1.5})
    assert isinstance(t.checkpointer, TrainerCheckpointer)
    assert os.path.basename(path) == "global_step_6" and t.checkpointer.saved_step == 6
    after_save = torch.rand(3)
    state = load_plain(os.path.join(path, TRAINER_STATE_FILE))
    assert set(state) == {"global_steps", "epoch", "rng", "kl_ctrl_value", "callbacks", "step_metrics"}
    assert (state["global_steps"], state["epoch"], state["step_metrics"]) == (6, 1, {"x": 1.5})

    r = bare_trainer([f"trainer.default_local_dir={tmp_path}", "trainer.resume_mode=auto"])
    r.actor_rollout_wg, r.use_critic, r.kl_ctrl_in_reward = FakeGroup(), False, None
    r.train_dataloader = FakeLoader(0)
    torch.rand(5)
    assert r._load_checkpoint() == 6 and (r.epoch, r.train_dataloader.pos) == (1, 3)
    assert torch.equal(torch.rand(3), after_save)  # the driver's generator continues where it was saved
    assert r.actor_rollout_wg.loaded == [os.path.join(path, "actor")]
    assert r._resumed_step_metrics == {"x": 1.5}


def test_patching_ray_trainer_compute_advantage_takes_effect(monkeypatch):
    t = bare_trainer()
    calls = []

    def mine(data, adv_estimator, **kw):
        calls.append(adv_estimator)
        return data

    monkeypatch.setattr(ray_trainer, "compute_advantage", mine)
    batch = DataProto.from_dict(tensors={"token_level_scores": torch.ones(2, 3)})
    ctx = StepContext(1)
    t.compute_advantages(batch, ctx)
    assert calls == ["grpo"] and "adv" in ctx.timing
    assert torch.equal(batch.batch["token_level_rewards"], torch.ones(2, 3))
