"""How busy a run kept its compute unit, and the energy it used (`device.utilization_mean`,
`device.energy_joules` in metrics.json), on GPU and on CPU alike. Imports no framework.

- utilization_mean (percent, 0-100): on a GPU, the mean of NVML's utilisation samples over
  training (`metrics.GpuMonitor`). On CPU, each worker process's *CPU busy share* over its
  timed epochs: the process's CPU time (user + system, every thread, `time.process_time`)
  divided by wall time × the threads it was given (`threads_per_worker`), i.e. how much of its
  compute unit the process kept busy; capped at 100 (helper threads, such as gloo's, can add
  CPU time past the thread budget). The run's figure is the mean over ranks.
- energy_joules: on a GPU, NVML's energy counter over training, summed over the GPUs the ranks
  ran on, each GPU once (ranks sharing a GPU read the same counter: `energy_once_per_device`).
  On CPU, the
  RAPL package counters (`/sys/class/powercap/intel-rapl:N/energy_uj`) over the timed epochs,
  read by the first process of each host (one package counter serves every process on it, and
  counts all of that host's work), summed over hosts; null where no counter is readable. Never
  estimated.
"""

from __future__ import annotations

import glob
import os
import sys
import threading
import time
from pathlib import Path

from trainscale.measure import nvml_devices

RAPL_GLOB = "/sys/class/powercap/intel-rapl:[0-9]*"


def energy_once_per_device(energies: list[float | None], devices: list) -> float | None:
    """The run's energy: rank i's reading `energies[i]` of its device `devices[i]` (a
    hashable name of the counter it read, e.g. (host, GPU UUID), or (host, None) for a host's
    RAPL packages), summed over devices with each device's counter counted once. Ranks that
    share a GPU (two ranks on one GPU, as `make gpu-check` runs them) read one counter; summing
    per rank would count that GPU's energy once per rank. None where no rank read one."""
    first: dict = {}
    for energy, device in zip(energies, devices, strict=True):
        if energy is not None and device not in first:
            first[device] = energy
    return sum(first.values()) if first else None


def cpu_busy_percent(cpu_seconds: float, wall_seconds: float, threads: int) -> float | None:
    """The CPU busy share of a process's compute unit: CPU seconds / (wall seconds × threads),
    as a percentage capped at 100; None without wall time."""
    if wall_seconds <= 0 or threads < 1:
        return None
    return min(100.0, 100.0 * cpu_seconds / (wall_seconds * threads))


class RaplPackages:
    """The RAPL package energy counters of this host (microjoules), where they are readable."""

    def __init__(self, pattern: str = RAPL_GLOB) -> None:
        self.zones: list[tuple[Path, int]] = []
        for zone in sorted(glob.glob(pattern)):
            path = Path(zone)
            if path.name.count(":") != 1:  # a sub-zone (core, uncore): in its package's count
                continue
            try:
                int((path / "energy_uj").read_text())
                wrap = int((path / "max_energy_range_uj").read_text())
            except (OSError, ValueError):
                continue
            self.zones.append((path / "energy_uj", wrap))

    def read(self) -> list[int] | None:
        """Every package's counter now; None where there is none."""
        if not self.zones:
            return None
        return [int(p.read_text()) for p, _ in self.zones]

    def joules(self, before: list[int], after: list[int]) -> float:
        """Energy between two readings, each counter's wrap-around taken into account."""
        total = 0
        for (_, wrap), a, b in zip(self.zones, before, after, strict=True):
            total += b - a if b >= a else b + wrap - a
        return total / 1e6


class CpuUsage:
    """CPU busy share and RAPL energy over the spans between `span_starts` and `span_ends`
    (the loop calls them around each timed epoch; a span costs two clock reads)."""

    def __init__(self, threads: int, reads_energy: bool) -> None:
        self.threads = threads
        self.cpu = self.wall = 0.0
        self.rapl = RaplPackages() if reads_energy else None
        self.energy: float | None = None
        self._t0 = self._c0 = 0.0
        self._e0: list[int] | None = None

    def span_starts(self) -> None:
        self._e0 = self.rapl.read() if self.rapl else None
        self._c0, self._t0 = time.process_time(), time.perf_counter()

    def span_ends(self) -> None:
        self.wall += time.perf_counter() - self._t0
        self.cpu += time.process_time() - self._c0
        e1 = self.rapl.read() if self.rapl and self._e0 is not None else None
        if e1 is not None:
            self.energy = (self.energy or 0.0) + self.rapl.joules(self._e0, e1)

    def result(self) -> tuple[float | None, float | None]:
        """(CPU busy percent, energy joules or None) over every span so far."""
        return cpu_busy_percent(self.cpu, self.wall, self.threads), self.energy


class GpuMonitor:
    """Samples NVML utilisation and energy in a background thread while training runs.

    `read` returns (utilization percent or None, energy millijoules or None) for the device
    watched (NVML has no utilisation for a MIG-enabled GPU, and energy only since Volta);
    on a machine without NVML `start()` finds nothing to watch and every result stays None.
    """

    def __init__(self, interval: float = 0.5, read=None) -> None:
        self.interval = interval
        self._read = read
        self._samples: list[float] = []
        self._energy0: float | None = None
        self._energy1: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def nvml_reader(cuda_ordinal: int, cuda_uuid: object = None):
        """A reader for the GPU that CUDA device `cuda_ordinal` of this process is, or None
        where NVML is absent or no single NVML device matches (said on stderr).

        `cuda_uuid` is the device's UUID as the framework reports it (torch's
        `get_device_properties(i).uuid`, or its string); without it the CUDA driver is asked.
        NVML numbers GPUs its own way, so the device is found by UUID
        (`trainscale.measure.nvml_devices`, which also says what is read for a MIG device)."""
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:
            return None
        uuid = nvml_devices.uuid_string(cuda_uuid) if cuda_uuid else None
        try:
            uuid = uuid or nvml_devices.cuda_driver_uuid(cuda_ordinal)
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            device = nvml_devices.find(pynvml, cuda_ordinal, uuid, visible)
        except (nvml_devices.NvmlMappingError, pynvml.NVMLError) as e:
            print(f"trainscale: no NVML readings for cuda:{cuda_ordinal}: {e}", file=sys.stderr)
            return None
        if device.mig:
            print(f"trainscale: cuda:{cuda_ordinal} is a {device.what}", file=sys.stderr)
        handle = device.handle

        def read() -> tuple[float | None, float | None]:
            try:  # NOT_SUPPORTED on a MIG-enabled GPU
                util = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except pynvml.NVMLError:
                util = None
            try:
                energy = float(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))
            except pynvml.NVMLError:
                energy = None
            return util, energy

        return read

    def start(self) -> GpuMonitor:
        if self._read is None:
            return self
        _, self._energy0 = self._read()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            util, _ = self._read()
            if util is not None:
                self._samples.append(util)

    def stop(self) -> tuple[float | None, float | None]:
        """(mean utilisation %, energy joules) since start; (None, None) without NVML."""
        if self._read is None:
            return None, None
        self._stop.set()
        if self._thread:
            self._thread.join()
        util, self._energy1 = self._read()
        samples = self._samples or ([util] if util is not None else [])
        energy = None
        if self._energy0 is not None and self._energy1 is not None:
            energy = (self._energy1 - self._energy0) / 1000.0
        return (sum(samples) / len(samples) if samples else None), energy
