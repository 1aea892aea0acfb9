"""`verl.trainer.main_generation_server`: upstream's keys, n responses per prompt written next to
the input rows, greedy output equal to Hugging Face's greedy `generate`, and the refusals."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import build_tiny_model, save_model_dir

from verl.utils.dataset.toy_tasks import AdditionTask, addition_rl_row, generate_addition_problems


@pytest.fixture(scope="module")
def setup(tmp_path_factory, embedded_tokenizer):
    out = tmp_path_factory.mktemp("gen")
    model_dir = save_model_dir(build_tiny_model(embedded_tokenizer), embedded_tokenizer, out / "model")
    probs = generate_addition_problems(AdditionTask(1, 2), 6, seed=0, split="test")
    data = str(out / "test.parquet")
    pq.write_table(pa.Table.from_pylist([addition_rl_row(a, b, "test", i) for i, (a, b) in enumerate(probs)]), data)
    return model_dir, data, out


def _config(model_dir, data, output, *over):
    from hydra import compose, initialize_config_module

    overrides = [
        f"data.train_files={data}",
        "data.prompt_key=prompt",
        f"+data.output_path={output}",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.prompt_length=16",
        "actor_rollout_ref.rollout.response_length=6",
        "trainer.device=cpu",
        *over,
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def test_greedy_generation_equals_hf_generate_and_sampling_writes_n(setup):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.trainer.main_generation_server import generate_responses

    torch.set_num_threads(1)
    model_dir, data, out = setup
    path = generate_responses(
        _config(
            model_dir,
            data,
            out / "greedy.parquet",
            "actor_rollout_ref.rollout.temperature=0",
            "actor_rollout_ref.rollout.n=1",
        )
    )
    table = pq.read_table(path)
    assert table.schema.names == [*pq.read_table(data).schema.names, "responses"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    for row in table.to_pylist():
        ids = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, return_tensors="pt", return_dict=True)
        gen = model.generate(**ids, do_sample=False, max_new_tokens=6, pad_token_id=tok.pad_token_id)
        expected = tok.decode(gen[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
        assert row["responses"] == [expected]
    sampled = (
        pq.read_table(
            generate_responses(
                _config(
                    model_dir,
                    data,
                    out / "s.parquet",
                    "actor_rollout_ref.rollout.temperature=1.0",
                    "actor_rollout_ref.rollout.n=3",
                    "actor_rollout_ref.rollout.top_k=5",
                )
            )
        )
        .column("responses")
        .to_pylist()
    )
    assert len(sampled) == 6 and all(len(r) == 3 for r in sampled)


def test_what_cannot_run_is_named(setup):
    from verl.trainer.main_generation_server import generate_responses

    model_dir, data, out = setup
    with pytest.raises(ValueError, match="temperature=0 is greedy: rollout.n must be 1, got 2"):
        generate_responses(
            _config(
                model_dir,
                data,
                out / "x.parquet",
                "actor_rollout_ref.rollout.temperature=0",
                "actor_rollout_ref.rollout.n=2",
            )
        )
    with pytest.raises(ValueError, match="rollout.name='vllm'.*not available"):
        generate_responses(_config(model_dir, data, out / "x.parquet", "actor_rollout_ref.rollout.name=vllm"))
    cfg = _config(model_dir, data, out / "x.parquet")
    cfg.data.output_path = None
    with pytest.raises(ValueError, match=r"data.output_path is required: append \+data.output_path="):
        generate_responses(cfg)
