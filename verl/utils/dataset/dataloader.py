"""A data loader whose position can be saved and restored exactly (mid-epoch and across epochs).

`StatefulDataLoader` wraps `torch.utils.data.DataLoader` (same constructor arguments as the ones verl
uses: dataset, batch_size, shuffle, sampler, num_workers, collate_fn, drop_last, ...) and adds
`state_dict()` / `load_state_dict()` in the spirit of torchdata's class of the same name (torchdata is
not a dependency). A restored loader continues with the next batch of the interrupted epoch and then
produces exactly the epochs an uninterrupted run would have produced.

How: at the start of every epoch the loader materialises the epoch's index order from the sampler (a
list of ints, cheap) and counts the batches it has yielded. The state holds that order, the count, the
epoch number and the sampler's own state:

* `SeededRandomSampler` (what `create_sampler` returns): the order is a pure function of
  (seed, epoch), so nothing else is needed; `set_epoch` is honoured like DistributedSampler's.
* `torch.utils.data.RandomSampler` with a `generator`: the generator's state after drawing the epoch
  is saved, so the following epochs draw the same permutations.
* any sampler with `state_dict()` / `load_state_dict()`: those are saved and restored.
* `SequentialSampler` and other deterministic samplers: the order and count are enough.
A `RandomSampler` without a generator draws from the global torch RNG and cannot be resumed exactly;
`state_dict()` raises for it, naming the fix (pass a seeded generator or use `create_sampler`).

State saved right after the last batch of an epoch (before the loop asks for more) resumes as "that
epoch is finished": the next iteration yields nothing and the one after starts the next epoch, which
is what a trainer loop of the form ``for epoch ...: for batch in loader`` expects.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler, Sampler, SequentialSampler

__all__ = ["SeededRandomSampler", "StatefulDataLoader", "create_sampler"]

STATE_VERSION = 1


class SeededRandomSampler(Sampler[int]):
    """A permutation of ``range(n)`` that depends only on (seed, epoch).

    Call ``set_epoch(e)`` before iterating epoch ``e`` (the loader does it automatically after each
    complete pass, so plain ``for batch in loader`` loops also get a new order every epoch).
    """

    def __init__(self, data_source_or_len, seed: int = 1):
        self.num_samples = data_source_or_len if isinstance(data_source_or_len, int) else len(data_source_or_len)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _generator(self) -> torch.Generator:
        g = torch.Generator()
        # Mix seed and epoch so that (seed, epoch) pairs do not collide as seed + epoch would.
        g.manual_seed((self.seed * 1_000_003 + self.epoch * 7_919 + 12_345) % (2**63 - 1))
        return g

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.num_samples, generator=self._generator()).tolist())

    def __len__(self) -> int:
        return self.num_samples

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])


def create_sampler(dataset, shuffle: bool = True, seed: int = 1) -> Sampler[int]:
    """`SeededRandomSampler(dataset, seed)` when ``shuffle``, else `SequentialSampler(dataset)`."""
    return SeededRandomSampler(dataset, seed=seed) if shuffle else SequentialSampler(dataset)


class _FixedOrderSampler(Sampler[int]):
    def __init__(self, indices: list[int]):
        self.indices = indices

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class StatefulDataLoader:
    """A resumable loader over a map-style dataset (see the module docstring).

    Args:
        dataset: map-style dataset.
        batch_size: items per batch.
        shuffle: without ``sampler``: shuffle with a `SeededRandomSampler` (seed ``seed``, default 0).
        sampler: an index sampler (mutually exclusive with ``shuffle=True``).
        num_workers, collate_fn, drop_last, **kwargs: passed to `torch.utils.data.DataLoader`.
        seed: seed of the internal shuffling sampler.
    """

    def __init__(
        self,
        dataset,
        batch_size: int = 1,
        shuffle: bool | None = None,
        sampler: Sampler | None = None,
        num_workers: int = 0,
        collate_fn=None,
        drop_last: bool = False,
        seed: int | None = None,
        **kwargs,
    ):
        if batch_size is None or int(batch_size) < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if sampler is not None and shuffle:
            raise ValueError("StatefulDataLoader: give either sampler or shuffle=True, not both")
        if "batch_sampler" in kwargs:
            raise ValueError("StatefulDataLoader does not take a batch_sampler; pass sampler and batch_size")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self._loader_kwargs = kwargs
        if sampler is None:
            sampler = (
                SeededRandomSampler(dataset, seed=0 if seed is None else seed)
                if shuffle
                else SequentialSampler(dataset)
            )
        self.sampler = sampler
        self._epoch = 0  # epoch number of the pass in progress (or the next one)
        self._order: list[int] | None = None  # index order of the pass in progress
        self._yielded = 0  # batches of that pass already handed out
        self._resume = False  # next __iter__ continues the restored pass

    # ------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _sampler_epoch(self) -> int | None:
        return getattr(self.sampler, "epoch", None) if hasattr(self.sampler, "set_epoch") else None

    def __iter__(self) -> Iterator[Any]:
        if self._resume:
            self._resume = False
            epoch = self._sampler_epoch()
            if epoch is not None and epoch != self._epoch:
                raise RuntimeError(
                    f"StatefulDataLoader was restored inside epoch {self._epoch} but its sampler was then set to "
                    f"epoch {epoch}; restore the trainer's epoch counter from the same checkpoint"
                )
        else:
            epoch = self._sampler_epoch()
            if epoch is not None:
                self._epoch = epoch
            self._order = list(iter(self.sampler))
            self._yielded = 0
        remaining = self._order[self._yielded * self.batch_size :]
        loader = DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=_FixedOrderSampler(remaining),
            num_workers=self.num_workers,
            collate_fn=self.collate_fn,
            drop_last=self.drop_last,
            **self._loader_kwargs,
        )
        for batch in loader:
            self._yielded += 1
            yield batch
        # The pass is complete: move to the next epoch (samplers with set_epoch get the new number).
        self._epoch += 1
        self._order = None
        self._yielded = 0
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self._epoch)

    # ------------------------------------------------------------------------------------------------
    def _sampler_state(self) -> dict | None:
        if hasattr(self.sampler, "state_dict") and hasattr(self.sampler, "load_state_dict"):
            return {"kind": "state_dict", "state": self.sampler.state_dict()}
        if isinstance(self.sampler, RandomSampler):
            if self.sampler.generator is None:
                raise ValueError(
                    "StatefulDataLoader cannot save the position of a RandomSampler without a generator (it draws "
                    "from the global torch RNG); pass RandomSampler(..., generator=torch.Generator().manual_seed(s)) "
                    "or use verl.utils.dataset.create_sampler(dataset, shuffle=True, seed=s)"
                )
            return {"kind": "generator", "state": self.sampler.generator.get_state()}
        return None

    def state_dict(self) -> dict:
        """Position of the loader: {"epoch", "batches_yielded", "order", "sampler", ...} (picklable)."""
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "batches_yielded": self._yielded,
            "order": list(self._order) if self._order is not None else None,
            "batch_size": self.batch_size,
            "num_samples": len(self.sampler),
            "drop_last": self.drop_last,
            "seed": getattr(self.sampler, "seed", None),
            "sampler": self._sampler_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a position saved by `state_dict()`; the next iteration continues from it."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"unsupported StatefulDataLoader state version {state.get('version')!r} (expected {STATE_VERSION})"
            )
        for key, mine in (
            ("batch_size", self.batch_size),
            ("num_samples", len(self.sampler)),
            ("drop_last", self.drop_last),
        ):
            if state[key] != mine:
                raise ValueError(
                    f"cannot resume the data loader: saved {key}={state[key]} but this loader has {key}={mine}; "
                    "the position in the epoch would point at different samples"
                )
        sampler_state = state.get("sampler")
        if sampler_state is not None:
            if sampler_state["kind"] == "state_dict":
                self.sampler.load_state_dict(sampler_state["state"])
            elif sampler_state["kind"] == "generator":
                if not isinstance(self.sampler, RandomSampler) or self.sampler.generator is None:
                    raise ValueError(
                        "saved state is for a RandomSampler with a generator, but this loader's sampler is not"
                    )
                self.sampler.generator.set_state(sampler_state["state"])
            else:
                raise ValueError(f"unknown sampler state kind {sampler_state['kind']!r}")
        self._epoch = int(state["epoch"])
        self._yielded = int(state["batches_yielded"])
        self._order = list(state["order"]) if state["order"] is not None else None
        # A pass that had started continues from its saved order; otherwise the next pass starts fresh.
        self._resume = self._order is not None
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self._epoch)
