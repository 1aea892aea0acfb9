"""The gloo broadcast checkpoint engine: one sender and two receivers in threads of this process
(a gloo group over a TCP store works across threads as across processes)."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from verl.checkpoint_engine import CheckpointEngineRegistry, WeightSyncError, iter_chunks, resolve_backend
from verl.checkpoint_engine.base import _logged_mappings


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(10, 7, generator=g),  # 280 bytes: split over buckets of 64
        "ids": torch.arange(5, dtype=torch.int64),
        "norm.weight": torch.randn(3, generator=g).to(torch.bfloat16),
        "empty": torch.zeros(0),
    }


class Group:
    """A built engine group: rank 0 sends, ranks 1.. receive."""

    def __init__(self, world: int = 3, bucket_bytes: int = 64, timeout_s: float = 20):
        self.engines = [CheckpointEngineRegistry.new("gloo", bucket_bytes, timeout_s=timeout_s) for _ in range(world)]
        connection = self.engines[0].prepare()
        self._all(lambda r: self.engines[r].init_process_group(r, world, **connection), range(world))

    @staticmethod
    def _all(fn, ranks):
        errors = []

        def run(r):
            try:
                fn(r)
            except Exception as exc:  # noqa: BLE001 - re-raised in the test thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        if errors:
            raise errors[0]

    def sync(self, send_version: int, expect_version: int, sent=None):
        got: dict[int, dict] = {}
        stats = {}

        def side(r):
            if r == 0:
                stats.update(self.engines[0].send_weights((sent or weights()).items(), send_version))
            else:
                got[r] = dict(self.engines[r].receive_weights(expect_version))

        self._all(side, range(len(self.engines)))
        return stats, got

    def close(self):
        for e in self.engines:
            e.finalize()


def test_buckets_hold_at_most_their_size_and_split_large_tensors():
    buckets = list(iter_chunks(weights().items(), 64))
    assert all(sum(m.chunk_size for m, _ in b) <= 64 for b in buckets)
    # 280 + 40 + 6 + 0 bytes in buckets of 64: 6 buckets; the embedding spans the first five
    assert len(buckets) == 6
    embed = [m for b in buckets for m, _ in b if m.name == "embed.weight"]
    assert [m.chunk_offset for m in embed] == [0, 64, 128, 192, 256]
    assert sum(m.chunk_size for m in embed) == 280


def test_every_receiver_gets_every_tensor_bit_for_bit_with_the_version():
    group = Group()
    try:
        stats, got = group.sync(3, 3)
        assert stats["buckets"] == 6 and stats["tensors"] == 4
        for r in (1, 2):
            assert sorted(got[r]) == sorted(weights())
            for name, t in weights().items():
                assert got[r][name].dtype == t.dtype and torch.equal(got[r][name], t), name
        # the group is built once: a second sync reuses it
        _, got = group.sync(4, 4)
        assert torch.equal(got[1]["ids"], weights()["ids"])
    finally:
        group.close()


def test_a_bucket_of_another_version_is_refused():
    group = Group(world=2, timeout_s=2)  # the sender then waits for a receiver that left
    try:
        with pytest.raises(WeightSyncError, match="a bucket of weight version 5 arrived while version 6 was due"):
            group.sync(5, 6)
    finally:
        group.close()


def test_backend_names_resolve_as_documented(caplog):
    _logged_mappings.clear()
    with caplog.at_level(logging.WARNING):
        assert resolve_backend("nccl", "cpu") == "gloo"
        assert resolve_backend("nccl", "cpu") == "gloo"
        assert resolve_backend("nixl", "cuda") == "nccl"
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl runs here as the gloo broadcast engine (device cpu)",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nixl runs here as the nccl broadcast engine (device cuda)",
    ]
    assert resolve_backend("nccl", "cuda") == "nccl" and resolve_backend("gloo", "cpu") == "gloo"
    with pytest.raises(ValueError, match="backend=naive copies weights inside one process"):
        resolve_backend("naive", "cpu")
    with pytest.raises(ValueError, match="'carrier_pigeon' is not a checkpoint engine"):
        resolve_backend("carrier_pigeon", "cpu")


def test_a_partial_update_is_refused():
    from verl.checkpoint_engine.broadcast import GlooCheckpointEngine

    class Lossy(GlooCheckpointEngine):
        """Announces one more tensor than it sends (a sender that lost one)."""

        def _send_bucket(self, metas, version, is_last, sent):
            super()._send_bucket(metas, version, is_last, sent + int(is_last))

    group = Group(world=2)
    lossy = Lossy(64, timeout_s=20)
    lossy.__dict__.update({k: v for k, v in group.engines[0].__dict__.items()})
    group.engines[0] = lossy
    try:
        with pytest.raises(WeightSyncError, match=r"weight version 2: 4 whole tensors arrived of 5 sent"):
            group.sync(2, 2)
    finally:
        group.close()
