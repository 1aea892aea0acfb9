"""The checks that the model and data sources of a run exist (run first by
`verl.trainer.ppo.utils.validate_config`): local files and directories, model directories with a
config.json, and hub ids that can be fetched now. Each error names the key and the value."""

from __future__ import annotations

import os
from typing import Any


def _is_local_path(path: str) -> bool:
    """A path the user means as local (absolute, ~ or relative with ./ ../), not a hub id `org/name`."""
    return path.startswith(("/", "~", "./", "../")) or os.path.splitext(path)[1] in (
        ".parquet",
        ".jsonl",
        ".json",
        ".py",
    )


def check_paths_exist(v: Any) -> None:
    """Fail before Ray starts when a local model directory, data file or reward file is missing."""
    checks: list[tuple[str, Any]] = [
        ("data.train_files", v.data.train_files),
        ("data.val_files", v.data.val_files),
        ("actor_rollout_ref.model.path", v.model.path),
        ("actor_rollout_ref.model.tokenizer_path", v.model.tokenizer_path),
        ("custom_reward_function.path", v.custom_reward_function.path),
    ]
    if v.use_critic:
        checks.append(("critic.model.path", v.critic.model.path))
    if v.use_rm:
        checks.append(("reward_model.model.path", v.reward_model.model.path))
    from verl.utils.fs import is_non_local

    for key, value in checks:
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if item is None:  # null = the embedded default
                continue
            item = str(item)
            if is_non_local(item):
                raise NotImplementedError(
                    f"{key}={item!r}: remote storage is not supported; copy it to a local path first"
                )
            if item.startswith("file://"):
                item = item[len("file://") :]
            elif "://" in item:
                continue  # another scheme: left to the loader that reads it
            local = os.path.expanduser(item)
            if _is_local_path(item) and not os.path.exists(local):
                raise FileNotFoundError(f"{key}={item!r}: no such file or directory (resolved from {os.getcwd()!r})")
            if key.startswith("data.") and os.path.isfile(local) and os.path.getsize(local) == 0:
                raise ValueError(f"{key}={item!r}: the file is empty (0 bytes); expected parquet or JSON lines rows")


def _offline_reason(repo_id: str) -> str | None:
    """Why the Hugging Face Hub id `repo_id` cannot be fetched now (None: cached or reachable)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(repo_id, "config.json")
        if isinstance(cached, str):
            return None
    except Exception:  # noqa: BLE001, S110 - an invalid id or an old hub library: fall through to the reachability test
        pass
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").lower() in ("1", "true", "yes", "on"):
            return f"{var} is set and it is not in the local Hugging Face cache"
    if any(os.environ.get(v) for v in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")):
        return None  # a proxy may reach the hub where a direct connection cannot
    import socket
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=3).close()
    except OSError as exc:
        return f"{host} cannot be reached ({exc}) and it is not in the local Hugging Face cache"
    return None


def check_model_dirs(v: Any) -> None:
    """Every model path the run loads is a local Hugging Face model directory (config.json inside),
    or a hub id that can be fetched now."""
    from verl.utils.fs import is_non_local

    checks = [("actor_rollout_ref.model.path", v.model.path)]
    if v.use_critic:
        checks.append(("critic.model.path", v.critic.model.path))
    if v.use_rm:
        checks.append(("reward_model.model.path", v.reward_model.model.path))
    for key, path in checks:
        if path is None or is_non_local(str(path)):
            continue  # null: the embedded default; remote storage: check_paths_exist refuses it
        local = os.path.expanduser(str(path).removeprefix("file://"))
        if os.path.isdir(local):
            if not os.path.isfile(os.path.join(local, "config.json")):
                raise FileNotFoundError(
                    f"{key}={path!r} is not a local model directory: config.json missing (a Hugging Face model "
                    "directory holds config.json, the weights and the tokenizer files)"
                )
        elif os.path.exists(local):
            raise ValueError(f"{key}={path!r} is a file; expected a Hugging Face model directory (with config.json)")
        elif "://" not in str(path) and not _is_local_path(str(path)):
            reason = _offline_reason(str(path))
            if reason:
                raise FileNotFoundError(
                    f"{key}={path!r} is not a local model directory and, read as a Hugging Face Hub id, cannot be "
                    f"fetched offline: {reason}. Download it first (e.g. huggingface-cli download "
                    f"{path} --local-dir DIR) "
                    "and set the key to that directory"
                )
