"""How busy a worker process kept its share of the CPU: `device.utilization_mean` on CPU runs.

A GPU run reports NVML's utilisation (the share of time a kernel ran on the device). A CPU run
has no such counter, so its figure is the share of its compute unit a worker process kept busy:

    utilization = process CPU seconds / (wall seconds × threads) × 100, at most 100

over the same window as NVML's sampling (training start to the end of the last epoch), where
`threads` is the thread budget of the process: threads_per_worker × the workers it holds (one,
except for a one-process strategy that runs several workers, as tf-mirrored and torch-dp do).
Process CPU time counts every thread of the process (user + system), so time spent spinning
in a collective counts as busy, as it does for NVML. A process that ran more threads than its
budget (input pipelines, inter-op pools) can exceed its share; the figure is capped at 100
(the unit was busy all the time), and `oversubscribed` in the record says whether the node's
workers asked for more cores than it has. The run's figure is the mean over its processes.

Framework-neutral: no torch, no TensorFlow; every runner uses this one definition.
"""

from __future__ import annotations

import time


def busy_percent(cpu_seconds: float, wall_seconds: float, threads: int) -> float | None:
    """The busy share (0-100) of `threads` cores over `wall_seconds`; None for an empty window."""
    if wall_seconds <= 0 or threads < 1:
        return None
    return min(100.0, max(0.0, 100.0 * cpu_seconds / (wall_seconds * threads)))


class CpuBusy:
    """Process CPU time and wall time between `start` and `stop`, as `busy_percent`.

    Two clock reads at each end and nothing in between: no thread, no per-step cost.
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._wall0 = self._cpu0 = 0.0

    def start(self) -> CpuBusy:
        self._wall0, self._cpu0 = time.perf_counter(), time.process_time()
        return self

    def stop(self) -> float | None:
        """The busy share since `start`, in percent (see the module docstring)."""
        wall = time.perf_counter() - self._wall0
        return busy_percent(time.process_time() - self._cpu0, wall, self.threads)
