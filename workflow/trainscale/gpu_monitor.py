"""NVML utilisation and energy of the GPU a training process drives, sampled in a background
thread (metrics `device.utilization_mean` and `device.energy_joules`)."""

from __future__ import annotations

import os
import sys
import threading

from trainscale import nvml_devices


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
        (`trainscale.nvml_devices`, which also says what is read for a MIG device)."""
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
