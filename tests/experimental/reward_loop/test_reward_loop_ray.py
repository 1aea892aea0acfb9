"""The reward loop's workers as Ray actors: the rewards of one batch are the same whichever path
(in-process or Ray) and however many workers score it; a scoring function from a file."""

import textwrap

import pytest
import torch
from omegaconf import OmegaConf
from test_reward_loop import DigitTokenizer, make_batch

from verl.experimental.reward_loop import RewardLoopManager

SCORER = textwrap.dedent(
    """
    import asyncio

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        if solution_str == "9":
            raise ValueError("nine is not allowed")
        return {"score": float(solution_str == ground_truth) + bonus, "length": len(solution_str)}

    async def compute_score_async(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        await asyncio.sleep(0.01)
        return compute_score(data_source, solution_str, ground_truth, extra_info, bonus)
    """
)


@pytest.mark.ray
def test_rewards_do_not_depend_on_the_path_or_the_number_of_workers(ray_session, tmp_path):
    """The same batch in-process and with 1 and 3 Ray workers (uneven chunks), with the sync and
    the async version of one scoring function: the same scores and extra info everywhere."""
    path = tmp_path / "scorer.py"
    path.write_text(SCORER)
    responses = ["3$", "45$", "7", "", "9$", "12$", "3$", "8", "44$", "5$", "6$"]
    answers = ["3", "4", "7", "1", "9", "12", "2", "8", "44", "5", "0"]
    data = make_batch(responses, answers)
    results = {}
    runs = [("local", 1, "compute_score"), ("local", 1, "compute_score_async")]
    runs += [("ray", 1, "compute_score"), ("ray", 3, "compute_score_async")]
    for backend, workers, fn_name in runs:
        cfg = OmegaConf.create(
            {
                "reward": {
                    "num_workers": workers,
                    "custom_reward_function": {"path": str(path), "name": fn_name, "reward_kwargs": {"bonus": 0.5}},
                    "reward_kwargs": {"error_score": -1.0},
                },
                "data": {"reward_fn_key": "data_source"},
            }
        )
        manager = RewardLoopManager(cfg, tokenizer=DigitTokenizer(), backend=backend)
        try:
            assert len(manager.reward_loop_workers) == (workers if backend == "ray" else 0)
            results[(backend, workers, fn_name)] = manager(data, return_dict=True)
        finally:
            manager.close()
    reference = results[("local", 1, "compute_score")]
    scores = reference["reward_tensor"].sum(-1)
    assert scores.tolist() == [1.5, 0.5, 1.5, 0.5, -1.0, 1.5, 0.5, 1.5, 1.5, 1.5, 0.5]
    assert reference["reward_extra_info"]["score_error"] == [i == 4 for i in range(11)]
    assert reference["reward_extra_info"]["length"][:4] == [1, 2, 1, 0]
    for key, out in results.items():
        assert torch.equal(out["reward_tensor"], reference["reward_tensor"]), key
        assert out["reward_extra_info"] == reference["reward_extra_info"], key
