"""The Ray single controller on a 2-worker CPU group: dispatch modes, collectives, colocation,
futures chained between groups, and failures (a raising worker, a killed worker, a hang)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
import torch

from verl import DataProto
from verl.protocol import DataProtoFuture, all_gather_data_proto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, Execute, make_nd_compute_dataproto_dispatch_fn, register
from verl.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerCallError,
    create_colocated_worker_cls,
)

pytestmark = pytest.mark.ray

# State shared by colocated roles: they are objects in one process, so module globals are shared.
_SHARED: dict = {}


def _sum_outputs(worker_group, outputs):
    return sum(outputs)


def _offset_per_rank(worker_group, x):
    return ([x + rank for rank in range(worker_group.world_size)],), {}


def rank_column(worker, data: DataProto) -> DataProto:
    """For DP_COMPUTE_PROTO_WITH_FUNC: a column holding the rank that processed each row."""
    return DataProto.from_dict({"by": torch.full((len(data),), worker.rank), "ids0": data.batch["ids"][:, 0]})


def triple(x):
    return 3 * x


class DemoWorker(Worker):
    def __init__(self, scale: int = 1):
        super().__init__()
        self.scale = scale

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self):
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "pid": os.getpid(),
            "threads": torch.get_num_threads(),
            "omp": os.environ.get("OMP_NUM_THREADS"),
            "master": self.get_master_addr_port(),
            "forwarded": os.environ.get("VERL_TEST_FORWARDED"),
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add(self, x, y=0):
        return x + y + self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def count_rows(self, data: DataProto):
        return len(data)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def echo(self, x):
        return self.rank, x

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def times_rank(self, x):
        return x * (self.rank + 1)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def scale_ids(self, data: DataProto) -> DataProto:
        return self._scaled(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def scale_ids_async(self, data: DataProto) -> DataProto:
        return self._scaled(data)

    def _scaled(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(
            {"out": data.batch["ids"] * self.scale, "by": torch.full((len(data),), self.rank)},
            {"uid": data.non_tensor_batch["uid"]},
            meta_info={"metrics": {"rows": len(data)}, "scale": self.scale},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def fail_proto(self, data: DataProto) -> DataProto:
        if self.rank == 1:
            raise RuntimeError("producer failed on purpose")
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def row_count(self, data: DataProto):
        return {"rank": self.rank, "rows": len(data)}

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rank_zero_only(self, x):
        return self.rank, x

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def one_on_rank_zero(self):
        return self.rank

    @register(dispatch_mode={"dispatch_fn": _offset_per_rank, "collect_fn": _sum_outputs})
    def custom(self, x):
        return 10 * x

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def register_mesh(self, mesh_name: str, dp_ranks: list, collect: list):
        self._register_dispatch_collect_info(mesh_name, dp_rank=dp_ranks[self.rank], is_collect=collect[self.rank])

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("tp"))
    def tp_compute(self, data: DataProto) -> DataProto:
        return rank_column(self, data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("reversed"))
    def reversed_compute(self, data: DataProto) -> DataProto:
        return rank_column(self, data)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def allreduce(self, value: float):
        import torch.distributed as dist

        self.init_process_group_if_needed()
        t = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(t)
        return t.item(), dist.get_backend()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def gather_uneven(self):
        self.init_process_group_if_needed()
        n = 3 * self.rank  # rank 0 contributes no rows
        local = DataProto.from_dict(
            {"r": torch.full((n, 2), self.rank, dtype=torch.bfloat16), "flag": torch.ones(n, dtype=torch.bool)},
            {"s": [f"r{self.rank}.{i}" for i in range(n)]},
        )
        all_gather_data_proto(local)
        return (
            local.batch["r"][:, 0].float().tolist(),
            local.batch["flag"].all().item(),
            local.non_tensor_batch["s"].tolist(),
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int):
        if self.rank == rank:
            raise ValueError(f"deliberate failure on rank {rank}")
        return "ok"


class RoleA(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def put(self, key, value):
        _SHARED[key] = (value, self.rank)
        return os.getpid()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def consume(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"plus": data.batch["out"] + 1, "by": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def consume_async(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"plus": data.batch["out"] + 1})


class RoleB(Worker):
    def __init__(self, tag: str):
        super().__init__()
        self.tag = tag

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get(self, key):
        return _SHARED.get(key), os.getpid(), self.tag

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def async_tag(self, suffix: str):
        await asyncio.sleep(0)
        return f"{self.tag}{suffix}{self.rank}"


class FragileWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self):
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_or_sleep(self, fail_rank: int, seconds: float):
        if self.rank == fail_rank:
            raise RuntimeError(f"rank {self.rank} gives up")
        time.sleep(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float):
        time.sleep(seconds)
        return self.rank


class BadInitWorker(Worker):
    def __init__(self):
        super().__init__()
        if self.rank == 1:
            raise RuntimeError("cannot start rank 1")


def make_data(n: int, **kwargs) -> DataProto:
    return DataProto.from_dict(
        {"ids": torch.arange(n * 4, dtype=torch.int64).reshape(n, 4)}, {"uid": [f"u{i}" for i in range(n)]}, **kwargs
    )


def wait_gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def demo(ray_session):
    os.environ["VERL_TEST_FORWARDED"] = "yes"
    try:
        pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=1)
        wg = RayWorkerGroup(
            pool, RayClassWithInitArgs(cls=ray_session.remote(DemoWorker), scale=2), num_threads_per_worker=2
        )
    finally:
        del os.environ["VERL_TEST_FORWARDED"]
    yield wg
    wg.kill_workers()
    pool.release()


@pytest.fixture(scope="module")
def roles(ray_session):
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    class_dict = {
        "a": RayClassWithInitArgs(cls=ray_session.remote(RoleA)),
        "b": RayClassWithInitArgs(cls=RoleB, tag="B"),
    }
    wg = RayWorkerGroup(pool, create_colocated_worker_cls(class_dict))
    yield wg, wg.spawn(prefix_set=class_dict.keys())
    wg.kill_workers()
    pool.release()


# ----------------------------------------------------------------------------- group basics


def test_workers_know_rank_env_and_threads(demo):
    infos = demo.whoami()
    assert demo.world_size == 2
    assert [i["rank"] for i in infos] == [0, 1] and {i["world_size"] for i in infos} == {2}
    assert [i["local_rank"] for i in infos] == [0, 1]
    assert infos[0]["pid"] != infos[1]["pid"]
    assert {i["threads"] for i in infos} == {2} and {i["omp"] for i in infos} == {"2"}
    assert infos[0]["master"] == infos[1]["master"] == (demo.master_address, demo.master_port)
    assert {i["forwarded"] for i in infos} == {"yes"}  # VERL_* variables reach the workers
    assert len(demo.worker_names) == 2 and len(demo.workers) == 2


def test_one_to_all_all_to_all_dp_compute(demo):
    assert demo.add(1, y=2) == [3, 4]
    assert demo.echo([10, 20]) == [(0, 10), (1, 20)]
    assert demo.echo("same") == [(0, "same"), (1, "same")]
    assert demo.times_rank([10, 20]) == [10, 40]
    with pytest.raises(ValueError, match="positional argument 0 must be a list with one entry per worker"):
        demo.times_rank([1, 2, 3])
    assert demo.count_rows(make_data(3)) == [3, 3]  # a DataProto sent whole to every worker


def test_dp_compute_proto_splits_and_concatenates(demo):
    data = make_data(6)
    out = demo.scale_ids(data)
    assert torch.equal(out.batch["out"], data.batch["ids"] * 2)
    assert out.batch["by"].tolist() == [0, 0, 0, 1, 1, 1]
    assert out.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist()
    assert out.meta_info == {"metrics": {"rows": [3, 3]}, "scale": 2}
    with pytest.raises(ValueError, match="5 rows cannot be split into 2 equal chunks"):
        demo.scale_ids(make_data(5))


def test_dp_compute_proto_auto_padding(demo):
    data = make_data(5, auto_padding=True)
    out = demo.scale_ids(data)
    assert len(out) == 5 and torch.equal(out.batch["out"], data.batch["ids"] * 2)
    assert out.meta_info["metrics"]["rows"] == [3, 3]  # padded to 6 for the workers
    assert len(data) == 5  # the caller's batch is not padded in place
    later = demo.scale_ids_async(data)
    assert isinstance(later, DataProtoFuture) and len(later.get()) == 5


def test_metric_with_func_rank_zero_custom(demo):
    assert demo.row_count(make_data(4)) == [{"rank": 0, "rows": 2}, {"rank": 1, "rows": 2}]
    out = demo.execute_with_func_generator(rank_column, make_data(4))
    assert out.batch["by"].tolist() == [0, 0, 1, 1]
    assert demo.execute_func_rank_zero(triple, 5) == 15
    assert demo.rank_zero_only(7) == (0, 7)
    assert demo.one_on_rank_zero() == 0
    assert demo.custom(1) == 10 * 1 + 10 * 2
    assert demo.execute_all_sync("add", 5) == [5, 6]
    assert demo.execute_rank_zero_sync("add", 5) == 5


def test_mesh_aware_dispatch(demo):
    # "tp": both workers are one data-parallel rank (a tensor-parallel pair): both see all rows,
    # only rank 0's output is collected.
    demo.register_mesh("tp", dp_ranks=[0, 0], collect=[True, False])
    out = demo.tp_compute(make_data(4))
    assert out.batch["by"].tolist() == [0, 0, 0, 0] and out.batch["ids0"].tolist() == [0, 4, 8, 12]
    # "reversed": dp rank = 1 - rank; results come back in data order, not rank order
    demo.register_mesh("reversed", dp_ranks=[1, 0], collect=[True, True])
    out = demo.reversed_compute(make_data(4))
    assert out.batch["ids0"].tolist() == [0, 4, 8, 12] and out.batch["by"].tolist() == [1, 1, 0, 0]
    with pytest.raises(WorkerCallError, match="already registered"):
        demo.register_mesh("tp", dp_ranks=[0, 0], collect=[True, False])


def test_gloo_collectives_inside_group(demo):
    assert demo.allreduce(1.0) == [(3.0, "gloo"), (3.0, "gloo")]
    expected = ([1.0, 1.0, 1.0], True, ["r1.0", "r1.1", "r1.2"])
    assert demo.gather_uneven() == [expected, expected]


def test_pool_refuses_more_groups_than_colocate_count(demo):
    with pytest.raises(RuntimeError, match="max_colocate_count"):
        RayWorkerGroup(demo._resource_pool, RayClassWithInitArgs(cls=DemoWorker))


def test_placement_timeout_is_reported(ray_session):
    pool = RayResourcePool([2], use_gpu=False, num_cpus_per_worker=64, placement_timeout_s=1)
    t0 = time.monotonic()
    with pytest.raises(
        RuntimeError,
        match=r"could not place the workers within 1 s. Asked: \[2\] process slots per node of \{.CPU.: 64.0\}",
    ):
        pool.get_placement_groups()
    assert time.monotonic() - t0 < 10


# ----------------------------------------------------------------------------- colocation and futures


def test_colocated_roles_share_a_process(roles):
    wg, groups = roles
    assert set(groups) == {"a", "b"}
    assert hasattr(groups["a"], "put") and not hasattr(groups["a"], "get")
    assert hasattr(groups["b"], "get") and not hasattr(groups["b"], "put")
    pids = groups["a"].put("k", 41)
    seen = groups["b"].get("k")
    assert [s[0] for s in seen] == [(41, 0), (41, 1)]
    assert [s[1] for s in seen] == pids and pids[0] != pids[1]
    assert {s[2] for s in seen} == {"B"}
    assert groups["b"].async_tag("-") == ["B-0", "B-1"]
    assert wg.a_put("k2", 1) == pids  # the combined group exposes role-prefixed names


def test_future_chained_between_groups(demo, roles):
    _, groups = roles
    data = make_data(8)
    future = demo.scale_ids_async(data)
    assert isinstance(future, DataProtoFuture) and len(future.futures) == 2
    out = groups["a"].consume(future)  # resolved inside the consumer workers, not on the driver
    assert torch.equal(out.batch["plus"], data.batch["ids"] * 2 + 1)
    assert out.batch["by"].tolist() == [0] * 4 + [1] * 4
    again = groups["a"].consume_async(demo.scale_ids_async(data))
    assert isinstance(again, DataProtoFuture)
    assert torch.equal(again.get().batch["plus"], data.batch["ids"] * 2 + 1)
    assert torch.equal(future.get().batch["out"], data.batch["ids"] * 2)


def test_failed_producer_is_named_by_consumer(demo, roles):
    _, groups = roles
    future = demo.fail_proto(make_data(4))
    with pytest.raises(WorkerCallError) as info:
        groups["a"].consume(future)
    text = str(info.value)
    assert "consume" in text and "DemoWorker.fail_proto on rank 1" in text and "producer failed on purpose" in text


# ----------------------------------------------------------------------------- failures


def test_raising_worker_names_rank_method_and_traceback(demo):
    t0 = time.monotonic()
    with pytest.raises(WorkerCallError) as info:
        demo.fail_on(1)
    assert time.monotonic() - t0 < 10
    err = info.value
    assert err.rank == 1 and err.method == "fail_on"
    text = str(err)
    assert "DemoWorker.fail_on on rank 1" in text and "deliberate failure on rank 1" in text and "in fail_on" in text
    assert demo.add(0) == [0, 1]  # the group keeps working


@pytest.mark.slow
def test_dead_hung_and_failing_workers_raise_promptly(ray_session):
    pool = RayResourcePool([2], use_gpu=False)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(cls=FragileWorker), call_timeout_s=None)
    try:
        pids = wg.pid()
        # rank 1 fails while rank 0 is busy for a minute: the error must not wait for rank 0
        t0 = time.monotonic()
        with pytest.raises(WorkerCallError, match="(?s)fail_or_sleep on rank 1.*gives up"):
            wg.fail_or_sleep(1, 60)
        assert time.monotonic() - t0 < 10
        # rank 0 is now stuck: a bounded call says who did not answer
        wg.call_timeout_s = 1.0
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="FragileWorker.pid on rank 0"):
            wg.pid()
        assert time.monotonic() - t0 < 5
        wg.call_timeout_s = None
        # rank 1 is killed in the middle of a call
        refs = wg.execute_all_async("sleep", 60)
        time.sleep(0.5)
        ray_session.kill(wg.workers[1])
        t0 = time.monotonic()
        with pytest.raises(WorkerCallError, match="(?s)rank 1.*died") as info:
            wg.sleep(60)
        assert time.monotonic() - t0 < 10 and info.value.rank == 1
        del refs
        wg.kill_workers()
        assert wait_gone(pids[0]) and wait_gone(pids[1])
    finally:
        wg.kill_workers()
        pool.release()


@pytest.mark.slow
def test_failing_constructor_names_rank_and_leaves_no_actor(ray_session):
    pool = RayResourcePool([2], use_gpu=False)
    try:
        with pytest.raises(WorkerCallError, match=r"(?s)BadInitWorker.__init__ on rank 1.*cannot start rank 1"):
            RayWorkerGroup(pool, RayClassWithInitArgs(cls=BadInitWorker), name_prefix="badinit")
        deadline = time.monotonic() + 15
        while (
            any(name.startswith("badinit") for name in ray_session.util.list_named_actors())
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert not any(name.startswith("badinit") for name in ray_session.util.list_named_actors())
        assert pool._groups_placed == 0
    finally:
        pool.release()


# ----------------------------------------------------------------------------- documentation


@pytest.mark.slow
def test_docs_example_runs(ray_session, capsys):
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "single_controller.md").read_text()
    section = doc.split("## Runnable example", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    expected = [
        line.split("# ", 1)[1].strip() for line in code.splitlines() if line.startswith("print(") and "# " in line
    ]
    exec(compile(code, "docs/single_controller.md", "exec"), {"__name__": "__main__"})
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-len(expected) :] == expected
