"""Where the embedded default lives: the tiny model and the toy task shipped with verl.

`python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo` with no model and no data trains this:

* model: a ~1M-parameter `LlamaForCausalLM` with its own byte-level tokenizer and chat template,
  warmed up by a short SFT (`scripts/build_embedded_default.py`) on an imperfect teacher who drops the
  carry in 70% of the additions it demonstrates;
* data: `verl_toy/addition` prompts like ``"47+85"`` (two-digit operands) with the sum as ground
  truth, scored by `verl.utils.reward_score.verl_toy`.

Everything is under ``verl/assets/embedded_default/`` (``model/``, ``data/{train,test}.parquet``,
``sft/`` and ``build_info.json`` with the build arguments and measured accuracies). The environment
variable ``VERL_EMBEDDED_DEFAULT_DIR`` points these functions at another build (for example one made
with ``scripts/build_embedded_default.py --output_dir DIR`` and different sizes).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = [
    "DATA_SOURCE",
    "asset_dir",
    "model_path",
    "train_files",
    "val_files",
    "default_model_path",
    "default_data_files",
    "build_info",
    "recommended_overrides",
    "calculator_dir",
    "CALCULATOR_DATA_SOURCE",
]

DATA_SOURCE = "verl_toy/addition"
ENV_DIR = "VERL_EMBEDDED_DEFAULT_DIR"
_SHIPPED = Path(__file__).resolve().parents[1] / "assets" / "embedded_default"
_REBUILD = "python scripts/build_embedded_default.py --output_dir {dir}"
CALCULATOR_DATA_SOURCE = "verl_toy/calculator"
_CALC_ENV_DIR = "VERL_EMBEDDED_CALCULATOR_DIR"
_CALC_SHIPPED = _SHIPPED.parent / "embedded_calculator"


def asset_dir() -> Path:
    """The embedded-default directory (``$VERL_EMBEDDED_DEFAULT_DIR`` or the one shipped in verl/assets)."""
    return Path(os.environ.get(ENV_DIR) or _SHIPPED)


def _require(path: Path, what: str) -> str:
    if not path.exists():
        raise FileNotFoundError(
            f"embedded default {what} not found at {path}. Rebuild it from a source checkout with "
            f"`{_REBUILD.format(dir=asset_dir())}` or set {ENV_DIR} to a built directory."
        )
    return str(path)


def model_path() -> str:
    """Hugging Face directory of the warmed-up tiny model (config, safetensors, tokenizer)."""
    return _require(asset_dir() / "model" / "model.safetensors", "model").rsplit(os.sep, 1)[0]


def default_data_files(split: str = "train") -> str:
    """Parquet file of the toy task: ``split`` is "train" (RL prompts) or "test" (validation)."""
    if split not in ("train", "test"):
        raise ValueError(f"embedded default split must be 'train' or 'test', got {split!r}")
    return _require(asset_dir() / "data" / f"{split}.parquet", f"{split} data")


def train_files() -> str:
    return default_data_files("train")


def val_files() -> str:
    return default_data_files("test")


def default_model_path() -> str:
    return model_path()


def build_info() -> dict:
    """Contents of build_info.json: build arguments, SFT time/loss, test-split accuracies, sizes."""
    return json.loads(Path(_require(asset_dir() / "build_info.json", "build_info.json")).read_text())


def recommended_overrides() -> dict[str, object]:
    """Config values under which the shipped default was checked to learn (measured, see build_info.json).

    Prompts are 9 tokens and answers at most 4 (3 digits + eos), so short limits keep CPU steps fast.
    The learning rate matters most: the model is tiny and 1e-6 (the upstream default for 7B models) moves
    it far too slowly for a 10-minute run.
    """
    return {
        "data.max_prompt_length": 16,
        "data.max_response_length": 8,
        "data.train_batch_size": 32,
        "actor_rollout_ref.rollout.n": 8,
        "actor_rollout_ref.rollout.temperature": 1.0,
        "actor_rollout_ref.actor.optim.lr": 3e-5,
    }


def calculator_dir() -> str:
    """The calculator (tool-use) task shipped next to the embedded default
    (``$VERL_EMBEDDED_CALCULATOR_DIR`` or verl/assets/embedded_calculator): ``model/``,
    ``data/{train,test}.parquet``, ``sft/``, ``tool_config.yaml``, ``build_info.json``. Built by
    ``python scripts/build_embedded_default.py --task calculator``; used by recipes/tool_agent.sh."""
    path = Path(os.environ.get(_CALC_ENV_DIR) or _CALC_SHIPPED)
    if not (path / "model" / "model.safetensors").exists():
        raise FileNotFoundError(
            f"embedded calculator task not found at {path}. Rebuild it from a source checkout with "
            f"`python scripts/build_embedded_default.py --task calculator --output_dir {path}` or set {_CALC_ENV_DIR}."
        )
    return str(path)
