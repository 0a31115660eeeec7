"""Which NVML device a CUDA device is (trainscale.measure.nvml_devices), under every form of
CUDA_VISIBLE_DEVICES. NVML cannot run on this machine (no NVIDIA driver), so a fake NVML module
stands in for pynvml: a node of four GPUs in PCI order, the last one split into two MIG
devices. What is under test is the mapping, not NVML."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import pytest

from trainscale.measure import metrics, nvml_devices

NOT_SUPPORTED, NOT_FOUND = 3, 6


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Dev:
    uuid: str
    util: float | None = None
    energy_mj: float | None = None
    mig: list[Dev] = field(default_factory=list)
    parent: Dev | None = None
    gi: int = 0
    ci: int = 0


class FakeNvml:
    """pynvml's functions that the mapping and the reader call, over a fixed node."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[Dev]) -> None:
        self.gpus = gpus
        for g in gpus:
            for m in g.mig:
                m.parent = g

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Dev:
        if not 0 <= i < len(self.gpus):
            raise NVMLError(2)  # INVALID_ARGUMENT
        return self.gpus[i]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Dev:
        for g in self.gpus:
            for d in (g, *g.mig):
                if d.uuid == uuid:  # NVML wants the whole UUID
                    return d
        raise NVMLError(NOT_FOUND)

    def nvmlDeviceGetUUID(self, d: Dev) -> str:
        return d.uuid

    def nvmlDeviceGetMaxMigDeviceCount(self, d: Dev) -> int:
        if not d.mig:
            raise NVMLError(NOT_SUPPORTED)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, d: Dev, i: int) -> Dev:
        if i >= len(d.mig):
            raise NVMLError(NOT_FOUND)
        return d.mig[i]

    def nvmlDeviceIsMigDeviceHandle(self, d: Dev) -> int:
        return int(d.parent is not None)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, d: Dev) -> Dev:
        assert d.parent is not None
        return d.parent

    def nvmlDeviceGetGpuInstanceId(self, d: Dev) -> int:
        return d.gi

    def nvmlDeviceGetComputeInstanceId(self, d: Dev) -> int:
        return d.ci

    def nvmlDeviceGetUtilizationRates(self, d: Dev):
        if d.util is None or d.mig or d.parent:  # not on a MIG-enabled GPU nor a MIG device
            raise NVMLError(NOT_SUPPORTED)
        return type("Utilization", (), {"gpu": d.util, "memory": 0})()

    def nvmlDeviceGetTotalEnergyConsumption(self, d: Dev) -> float:
        if d.energy_mj is None or d.parent:
            raise NVMLError(NOT_SUPPORTED)
        return d.energy_mj


def uuid(head: str) -> str:
    return f"{head}-0000-4000-8000-00000000{head[-4:]}"


G0, G1, G2, G3 = (uuid(f"GPU-{h}") for h in ("5a1b0000", "5a2c0000", "9f3d0000", "c04e0000"))
M1, M2 = uuid("MIG-7e110000"), uuid("MIG-7e220000")


@pytest.fixture
def node() -> FakeNvml:
    """NVML's PCI order: G0..G3; G3 is MIG-enabled with instances M1 (GI 1) and M2 (GI 2)."""
    return FakeNvml(
        [
            Dev(G0, util=10.0, energy_mj=1000.0),
            Dev(G1, util=20.0, energy_mj=2000.0),
            Dev(G2, util=30.0, energy_mj=3000.0),
            Dev(G3, energy_mj=4000.0, mig=[Dev(M1, gi=1), Dev(M2, gi=2)]),
        ]
    )


def read_uuid(node, ordinal, cuda_uuid=None, visible=None) -> str:
    return node.nvmlDeviceGetUUID(nvml_devices.find(node, ordinal, cuda_uuid, visible).handle)


@pytest.mark.parametrize(
    ("value", "entries"),
    [
        (None, None),
        ("", []),
        ("2,3", ["2", "3"]),
        (" 3 , 1", ["3", "1"]),
        ("0,1,x,2", ["0", "1"]),  # CUDA stops at the first invalid entry
        ("1gpu,2", ["1", "2"]),  # an index reads like strtoul
        ("0,0", []),  # a repeated entry hides every device
        ("-1", []),
        (f"{G2},GPU-5a2", [G2, "GPU-5a2"]),
        (f"{M1}", [M1]),
        (f"MIG-{G3}/1/0", [f"MIG-{G3}/1/0"]),
    ],
)
def test_visible_devices_read_as_cuda_reads_them(value, entries):
    assert nvml_devices.visible_devices(value) == entries


