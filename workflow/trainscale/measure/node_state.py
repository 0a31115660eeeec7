"""Each GPU's state at a run's start and end, from NVML (`env.gpus`): when a 2-node result is
slow, this says whether a node was bad (a lowered power limit, clocks held down by heat or
power, ECC errors, retired memory) rather than the strategy.

`read()` returns one `GpuState` per GPU NVML lists on this node (every GPU, in NVML's PCI
order: a node's state, whatever CUDA_VISIBLE_DEVICES hides), and none where there is no NVML
(a CPU node: `env.gpus` is then empty). A figure a GPU does not report (ECC on a consumer card,
retired pages on one that remaps rows instead) is None.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

#: NVML's clock event ("throttle") reasons, bit -> name (nvmlClocksEventReason*)
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def throttle_names(mask: int) -> list[str]:
    """The reasons set in NVML's bit mask, by name, in bit order."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


@dataclass(frozen=True)
class GpuState:
    """One GPU as NVML reports it at one moment."""

    index: int  # NVML's index (PCI bus order)
    uuid: str
    name: str
    power_limit_w: float | None  # the enforced power limit
    sm_clock_mhz: int | None  # the SM clock now
    throttle_reasons: list[str]  # why its clocks are held below their maximum now
    ecc_errors: dict | None  # {"corrected", "uncorrected"}: volatile counts (since boot)
    retired_pages: int | None  # pages retired for ECC errors (GPUs before Ampere)
    remapped_rows: int | None  # rows remapped for ECC errors (Ampere and later)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _or_none(read, *args) -> Any:
    """NVML's answer, or None where the GPU does not report it (NVMLError)."""
    try:
        return read(*args)
    except Exception:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def one(nvml: Any, index: int) -> GpuState:
    """GPU `index`'s state through the pynvml module `nvml`."""
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    limit = _or_none(nvml.nvmlDeviceGetEnforcedPowerLimit, h)  # milliwatts
    mask = _or_none(nvml.nvmlDeviceGetCurrentClocksEventReasons, h)
    errors = [
        _or_none(nvml.nvmlDeviceGetTotalEccErrors, h, kind, nvml.NVML_VOLATILE_ECC)
        for kind in (nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
    ]
    causes = (
        nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    )
    pages = [_or_none(nvml.nvmlDeviceGetRetiredPages, h, cause) for cause in causes]
    rows = _or_none(nvml.nvmlDeviceGetRemappedRows, h)  # (corrected, uncorrected, pending, failed)
    return GpuState(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(h)),
        name=_text(nvml.nvmlDeviceGetName(h)),
        power_limit_w=limit / 1000 if limit is not None else None,
        sm_clock_mhz=_or_none(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
        throttle_reasons=throttle_names(mask) if mask is not None else [],
        ecc_errors=None if None in errors else {"corrected": errors[0], "uncorrected": errors[1]},
        retired_pages=None if None in pages else sum(len(p) for p in pages),
        remapped_rows=None if rows is None else int(rows[0]) + int(rows[1]),
    )


def read() -> list[GpuState]:
    """Every GPU of this node now; [] without NVML (no driver, no GPU)."""
    try:
        import pynvml as nvml

        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
    except Exception:
        return []
    return [one(nvml, i) for i in range(count)]


#: the figures that change while a run trains, kept from its start beside the end's
CHANGING = ("sm_clock_mhz", "throttle_reasons", "ecc_errors", "retired_pages", "remapped_rows")


def block(start: list[GpuState], end: list[GpuState], host: str) -> list[dict]:
    """`env.gpus` entries of one node: each GPU's state at the end, its host, and `start`,
    the changing figures as they were when the run started (None where not read then)."""
    before = {g.uuid: g for g in start}
    out = []
    for gpu in end:
        first = before.get(gpu.uuid)
        was = {k: getattr(first, k) for k in CHANGING} if first else None
        out.append({**gpu.to_dict(), "host": host, "start": was})
    return out
