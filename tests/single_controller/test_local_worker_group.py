"""`LocalWorkerGroup`: one worker inside the driver process, behind the same `@register` dispatch as
Ray's group, with what a separate process would give it (own random generators and environment,
arguments and results by value, errors naming the worker)."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
import torch.distributed as dist

from verl import DataProto
from verl.protocol import DataProtoFuture
from verl.single_controller.base import ResourcePool, Worker
from verl.single_controller.base.decorator import Dispatch, Execute, register
from verl.single_controller.base.worker_group import ClassWithInitArgs
from verl.single_controller.local import LocalWorkerGroup, WorkerRngs, create_local_colocated_worker_cls
from verl.single_controller.ray.calls import WorkerCallError


class Counter(Worker):
    def __init__(self, config: dict, seed: int | None = None):
        super().__init__()
        self.config = config
        if seed is not None:
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def identity(self):
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "env_rank": os.environ.get("RANK"),
            "backend": os.environ.get("WG_BACKEND"),
            "device": os.environ.get("VERL_DEVICE"),
            "threads": torch.get_num_threads(),
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def draw(self, n: int):
        return torch.rand(n), random.random(), float(np.random.rand())

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double_in_place(self, data: DataProto) -> DataProto:
        data.batch["x"].mul_(2)  # in place: must not reach the driver's batch
        data.meta_info["seen"] = True
        return DataProto.from_dict({"y": data.batch["x"] + 1})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def edit_config(self):
        self.config["lr"] = -1.0
        return self.config["lr"]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def buffer_view(self):
        if not hasattr(self, "buffer"):
            self.buffer = torch.zeros(4)
        self.buffer += 1
        return self.buffer[:2]  # a view of a buffer the worker changes again on the next call

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_env(self, key: str, value: str):
        os.environ[key] = value
        torch.set_num_threads(1)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_env(self, key: str):
        return os.environ.get(key)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail(self):
        raise KeyError("no such row")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def later(self, x: int):
        return x * 10

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rank_zero(self, x):
        return x + 1

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def plus_one_later(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"y": data.batch["x"] + 1})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_group(self):
        self.init_process_group_if_needed()
        return dist.get_world_size()


def _group(**init):
    return LocalWorkerGroup(ResourcePool([1]), ClassWithInitArgs(Counter, config={"lr": 0.1}, **init))


def test_the_worker_sees_a_one_rank_group_environment_only_during_calls(monkeypatch):
    monkeypatch.setenv("VERL_DEVICE", "cpu")
    wg = LocalWorkerGroup(
        ResourcePool([1]), ClassWithInitArgs(Counter, config={}), num_threads_per_worker=torch.get_num_threads()
    )
    monkeypatch.delenv("VERL_DEVICE")
    before = os.environ.get("RANK")
    got = wg.identity()
    assert got == [
        {
            "rank": 0,
            "world_size": 1,
            "env_rank": "0",
            "backend": "local",
            "device": "cpu",  # the driver's VERL_* variables as they were at creation
            "threads": torch.get_num_threads(),
        }
    ]
    assert os.environ.get("RANK") == before and "VERL_DEVICE" not in os.environ
    assert wg.world_size == 1
    assert wg.master_address == "127.0.0.1" and int(wg.master_port) > 0  # the worker's rendezvous
    wg.kill_workers()


def test_what_the_worker_sets_in_its_environment_stays_its_own(monkeypatch):
    monkeypatch.delenv("VERL_TEST_WORKER_VAR", raising=False)
    threads = torch.get_num_threads()
    wg = _group()
    wg.set_env("VERL_TEST_WORKER_VAR", "1")
    assert "VERL_TEST_WORKER_VAR" not in os.environ
    assert wg.get_env("VERL_TEST_WORKER_VAR") == ["1"]  # kept between the worker's calls
    monkeypatch.setenv("VERL_TEST_DRIVER_VAR", "2")  # set by the driver after the worker started
    assert wg.get_env("VERL_TEST_DRIVER_VAR") == [None]
    wg.kill_workers()
    assert torch.get_num_threads() == threads  # the worker's thread count is given back


def test_driver_and_worker_random_streams_are_those_of_two_processes():
    # reference: what a fresh process seeded by the worker draws, and what the driver draws
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    worker_expected = (torch.rand(3), random.random(), float(np.random.rand()))
    torch.manual_seed(11)
    driver_expected = torch.rand(3)

    wg = _group(seed=7)  # the worker seeds its generators in __init__ ...
    torch.manual_seed(11)  # ... and the driver seeds its own
    t, r, n = wg.draw(3)[0]
    driver_draw = torch.rand(3)
    assert torch.equal(t, worker_expected[0]) and r == worker_expected[1] and n == worker_expected[2]
    assert torch.equal(driver_draw, driver_expected)  # the worker's draws did not advance the driver's stream
    # the worker's stream continues where it stopped
    again = wg.draw(3)[0][0]
    torch.manual_seed(7)
    torch.rand(3)
    assert torch.equal(again, torch.rand(3))
    wg.kill_workers()


def test_a_fresh_worker_starts_from_torchs_default_seed():
    torch.manual_seed(123)  # the driver's seed must not leak into a worker that never seeds
    wg = _group()
    fresh = torch.Generator()  # torch's default seed, as in a new process
    assert torch.equal(wg.draw(2)[0][0], torch.rand(2, generator=fresh))
    wg.kill_workers()


def test_arguments_and_results_are_passed_by_value():
    config = {"lr": 0.1}
    wg = LocalWorkerGroup(ResourcePool([1]), ClassWithInitArgs(Counter, config=config))
    data = DataProto.from_dict({"x": torch.arange(4.0)}, meta_info={})
    out = wg.double_in_place(data)
    assert torch.equal(out.batch["y"], torch.arange(4.0) * 2 + 1)
    assert torch.equal(data.batch["x"], torch.arange(4.0)) and "seen" not in data.meta_info
    assert wg.edit_config() == [-1.0] and config["lr"] == 0.1
    first = wg.buffer_view()[0]
    wg.buffer_view()
    assert torch.equal(first, torch.ones(2))  # the worker's later change did not reach the result
    wg.kill_workers()


def test_a_raising_method_names_the_worker_and_keeps_the_cause():
    wg = _group()
    with pytest.raises(
        WorkerCallError, match=r"Counter.fail on rank 0 \(in-process\) raised an exception: KeyError"
    ) as info:
        wg.fail()
    assert isinstance(info.value.__cause__, KeyError) and info.value.rank == 0 and info.value.method == "fail"
    wg.kill_workers()


def test_a_raising_constructor_is_a_worker_call_error():
    with pytest.raises(WorkerCallError, match=r"Counter.__init__ on rank 0 \(in-process\)"):
        LocalWorkerGroup(ResourcePool([1]), ClassWithInitArgs(Counter))  # config missing


def test_coroutines_rank_zero_and_non_blocking_methods():
    wg = _group()
    assert wg.later(4) == [40]
    assert wg.rank_zero(1) == 2
    future = wg.plus_one_later(DataProto.from_dict({"x": torch.arange(3)}))
    assert isinstance(future, DataProtoFuture)
    assert torch.equal(future.get().batch["y"], torch.arange(1, 4))
    wg.kill_workers()


def _rank_and_rows(worker, data: DataProto) -> DataProto:
    return DataProto.from_dict({"rank": torch.full((len(data),), worker.rank), "x": data.batch["x"]})


def test_functions_travel_to_the_worker_with_dp_compute_proto_with_func():
    wg = _group()
    out = wg.execute_with_func_generator(_rank_and_rows, DataProto.from_dict({"x": torch.arange(5.0)}))
    assert torch.equal(out.batch["rank"], torch.zeros(5, dtype=torch.long))
    assert torch.equal(out.batch["x"], torch.arange(5.0))
    wg.kill_workers()


def test_kill_workers_drops_the_worker_and_the_process_group_it_made():
    wg = _group()
    assert not dist.is_initialized()
    assert wg.init_group() == [1]
    assert dist.is_initialized()
    wg.kill_workers()
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="shut down"):
        wg.identity()


def test_colocated_roles_share_one_worker_and_keep_their_names():
    class_dict = {
        "actor": ClassWithInitArgs(Counter, config={"lr": 1.0}),
        "critic": ClassWithInitArgs(Counter, config={"lr": 2.0}),
    }
    wg = LocalWorkerGroup(ResourcePool([1]), create_local_colocated_worker_cls(class_dict))
    roles = wg.spawn(prefix_set=class_dict.keys())
    assert roles["actor"].edit_config() == [-1.0]
    assert roles["critic"].rank_zero(5) == 6
    assert class_dict["actor"].kwargs["config"]["lr"] == 1.0  # the role got a copy
    wg.kill_workers()
    with pytest.raises(RuntimeError, match="shut down"):
        roles["critic"].identity()


def test_only_one_cpu_worker_fits_in_the_driver():
    with pytest.raises(ValueError, match="exactly one worker"):
        LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(Counter, config={}))
    with pytest.raises(ValueError, match="CPU jobs only"):
        LocalWorkerGroup(ResourcePool([1]), ClassWithInitArgs(Counter, config={}), device_name="cuda")


def test_worker_rngs_block_keeps_its_state_between_blocks():
    rngs = WorkerRngs()
    torch.manual_seed(0)
    outside = torch.get_rng_state()
    with rngs.active():
        torch.manual_seed(5)
        a = torch.rand(1)
    assert torch.equal(torch.get_rng_state(), outside)
    with rngs.active():
        b = torch.rand(1)
    torch.manual_seed(5)
    assert torch.equal(a, torch.rand(1)) and torch.equal(b, torch.rand(1))


def test_execute_rank_zero_mode_on_all_to_all():
    class Adder(Worker):
        @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
        def add(self, a, b):
            return a + b

    wg = LocalWorkerGroup(ResourcePool([1]), ClassWithInitArgs(Adder))
    assert wg.add(2, 3) == 5
    wg.kill_workers()


class DeterministicWorker(Worker):
    """A worker that switches torch's deterministic algorithms on, as the trainer's workers do."""

    def __init__(self):
        super().__init__()
        from verl.utils.reproducibility import set_deterministic

        set_deterministic(True)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def deterministic(self):
        return torch.are_deterministic_algorithms_enabled()


def test_the_workers_deterministic_algorithms_are_given_back_to_the_driver_at_close():
    from verl.utils.reproducibility import current_determinism, restore_determinism, set_deterministic

    original = set_deterministic(False)  # whatever an earlier test left, the driver starts with it off
    try:
        before = current_determinism()
        wg = LocalWorkerGroup(ResourcePool([1]), ClassWithInitArgs(DeterministicWorker))
        assert wg.deterministic() == [True]
        wg.kill_workers()
        assert current_determinism() == before and not before.enabled
    finally:
        restore_determinism(original)
