"""Where a run's time goes outside its epochs: the moments a record's `timeline` block keeps.

A run's `wall_seconds` starts when its runner has imported its framework; before that come
Snakemake's job start, the supervisor (`python -m trainscale.launch`), the framework's
launcher and the worker's imports, and after the record is written come the workers' exit
and the supervisor's stamp. The record keeps, as Unix times (seconds) so that moments of
different processes on one host line up:

- worker side (rank 0, `Timeline`): `worker_start_unix` (its process start, from /proc),
  `recorder_unix` (the Recorder's start: imports done), `record_unix` (the record assembled);
  `set_up` (seconds of each set-up phase, in order: rendezvous, data, model, ...; their sum
  is setup_seconds) and `parts` (seconds of each measurement after the timed steps, by its
  trainscale.runners.guarded part: evaluation, memory, communication, flops, framework);
- supervisor side (`stamp`): `supervisor_start_unix`, `launched_unix` (the launcher
  started), `written_unix` (the workers' record on disk), `exited_unix` (the launcher ended).

The record's file itself is written last, by the supervisor; Snakemake's metadata keeps its
job's start. benchmarks/harness_overhead.py --breakdown turns these into phases.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def process_start_unix(pid: int | str = "self") -> float | None:
    """When process `pid` started, in Unix seconds (to the kernel's clock tick, 10 ms), from
    its start in ticks after boot; None where /proc does not tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.time() - since_boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Timeline:
    """The worker's side of a run's timeline (rank 0's Recorder holds one)."""

    def __init__(self) -> None:
        self.worker_start = process_start_unix()
        self.start, self.start_unix = time.perf_counter(), time.time()
        self._last = self.start
        self.set_up: dict[str, float] = {}
        self.parts: dict[str, float] = {}

    def ends(self, phase: str) -> None:
        """Set-up phase `phase` ends now (it began where the last one ended)."""
        now = time.perf_counter()
        self.set_up[phase] = self.set_up.get(phase, 0.0) + now - self._last
        self._last = now

    def part(self, name: str, seconds: float) -> None:
        """A measurement after the timed steps took `seconds` (summed over its calls)."""
        self.parts[name] = self.parts.get(name, 0.0) + seconds

    def block(self) -> dict:
        return {
            "worker_start_unix": self.worker_start,
            "recorder_unix": self.start_unix,
            "record_unix": time.time(),
            "set_up": dict(self.set_up),
            "parts": dict(self.parts),
        }