def test_indices_in_cuda_visible_devices_are_nvml_indices(node):
    # SLURM gave this task GPUs 2 and 3: cuda:0 is NVML 2, not NVML 0
    assert read_uuid(node, 0, visible="2,3") == G2
    assert read_uuid(node, 1, visible="2,0") == G0


def test_without_cuda_visible_devices_the_ordinal_is_the_nvml_index(node):
    assert read_uuid(node, 1) == G1


def test_the_cuda_uuid_wins_over_order(node):
    # CUDA's order (fastest first) differs from NVML's PCI order: only the UUID says which
    assert read_uuid(node, 0, cuda_uuid=G2.removeprefix("GPU-")) == G2
    assert read_uuid(node, 0, cuda_uuid=G1.removeprefix("GPU-"), visible="2,3") == G1


def test_gpu_uuids_and_unique_prefixes(node):
    assert read_uuid(node, 0, visible=f"{G2},{G0}") == G2
    assert read_uuid(node, 1, visible=f"{G2},{G0}") == G0
    assert read_uuid(node, 0, visible="GPU-5a2,GPU-9f") == G1
    with pytest.raises(nvml_devices.NvmlMappingError, match="2 NVML devices"):
        nvml_devices.find(node, 0, visible="GPU-5a")  # G0 and G1 both start so
    with pytest.raises(nvml_devices.NvmlMappingError, match="no NVML device"):
        nvml_devices.find(node, 0, visible="GPU-ffff")


def test_mig_identifiers_read_the_parent_gpu(node):
    for visible in (M2, "MIG-7e22", f"MIG-{G3}/2/0"):
        dev = nvml_devices.find(node, 0, visible=visible)
        assert (dev.uuid, dev.read_uuid, dev.mig) == (M2, G3, True)
        assert f"parent GPU {G3}" in dev.what and "no utilisation" in dev.what
    with pytest.raises(nvml_devices.NvmlMappingError, match="GPU instance 5"):
        nvml_devices.find(node, 0, visible=f"MIG-{G3}/5/0")


def test_a_mig_device_uuid_from_cuda_finds_the_mig_device(node):
    dev = nvml_devices.find(node, 0, cuda_uuid=M1.removeprefix("MIG-"))
    assert (dev.uuid, dev.read_uuid) == (M1, G3)


def test_an_ordinal_past_cuda_visible_devices_is_an_error(node):
    with pytest.raises(nvml_devices.NvmlMappingError, match="not among CUDA_VISIBLE_DEVICES"):
        nvml_devices.find(node, 1, visible="2")


def test_an_unknown_cuda_uuid_is_an_error_not_another_gpu(node):
    with pytest.raises(nvml_devices.NvmlMappingError, match="no NVML device"):
        nvml_devices.find(node, 0, cuda_uuid="deadbeef-0000-0000-0000-000000000000", visible="0")


class FakeTorchUuid:
    """torch.cuda.get_device_properties(i).uuid: a `_CUuuid` with 16 raw bytes."""

    def __init__(self, text: str) -> None:
        self.bytes = bytes.fromhex(text.split("-", 1)[1].replace("-", ""))


def test_uuid_string_spells_torch_uuids_as_nvml_does():
    raw = FakeTorchUuid(G2)
    assert nvml_devices.uuid_string(raw) == G2.removeprefix("GPU-")
    assert nvml_devices.uuid_string(raw.bytes) == G2.removeprefix("GPU-")
    assert nvml_devices.uuid_string(" GPU-AB12 ") == "gpu-ab12"


def test_the_reader_reads_the_gpu_cuda_visible_devices_names(node, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", node)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")
    # no UUID from the framework, none from a CUDA driver (there is none here): the variable
    assert metrics.GpuMonitor.nvml_reader(1)() == (20.0, 2000.0)
    # torch's UUID of cuda:0 (its 16 bytes)
    assert metrics.GpuMonitor.nvml_reader(0, FakeTorchUuid(G2))() == (30.0, 3000.0)


def test_the_reader_of_a_mig_device_reads_its_parent_and_says_so(node, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", node)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", M1)
    read = metrics.GpuMonitor.nvml_reader(0)
    assert read() == (None, 4000.0)  # the whole GPU's energy; no utilisation on MIG
    assert f"parent GPU {G3}" in capsys.readouterr().err
    mon = metrics.GpuMonitor(interval=0.001, read=read).start()
    assert mon.stop() == (None, 0.0)


def test_the_reader_is_none_and_says_why_when_no_gpu_matches(node, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", node)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5a")
    assert metrics.GpuMonitor.nvml_reader(0) is None
    assert "no NVML readings for cuda:0: 2 NVML devices" in capsys.readouterr().err
