"""Two hosts joined by a real, shaped network link: Linux network namespaces and a veth pair.

Each namespace is a host with its own network stack (its own interfaces, addresses, ports);
the veth pair is the cable between them, and `tc`'s token bucket filter (tbf) on both ends
limits the link to a stated rate in each direction (the kernel here has no netem, so no added
latency: a bandwidth-only link). Traffic only ever goes between the two namespaces this test
creates (10.231.0.1 ↔ 10.231.0.2 on the veth), never to another host.

Over that link, one rank per namespace, as on two nodes:
- the all-reduce benchmark (python -m trainscale.runners.collectives): busbw at the largest message
  must match the shaped rate;
- a 2-rank torch-ddp run: at the slower link, its step time rises by what the communication
  model (trainscale.analysis.aggregate.communication_frame) predicts: t = v · 2(N − 1)/N · S / B.

Needs root (CAP_NET_ADMIN) for `ip netns add`; skipped with the reason where that is refused.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from trainscale.analysis import aggregate
from trainscale.measure import collectives, metrics
from trainscale.models import torch_models as models
from trainscale.plan.matrix import build_runs

from conftest import PYTHON, ROOT, run_env, validated

pytestmark = pytest.mark.slow

ADDRS = ("10.231.0.1", "10.231.0.2")
PORT = 29511  # the rendezvous port inside the first namespace (its own port space)

#: busbw against the shaped rate, at the largest message (~0.3 s on the wire). Above: tbf never
#: lets more than its rate through, but for its burst (≤ 64 KiB of a multi-MiB message: < 2%).
#: Below: the rate counts whole Ethernet frames, of which TCP/IP and Ethernet headers take ~5%
#: (1448 payload bytes in 1514), gloo's own framing and the round trips between its chunks a
#: few % more, and the 2 CPU cores are shared with other work. Measured here: 0.91-0.92 × rate
#: at 100 Mbit/s, 0.89-0.93 at 300-400 Mbit/s; 0.80-1.02 × rate holds all of that and fails a
#: link that is not the bottleneck (busbw far above the rate) or a benchmark that mis-measures
#: by a factor (2(n−1)/n wrong: 2×).
BUSBW_LOW, BUSBW_HIGH = 0.80, 1.02

#: DDP's step-time rise between a slow and a fast link against the model's prediction
#: S/B_slow − S/B_fast (v = 1, N = 2; B = the shaped rate in bytes/s). The model counts
#: gradient bytes only; the wire also carries headers (~5%) and DDP's small per-step messages,
#: and compute time varies by several ms per step on the shared cores (the fast link's step
#: took 5.7-18 ms here depending on the other load). Measured here: 0.99× (52.5 ms against
#: 53.0 at 20 vs 1000 Mbit/s) and 0.83× (41.7 against 50.5 at 20 vs 300, under load);
#: 0.7-1.4 × holds those and fails a model that is off by the factor 2(N − 1)/N or by v.
RISE_LOW, RISE_HIGH = 0.7, 1.4
#: the shaped rates, Mbit/s: the benchmark's two settings; DDP's slow link against the fast one
LINK_RATES = (100, 300)
DDP_SLOW = 20


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


class Link:
    """Two namespaces `<name>a`, `<name>b`, joined by veth `<name>a` ↔ `<name>b` carrying
    ADDRS[0] ↔ ADDRS[1]; `shape(mbit)` sets tbf on both ends (each direction at that rate)."""

    def __init__(self, name: str) -> None:
        self.ns = (f"{name}a", f"{name}b")
        self.dev = self.ns  # the veth ends take their namespace's name

    def up(self) -> None:
        a, b = self.ns
        steps = [
            ("link", "add", a, "type", "veth", "peer", "name", b),
            ("link", "set", a, "netns", a),
            ("link", "set", b, "netns", b),
        ]
        for ns, dev, addr in zip(self.ns, self.dev, ADDRS, strict=True):
            steps += [
                ("-n", ns, "addr", "add", f"{addr}/24", "dev", dev),
                ("-n", ns, "link", "set", dev, "up"),
                ("-n", ns, "link", "set", "lo", "up"),
            ]
        for s in steps:
            p = ip(*s)
            assert p.returncode == 0, (s, p.stderr)

    def shape(self, mbit: float) -> None:
        # burst: what tbf lets through at line speed after an idle spell; small against every
        # measured transfer (16 KiB is 6.5 ms at 20 Mbit/s, against DDP's 54 ms per step)
        burst = 16 * 1024
        for ns, dev in zip(self.ns, self.dev, strict=True):
            cmd = ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root"]
            cmd += ["tbf", "rate", f"{mbit}mbit", "burst", str(burst), "latency", "100ms"]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            assert p.returncode == 0, (cmd, p.stderr)

    def run_ranks(self, argv: list[str], timeout: float = 120) -> list[subprocess.CompletedProcess]:
        """`python argv` once per namespace as ranks 0 and 1 of a 2-rank torch.distributed job
        (torchrun's environment; the rendezvous store on rank 0's address)."""
        procs = []
        for rank, (ns, dev) in enumerate(zip(self.ns, self.dev, strict=True)):
            env = run_env(
                RANK=str(rank),
                WORLD_SIZE="2",
                LOCAL_RANK="0",
                LOCAL_WORLD_SIZE="1",
                GROUP_RANK=str(rank),
                MASTER_ADDR=ADDRS[0],
                MASTER_PORT=str(PORT),
                GLOO_SOCKET_IFNAME=dev,
                OMP_NUM_THREADS="1",
                MKL_NUM_THREADS="1",
            )
            cmd = ["ip", "netns", "exec", ns, PYTHON, *argv]
            procs.append(
                subprocess.Popen(
                    cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
                )
            )
        done = []
        try:
            for p in procs:
                out, _ = p.communicate(timeout=timeout)
                done.append(subprocess.CompletedProcess(p.args, p.returncode, out.decode()))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return done

    def down(self) -> None:
        for ns in self.ns:  # deleting a namespace deletes its veth end, and so the pair
            ip("netns", "del", ns)


@pytest.fixture
def link():
    if shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("iproute2 (ip, tc) is not installed")
    name = f"ts{uuid.uuid4().hex[:8]}"  # ≤ 15 characters: also the veth names
    probe = ip("netns", "add", f"{name}a")
    if probe.returncode != 0:
        pytest.skip(f"`ip netns add` is not permitted here: {probe.stderr.strip()}")
    lk = Link(name)
    try:
        assert ip("netns", "add", f"{name}b").returncode == 0
        lk.up()
        yield lk
    finally:
        lk.down()
        assert not {f"{name}a", f"{name}b"} & set(ip("netns", "list").stdout.split())


def busbw(link: Link, mbit: float, out: Path) -> tuple[float, dict]:
    """Shape the link, run the all-reduce benchmark across it; busbw (bytes/s) at its largest
    message, one about 0.3 s on the wire at the shaped rate."""
    link.shape(mbit)
    rate = mbit * 1e6 / 8
    max_bytes = 1 << int(rate * 0.3).bit_length() - 1
    argv = ["-m", "trainscale.runners.collectives", "--workers", "1", "--nodes", "2"]
    argv += ["--max-bytes", str(max_bytes), "--warmup", "2", "--iters", "5", "--out", str(out)]
    ranks = link.run_ranks(argv)
    for r in ranks:
        assert r.returncode == 0, r.stdout[-3000:]
    rec = collectives.read(out)
    assert rec["world_size"] == 2 and rec["bus_factor"] == 1.0
    largest = rec["sizes"][-1]
    assert largest["bytes"] == max_bytes
    return largest["busbw_bytes_per_second"], rec


def test_allreduce_busbw_matches_the_shaped_link(link, tmp_path):
    """At 100 and 300 Mbit/s, the benchmark's busbw is the link's rate. Not 1 Gbit/s: on this
    kind of machine (2 shared CPU cores) gloo moves 89-136 MB/s at 8-32 MiB over an unshaped
    veth, about 1 Gbit/s itself, so at that rate the link would not be the bottleneck."""
    for mbit in LINK_RATES:
        bw, rec = busbw(link, mbit, tmp_path / f"coll-{mbit}.json")
        rate = mbit * 1e6 / 8
        print(f"{mbit} Mbit/s: busbw {bw / 1e6:.2f} MB/s = {bw / rate:.3f} × rate")
        assert BUSBW_LOW * rate <= bw <= BUSBW_HIGH * rate, (mbit, bw / rate, rec["sizes"][-1])


def ddp_spec():
    m = {"strategy": ["torch-ddp"], "model": ["seed-small"], "dataset": ["digits"]}
    m |= {"workers": [1], "nodes": [2], "batch_size": [64], "exclude": []}
    runs, dropped = build_runs(validated({"study": "net", "matrix": m}))
    assert runs, dropped
    return runs[0]


def ddp_step_seconds(link: Link, mbit: float, spec, out: Path) -> float:
    """Median step time of the steady epoch of a 2-rank torch-ddp run across the link."""
    link.shape(mbit)
    ranks = link.run_ranks(
        ["-m", "trainscale.runners", "--spec", spec.to_json(), "--out", str(out)]
    )
    for r in ranks:
        assert r.returncode == 0, r.stdout[-3000:]
    rec = metrics.read(out)
    assert rec["status"] == "ok", rec["error"]
    assert rec["device"]["count"] == 2
    return rec["epochs"][-1]["step_seconds_p50"]


def test_ddp_step_time_rises_as_the_communication_model_predicts(link, tmp_path):
    """torch-ddp, one rank per namespace: the step time at 20 Mbit/s minus that at 300 Mbit/s
    is the model's S/B_slow − S/B_fast (S: the gradient, params × 4 bytes: 135 kB, so 54 ms
    against 3.6 ms per step; the step's compute, ~6 ms, cancels in the difference)."""
    spec = ddp_spec()
    assert (spec.world_size, spec.nodes, spec.per_worker_batch_size) == (2, 2, 32)
    import torch

    from trainscale import data

    info = data.info(spec.dataset)
    with torch.device("meta"):
        params = models.param_count(models.build(spec.model, info.shape, info.num_classes))
    size = aggregate.gradient_bytes(spec.strategy, spec.precision, params)
    volume = aggregate.COMM_VOLUME[spec.strategy] * collectives.bus_factor(spec.world_size)
    slow, fast = DDP_SLOW, LINK_RATES[-1]
    t = {
        mbit: ddp_step_seconds(link, mbit, spec, tmp_path / f"ddp-{mbit}.json")
        for mbit in (fast, slow)
    }
    predicted = volume * size / (slow * 1e6 / 8) - volume * size / (fast * 1e6 / 8)
    rise = t[slow] - t[fast]
    print(
        f"step p50: {t[fast] * 1e3:.1f} ms at {fast} Mbit/s, {t[slow] * 1e3:.1f} ms at {slow}; "
        f"rise {rise * 1e3:.1f} ms, predicted {predicted * 1e3:.1f} ms ({rise / predicted:.3f}×)"
    )
    assert RISE_LOW * predicted <= rise <= RISE_HIGH * predicted, (t, predicted)
