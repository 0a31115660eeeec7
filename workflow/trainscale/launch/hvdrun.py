"""Horovod across SLURM nodes through `srun`, not `ssh`: what `horovodrun --gloo` does, inside
the job's own step.

    python -m trainscale.launch.hvdrun --hosts n1:4,n2:4 --np 8 --addr 10.0.0.1 \\
        --srun "srun --nodes=2 ..." -- python -m trainscale.runners ...

On the job's first node (the supervisor starts it there) it starts Horovod's gloo rendezvous
server with the ranks' plan (`get_host_assignments`, as horovodrun makes it), then runs itself
once per node through `srun` (`--node`), and each node's copy starts that node's ranks with
the variables horovodrun gives a slot (`create_slot_env_vars`, `create_run_env_vars`). The
ranks stay in the job's step (its CPUs, memory, accounting); no ssh between nodes is needed.
Gloo's interface: HOROVOD_GLOO_IFACE where set (config `env`), else the one the route to the
rendezvous address takes (`ip route get`).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import time


def route_interface(addr: str) -> str:
    """The network interface this node reaches `addr` through (`ip route get`: "... dev X")."""
    try:
        out = subprocess.run(["ip", "route", "get", addr], capture_output=True, text=True).stdout
    except OSError:
        return "lo" if addr.startswith("127.") else "eth0"
    found = re.search(r"\bdev (\S+)", out)
    return found.group(1) if found else "lo"


def slot_env(addr: str, port: int, iface: str, slot) -> dict[str, str]:
    """What horovodrun gives one slot's process: the rendezvous and the slot's ranks."""
    from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars

    run = create_run_env_vars(addr, [iface], port)
    return {k: str(v) for k, v in {**run, **create_slot_env_vars(slot)}.items()}


def plan(hosts: str, np: int) -> list:
    """Horovod's slot of each rank, as horovodrun assigns them."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    return get_host_assignments(parse_hosts(hosts), np)


def run_node(a: argparse.Namespace) -> int:
    """This node's ranks, started together; the first to fail ends the others."""
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    iface = os.environ.get("HOROVOD_GLOO_IFACE") or route_interface(a.addr)
    mine = [s for s in plan(a.hosts, a.np) if s.hostname == node]
    if not mine:
        print(f"hvdrun: node {node} has no slot in {a.hosts}", file=sys.stderr)
        return 1
    procs = [
        subprocess.Popen(a.command, env={**os.environ, **slot_env(a.addr, a.port, iface, s)})
        for s in mine
    ]
    return wait_all(procs)


def wait_all(procs: list[subprocess.Popen], every: float = 0.5) -> int:
    """Wait for every process; once one fails, stop the rest (a peer would otherwise wait in
    a collective for its timeout). The first failure's exit code, or 0."""
    first = 0
    while None in (codes := [p.poll() for p in procs]):
        if first := next((c for c in codes if c), 0):
            for p, code in zip(procs, codes, strict=True):
                if code is None:
                    p.send_signal(signal.SIGTERM)
            break
        time.sleep(every)
    codes = [p.wait() for p in procs]
    return first or next((c for c in codes if c), 0)


def run_driver(a: argparse.Namespace) -> int:
    """The rendezvous server, and this launcher on every node through srun."""
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer(0)
    port = server.start()
    server.init(plan(a.hosts, a.np))
    node = ["--node", "--hosts", a.hosts, "--np", str(a.np), "--addr", a.addr]
    argv = [*shlex.split(a.srun), sys.executable, "-m", "trainscale.launch.hvdrun", *node]
    try:
        return subprocess.run([*argv, "--port", str(port), "--", *a.command]).returncode
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", required=True, help="host:slots,... (the job's nodes)")
    p.add_argument("--np", type=int, required=True, help="ranks in all")
    p.add_argument("--addr", required=True, help="the rendezvous server's address")
    p.add_argument("--srun", default="", help="the srun line that starts one task per node")
    p.add_argument("--node", action="store_true", help="start this node's ranks (srun's task)")
    p.add_argument("--port", type=int, default=0, help="the rendezvous server's port")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the rank's command")
    a = p.parse_args(argv)
    a.command = a.command[1:] if a.command[:1] == ["--"] else a.command
    return run_node(a) if a.node else run_driver(a)


if __name__ == "__main__":
    sys.exit(main())
