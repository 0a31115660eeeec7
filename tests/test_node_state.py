"""Each node's state in the record: NCCL's transport from its own INFO lines (the formats of
NCCL's src/transport/net.cc, p2p.cc and shm.cc), the GPUs' state from NVML (none on this CPU
machine), and the supervisor's stamp on a record."""

from trainscale.launch import node_record
from trainscale.measure import metrics, nccl_log, node_state

#: channel lines as NCCL 2.2x prints them at NCCL_DEBUG=INFO (host and pid prefix included)
IB = [
    "gpu01:1234:1301 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
    "gpu01:1234:1301 [0] NCCL INFO Channel 01/0 : 8[0] -> 0[0] [receive] via NET/IB/1/GDRDMA",
    "g01:1234:1301 [1] NCCL INFO Channel 02/0 : 1[1] -> 9[1] [send] via NET/IB/1(9)/GDRDMA/Shared",
    "gpu01:1234:1301 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "gpu01:1234:1301 [0] NCCL INFO Connected all rings",
]
SOCKET = [
    "n1:77:90 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>",
    "n1:77:90 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    "n1:77:90 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0",
]
ONE_NODE = [
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read",
    "h:1:2 [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct/direct",
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] via P2P/direct pointer/read",
]


def test_nccl_transport_from_its_channel_lines():
    assert nccl_log.transport(IB) == "NET/IB/GDRDMA, P2P/CUMEM"
    assert nccl_log.transport(SOCKET) == "NET/Socket"
    assert nccl_log.transport(ONE_NODE) == "P2P/IPC, P2P/direct pointer, SHM"
    assert nccl_log.transport(["NCCL INFO Bootstrap : Using eth0", "epoch 1 loss 2.3"]) is None
    assert nccl_log.transport([]) is None


def test_throttle_reasons_by_name():
    assert node_state.throttle_names(0) == []
    assert node_state.throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]


def test_no_gpus_on_a_cpu_node_and_the_supervisors_stamp():
    assert node_state.read() == []  # no NVML here: env.gpus is empty
    rec = metrics.empty_record({"study": "s"}, "failed", "x")
    assert rec["env"]["gpus"] == [] and rec["env"]["nccl"]["transport"] is None
    stamped = node_record.stamp(rec, nccl_log.transport(SOCKET))
    assert stamped["env"]["nccl"]["transport"] == "NET/Socket" and stamped["env"]["gpus"] == []


def test_a_gpus_state_at_the_start_beside_its_end():
    def gpu(clock: int, reasons: list[str]) -> node_state.GpuState:
        return node_state.GpuState(0, "GPU-1", "NVIDIA H100 80GB HBM3", 700.0, clock, reasons,
                                   {"corrected": 0, "uncorrected": 0}, None, 0)  # fmt: skip

    (entry,) = node_state.block([gpu(1980, [])], [gpu(1410, ["sw_thermal_slowdown"])], "n7")
    assert entry["host"] == "n7" and entry["sm_clock_mhz"] == 1410
    assert entry["start"]["sm_clock_mhz"] == 1980 and entry["start"]["throttle_reasons"] == []
    assert node_state.block([], [gpu(1410, [])], "n7")[0]["start"] is None


def test_nccl_lines_are_asked_for_on_cuda_unless_the_user_set_nccl_debug():
    assert node_record.nccl_debug("cuda", {}) == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"}
    assert node_record.nccl_debug("cuda", {"NCCL_DEBUG": "WARN"}) == {}
    assert node_record.nccl_debug("cpu", {}) == {}
