"""verl.utils.reproducibility: switching torch's deterministic algorithms and the run's environment."""

import torch
import torch.utils.deterministic

from verl.utils.reproducibility import (
    current_determinism,
    environment,
    environment_differences,
    restore_determinism,
    set_deterministic,
)


def test_set_deterministic_switches_torch_and_restore_gives_the_settings_back():
    before = current_determinism()
    try:
        previous = set_deterministic(True)
        assert previous == before
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()  # a CUDA op without one warns
        assert torch.utils.deterministic.fill_uninitialized_memory is False  # the costly debug fill is off
        set_deterministic(False)
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        restore_determinism(before)
    assert current_determinism() == before


def test_environment_records_versions_threads_and_device():
    env = environment(threads=2, device="cpu")
    assert env["torch"] == torch.__version__ and env["torch_threads"] == 2 and env["device"] == "cpu"
    assert {"transformers", "verl", "cpu_count", "hardware", "python"} <= set(env)


def test_environment_differences_name_what_changed_and_ignore_python():
    recorded = {"torch": "2.13.0", "torch_threads": 2, "python": "3.11.1", "hardware": "cpu A"}
    current = {"torch": "2.14.0", "torch_threads": 2, "python": "3.12.0", "hardware": "cpu A"}
    assert environment_differences(recorded, current) == ["torch: '2.13.0' -> '2.14.0'"]
    assert environment_differences(recorded, dict(recorded)) == []
