"""Peak memory of training and of evaluation, apart (`memory.peak_*` and `memory.eval_peak_*`
in metrics.json; docs/methods.md defines them), and on a GPU
what the process holds beyond its tensors: the caching allocator's reserved peak and NVML's
per-process figure (`peak_reserved_bytes`, `peak_nvml_process_bytes`)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from trainscale.measure import nvml_devices
from trainscale.measure.metrics import peak_rss_bytes


def rss_high_water_bytes() -> int:
    """This process's peak resident set size since start or the last `reset_rss_high_water`
    (VmHWM in /proc/self/status; ru_maxrss where there is no /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return peak_rss_bytes()


def reset_rss_high_water() -> bool:
    """Set the peak resident set size back to the current one (Linux >= 4.0: "5" written to
    /proc/self/clear_refs); False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PhasePeaks:
    """Peak memory of training and of evaluation, kept apart.

    An evaluation of the whole test set can need more memory than a training step (larger
    batches, another graph), and a peak taken over the whole run would then be evaluation's.
    So the high-water marks (host RSS, and device memory through `device_peak`/`device_reset`)
    are read and reset when an evaluation starts and when it ends: what accrues outside
    evaluations is training's (start-up included), what accrues inside is evaluation's. A
    reset sets a mark to what is held at that moment, so each phase's peak includes what the
    process holds throughout (model, data) and memory one phase keeps past its end counts in
    the next. Where the kernel cannot reset the host mark, training's host peak is the one
    before the first evaluation (exact when only the last epoch evaluates).
    """

    def __init__(self, device_peak=None, device_reset=None, reserved_peak=None,
                 process_bytes=None) -> None:  # fmt: skip
        self._device_peak, self._device_reset = device_peak, device_reset
        #: on a GPU: the caching allocator's reserved peak (reset with the allocated one) and
        #: the device memory NVML counts for this process now, which at a phase's end still
        #: holds the phase's peak (the allocator keeps the blocks it reserved)
        self._readers = (reserved_peak, process_bytes)
        self.train = [0, 0]  # host RSS bytes, device bytes
        self.held = [math.nan, math.nan]  # training's reserved and NVML process bytes
        self.eval: list[int] | None = None
        self._resettable = True
        self._now = [math.nan, math.nan]

    def _take(self) -> list[int]:
        peak = [rss_high_water_bytes(), int(self._device_peak()) if self._device_peak else 0]
        self._now = self._read_held()
        self._resettable = reset_rss_high_water() and self._resettable
        if self._device_reset:
            self._device_reset()
        return peak

    def _read_held(self) -> list[float]:
        read = [r() if r is not None else None for r in self._readers]
        return [math.nan if v is None else float(v) for v in read]

    def _add_held(self, now: list[float]) -> None:
        self.held = [b if math.isnan(a) else a if math.isnan(b) else max(a, b)
                     for a, b in zip(self.held, now, strict=True)]  # fmt: skip

    def _add_training(self, peak: list[int]) -> None:
        if self._resettable or self.eval is None:  # else the host mark holds evaluation's
            self.train[0] = max(self.train[0], peak[0])
        self.train[1] = max(self.train[1], peak[1])
        self._add_held(self._now)

    def training_ends(self) -> None:
        """Read training's reserved and NVML figures now, for a framework that frees the
        allocator's cache before evaluation starts (Lightning's teardown empties it after
        `fit`): read after that, NVML's figure would be the process's leftovers."""
        self._add_held(self._read_held())

    def evaluation_starts(self) -> None:
        self._add_training(self._take())

    def evaluation_ends(self) -> None:
        peak = self._take()
        self.eval = [max(a, b) for a, b in zip(self.eval or [0, 0], peak, strict=True)]

    def finish(self) -> list[float]:
        """[training host, training device, evaluation host, evaluation device] bytes, the
        evaluation ones 0 when nothing was evaluated (a form every collective can max over)."""
        self._add_training(self._take())
        return [float(v) for v in (*self.train, *(self.eval or [0, 0]))]

    def gpu_held(self) -> list[float]:
        """Training's [reserved peak, NVML process bytes] after `finish` (NaN: not read)."""
        return list(self.held)


def memory_block(peaks: list[float], device: bool, held: list[float] | None = None) -> dict:
    """The `memory` entries of `PhasePeaks.finish` values (maxed over ranks): training's peaks
    as `peak_*`, evaluation's as `eval_peak_*` (None where nothing was evaluated or, for the
    device, on CPU), and `held` (PhasePeaks.gpu_held, maxed over ranks) as the reserved and
    NVML per-process peaks (None where not read)."""
    evaluated = peaks[2] > 0
    reserved, process = [None if v is None or math.isnan(v) or not device else int(v)
                         for v in (held or [math.nan, math.nan])]  # fmt: skip
    return {
        "peak_host_rss_bytes": int(peaks[0]),
        "peak_device_bytes": int(peaks[1]) if device else None,
        "eval_peak_host_rss_bytes": int(peaks[2]) if evaluated else None,
        "eval_peak_device_bytes": int(peaks[3]) if evaluated and device else None,
        "peak_reserved_bytes": reserved,
        "peak_nvml_process_bytes": process,
    }


def ranks_memory(rows: list[list[float]], device: bool) -> dict:
    """The `memory` entries of every rank's row of `PhasePeaks.finish` followed by its
    `gpu_held` (NaN where not read), as the ranks gathered them: the peaks maxed over ranks,
    and each rank's host and device peak."""
    peaks = [max(column) for column in zip(*(r[:4] for r in rows), strict=True)]
    held = [max((v for v in column if not math.isnan(v)), default=math.nan)
            for column in zip(*(r[4:6] for r in rows), strict=True)]  # fmt: skip
    return {
        **memory_block(peaks, device, held),
        "per_rank_host_rss_bytes": [int(r[0]) for r in rows],
        "per_rank_device_bytes": [int(r[1]) for r in rows] if device else None,
    }


def nvml_process_reader(cuda_ordinal: int, cuda_uuid: object = None):
    """A reader of the device memory NVML counts for this process on CUDA device
    `cuda_ordinal` (its context, allocator blocks and NCCL buffers), or None where NVML or the
    device cannot be found; the reader gives None where NVML lists no such process (a
    container's process ids are not the host's)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = nvml_devices.uuid_string(cuda_uuid) if cuda_uuid else None
        uuid = uuid or nvml_devices.cuda_driver_uuid(cuda_ordinal)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        handle = nvml_devices.find(pynvml, cuda_ordinal, uuid, visible).handle
    except Exception as e:  # no NVML, no such device: the figure stays null
        print(f"trainscale: no NVML process memory for cuda:{cuda_ordinal}: {e}", file=sys.stderr)
        return None
    pid = os.getpid()

    def read() -> int | None:
        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except pynvml.NVMLError:
            return None
        used = [p.usedGpuMemory for p in procs if p.pid == pid and p.usedGpuMemory is not None]
        return int(used[0]) if used else None

    return read
