"""Which NVML device a CUDA device of this process is, so utilisation and energy are read from
the GPU that trains.

CUDA numbers the devices a process sees 0..n-1 after `CUDA_VISIBLE_DEVICES` has picked and
ordered them (and, unless `CUDA_DEVICE_ORDER=PCI_BUS_ID`, puts the fastest first); NVML numbers
every GPU of the node in PCI bus order and ignores `CUDA_VISIBLE_DEVICES`. A SLURM task given
`CUDA_VISIBLE_DEVICES=2,3` trains on cuda:0, which is NVML device 2, not 0. The one name both
agree on is the device's UUID, so `find` maps through it:

1. the CUDA device's UUID (torch: `torch.cuda.get_device_properties(i).uuid`; otherwise the
   CUDA driver's `cuDeviceGetUuid`), as NVML spells it (`GPU-xxxxxxxx-xxxx-…`, or `MIG-…`),
   opened with `nvmlDeviceGetHandleByUUID`;
2. without one (no driver library to ask), entry i of `CUDA_VISIBLE_DEVICES`, read as CUDA
   reads it: indices (taken as NVML indices, which is exact when `CUDA_DEVICE_ORDER=PCI_BUS_ID`
   or every GPU of the node is the same model), `GPU-` UUIDs or unique prefixes of them, and MIG
   identifiers (`MIG-<uuid>`, or the older `MIG-GPU-<uuid>/<gpu instance>/<compute instance>`);
3. without either, NVML index i (the same caveat as indices).

MIG: NVML reports neither utilisation nor energy for a MIG instance (NOT_SUPPORTED), so for a
MIG device the handle read is its parent GPU's: energy is the whole GPU's, the work of every
other instance on it included, and utilisation is null, because NVML does not report it on a
MIG-enabled GPU either. `NvmlDevice.what` says so, and the runner prints it in the run's log.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from typing import Any

_MIG_LEGACY = re.compile(r"MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)$")


class NvmlMappingError(LookupError):
    """No NVML device, or more than one, matches a CUDA device."""


@dataclass(frozen=True)
class NvmlDevice:
    """The NVML device read for one CUDA device."""

    handle: Any  # the device whose counters are read: the GPU, or a MIG device's parent GPU
    uuid: str  # NVML UUID of the CUDA device itself (GPU-… or MIG-…)
    read_uuid: str  # NVML UUID of the device whose counters are read

    @property
    def mig(self) -> bool:
        return self.uuid != self.read_uuid

    @property
    def what(self) -> str:
        if not self.mig:
            return f"NVML {self.uuid}"
        return (
            f"MIG device {self.uuid}: NVML reads its parent GPU {self.read_uuid} (energy of the "
            "whole GPU, every MIG instance on it included; no utilisation, which NVML does not "
            "report on a MIG-enabled GPU)"
        )


def uuid_string(raw: Any) -> str:
    """A CUDA device UUID as hex 8-4-4-4-12 (lower case, NVML's spelling without its prefix):
    from 16 bytes, an object with `.bytes` (torch's `_CUuuid`) or a string as `str()` gives it."""
    data = getattr(raw, "bytes", raw)
    if isinstance(data, bytes | bytearray) and len(data) == 16:
        h = bytes(data).hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return str(raw).strip().lower()


def visible_devices(value: str | None) -> list[str] | None:
    """`CUDA_VISIBLE_DEVICES` as CUDA reads it; None when unset (every GPU visible).

    Entries are indices, `GPU-` UUIDs (or prefixes) and `MIG-` identifiers; CUDA stops at the
    first entry that is none of these (so `0,1,x,2` means 0,1; an index reads like strtoul,
    `1gpu` is 1), and a repeated entry makes no device visible."""
    if value is None:
        return None
    out: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.startswith(("GPU-", "MIG-")):
            token = entry
        else:
            digits = re.match(r"\+?(\d+)", entry)
            if not digits:
                break
            token = str(int(digits.group(1)))
        if token in out:
            return []
        out.append(token)
    return out


def _uuid_of(nvml: Any, handle: Any) -> str:
    u = nvml.nvmlDeviceGetUUID(handle)
    return u.decode() if isinstance(u, bytes) else str(u)


def _mig_devices(nvml: Any, gpu: Any) -> list[Any]:
    """The MIG devices of one GPU (none where MIG is off or unsupported)."""
    try:
        count = nvml.nvmlDeviceGetMaxMigDeviceCount(gpu)
    except nvml.NVMLError:
        return []
    found = []
    for i in range(count):
        try:
            found.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i))
        except nvml.NVMLError:  # NOT_FOUND: no instance in that slot
            continue
    return found


