"""Time a training loop spends waiting for its next batch: the input pipeline's share of a run.

On real images the input pipeline often limits scaling (Horovod users report 88% efficiency on
synthetic data against 58% on real data, horovod#2103). A step loop that wraps its batch
iterator in `DataWait` measures exactly the time `next(batches)` blocked it: the decode and
transfer the loader did not hide behind the previous step. Framework-free (plain Python), so the
PyTorch and the Keras loops measure it alike.

Definitions (recorded by trainscale.measure.metrics; docs/data.md):
- per epoch `data_wait_seconds`: rank 0's summed wait in that epoch's step loop;
- per epoch `data_wait_seconds_max`: the largest of every rank's wait (one slow loader holds
  every rank back at the next all-reduce, so the slowest rank is the one that tells);
- top level `data_wait_share`: the steady epochs' (2..) `data_wait_seconds_max` (or
  `data_wait_seconds` where only rank 0 is known) summed, over the same epochs' seconds summed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

#: A cell whose data-wait share is above this is input-bound (the report flags it).
INPUT_BOUND_SHARE = 0.10


class DataWait(Generic[T]):
    """Wraps a batch iterable; `seconds` is the time spent inside `next()` of the latest pass
    (reset at each `iter()`), `batches` how many it handed out.

        batches = DataWait(loader)
        for x, y in batches:   # one epoch
            ...
        epoch_wait = batches.seconds
    """

    def __init__(self, batches: Iterable[T]) -> None:
        self._batches = batches
        self.seconds = 0.0
        self.batches = 0

    def __iter__(self) -> Iterator[T]:
        self.seconds, self.batches = 0.0, 0
        clock = time.perf_counter
        start = clock()
        it = iter(self._batches)  # worker start-up / sampler set-up counts as waiting too
        self.seconds += clock() - start
        while True:
            start = clock()
            try:
                batch = next(it)
            except StopIteration:
                self.seconds += clock() - start
                return
            self.seconds += clock() - start
            self.batches += 1
            yield batch


def epoch_fields(rank0_seconds: float, all_ranks_seconds: list[float] | None = None) -> dict:
    """The per-epoch fields a loop adds to its epoch entry (Recorder.epoch's dict):
    `data_wait_seconds` (rank 0) and `data_wait_seconds_max` (max over `all_ranks_seconds`,
    gathered by the loop; rank 0's alone when None)."""
    ranks = all_ranks_seconds or [rank0_seconds]
    return {"data_wait_seconds": rank0_seconds, "data_wait_seconds_max": max(ranks)}


def share(epochs: list[dict]) -> float | None:
    """`data_wait_share` of a run's epoch list; None when the epochs carry no data wait or
    there is no steady epoch."""
    steady = epochs[1:]
    if not steady or any("data_wait_seconds" not in e for e in steady):
        return None
    seconds = sum(e["seconds"] for e in steady)
    wait = sum(e.get("data_wait_seconds_max", e["data_wait_seconds"]) for e in steady)
    return wait / seconds if seconds > 0 else None


def derived(epochs: list[dict]) -> dict:
    """Top-level metrics fields from the epochs: {'data_wait_share': ...} when they carry a
    data wait, else nothing (records of loops that do not measure it stay as they were)."""
    value = share(epochs)
    return {} if value is None else {"data_wait_share": value}
