"""Each training step's time, without making the host wait for the device at every step.

A wall clock around a step measures a GPU's work only if the host waits for it first
(`torch.cuda.synchronize`), and that wait is itself a cost: the host cannot queue the next
step's kernels while the GPU finishes this one, so the GPU idles for the launch latency every
step (on an H200, GPT-2 124M ran at 0.966 of a bare loop with the wait, 1.001 without).

So on a GPU each step is bracketed by two CUDA events recorded on the stream, and the host
waits once, at the epoch's end (the loop's barrier), before the times are read. An event's
time is when the stream reached it, so a step's time is the device's time from the start of
its work to the end of it: the sum over an epoch's steps is the epoch's time less what falls
between steps (the next batch's host-to-device copy), as with the wall clock before.

On CPU the work is done when the step's call returns, so the host's clock is exact there.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Protocol

import torch


class Event(Protocol):
    """What the timer needs of torch.cuda.Event(enable_timing=True)."""

    def record(self) -> None: ...

    def elapsed_time(self, end: Event) -> float: ...  # milliseconds


class StepTimer:
    """`step_starts()` and `step_ends()` around each step; `seconds()` once the device has
    finished the epoch's work (after its synchronisation), which starts the next epoch's list.

    `event`: a factory of timing events (CUDA's for a cuda device); `clock`: the host's clock,
    used where there are no events."""

    def __init__(
        self,
        device: torch.device,
        event: Callable[[], Event] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if event is None and device.type == "cuda":
            event = functools.partial(torch.cuda.Event, enable_timing=True)
        self.event, self.clock = event, clock
        self.marks: list = []  # start, end, start, end, ...: events or clock readings

    def _mark(self):
        if self.event is None:
            return self.clock()
        e = self.event()
        e.record()
        return e

    def step_starts(self) -> None:
        self.marks.append(self._mark())

    def step_ends(self) -> None:
        self.marks.append(self._mark())

    def seconds(self) -> list[float]:
        """The steps' times in seconds, in order; on a GPU, read only after the epoch's
        synchronisation (an event not yet reached has no time)."""
        if len(self.marks) % 2:
            raise RuntimeError("StepTimer: a step started and did not end")
        steps = list(zip(self.marks[0::2], self.marks[1::2], strict=True))
        self.marks = []
        if self.event is None:
            return [end - start for start, end in steps]
        return [start.elapsed_time(end) / 1000.0 for start, end in steps]