def _all_devices(nvml: Any) -> list[tuple[str, Any]]:
    """(UUID, handle) of every GPU and every MIG device on this node."""
    out = []
    for i in range(nvml.nvmlDeviceGetCount()):
        gpu = nvml.nvmlDeviceGetHandleByIndex(i)
        out.append((_uuid_of(nvml, gpu), gpu))
        out.extend((_uuid_of(nvml, m), m) for m in _mig_devices(nvml, gpu))
    return out


def _by_uuid_prefix(nvml: Any, prefix: str) -> Any:
    """The one device whose UUID is `prefix` or starts with it (CUDA accepts unique prefixes)."""
    try:
        return nvml.nvmlDeviceGetHandleByUUID(prefix)
    except nvml.NVMLError:
        pass
    matches = [h for u, h in _all_devices(nvml) if u.lower().startswith(prefix.lower())]
    if len(matches) != 1:
        how = "no NVML device has" if not matches else f"{len(matches)} NVML devices have"
        raise NvmlMappingError(f"{how} a UUID starting with {prefix!r}")
    return matches[0]


def _legacy_mig(nvml: Any, gpu_uuid: str, gpu_instance: int, compute_instance: int) -> Any:
    """A MIG device named the pre-R470 way: parent GPU UUID, GPU and compute instance ids."""
    gpu = _by_uuid_prefix(nvml, gpu_uuid)
    for mig in _mig_devices(nvml, gpu):
        if (
            nvml.nvmlDeviceGetGpuInstanceId(mig) == gpu_instance
            and nvml.nvmlDeviceGetComputeInstanceId(mig) == compute_instance
        ):
            return mig
    raise NvmlMappingError(
        f"GPU {gpu_uuid} has no MIG device with GPU instance {gpu_instance} and compute "
        f"instance {compute_instance}"
    )


def _by_cuda_uuid(nvml: Any, uuid: str) -> Any:
    """NVML prefixes a GPU's UUID with GPU- and a MIG device's with MIG-; CUDA gives neither."""
    if uuid.startswith(("GPU-", "MIG-")):
        return nvml.nvmlDeviceGetHandleByUUID(uuid)
    for prefix in ("GPU-", "MIG-"):
        try:
            return nvml.nvmlDeviceGetHandleByUUID(prefix + uuid)
        except nvml.NVMLError:
            continue
    raise NvmlMappingError(f"no NVML device has the CUDA device's UUID {uuid}")


def _by_visible_entry(nvml: Any, ordinal: int, visible: str | None) -> Any:
    entries = visible_devices(visible)
    if entries is None:
        return nvml.nvmlDeviceGetHandleByIndex(ordinal)
    if ordinal >= len(entries):
        raise NvmlMappingError(
            f"cuda:{ordinal} is not among CUDA_VISIBLE_DEVICES={visible!r} "
            f"(CUDA reads it as {entries})"
        )
    entry = entries[ordinal]
    if entry.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(entry))
    legacy = _MIG_LEGACY.match(entry)
    if legacy:
        return _legacy_mig(nvml, legacy.group(1), int(legacy.group(2)), int(legacy.group(3)))
    return _by_uuid_prefix(nvml, entry)


def find(
    nvml: Any, ordinal: int, cuda_uuid: str | None = None, visible: str | None = None
) -> NvmlDevice:
    """The NVML device to read for CUDA device `ordinal` of this process.

    `nvml` is the pynvml module (initialised), `cuda_uuid` the device's UUID as CUDA reports
    it (`uuid_string`), `visible` the process's `CUDA_VISIBLE_DEVICES`. Raises
    NvmlMappingError (or pynvml's NVMLError) when no single device matches."""
    if cuda_uuid:
        handle = _by_cuda_uuid(nvml, cuda_uuid)
    else:
        handle = _by_visible_entry(nvml, ordinal, visible)
    uuid = _uuid_of(nvml, handle)
    try:
        mig = bool(nvml.nvmlDeviceIsMigDeviceHandle(handle))
    except nvml.NVMLError:  # a driver without MIG
        mig = False
    if not mig:
        return NvmlDevice(handle, uuid, uuid)
    parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    return NvmlDevice(parent, uuid, _uuid_of(nvml, parent))


def cuda_driver_uuid(ordinal: int) -> str | None:
    """UUID of CUDA device `ordinal` of this process, asked of the CUDA driver (libcuda), for
    frameworks that do not expose it (TensorFlow); None where there is no driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    get_uuid = getattr(cuda, "cuDeviceGetUuid_v2", None) or getattr(cuda, "cuDeviceGetUuid", None)
    device, raw = ctypes.c_int(), (ctypes.c_char * 16)()
    if get_uuid is None or cuda.cuInit(0) != 0:
        return None
    if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0 or get_uuid(raw, device) != 0:
        return None
    return uuid_string(bytes(raw))
