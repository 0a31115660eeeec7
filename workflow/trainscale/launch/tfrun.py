"""Local launcher for tf-multiworker and tf-ps: processes with TF_CONFIG, as torchrun is for DDP.

    python -m trainscale.launch.tfrun --nproc N [--ps P] -- <python arguments of one process>

Picks N free TCP ports on 127.0.0.1, gives worker i the cluster {"worker": [127.0.0.1:p0, ...]}
and task index i in TF_CONFIG (plus RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, as torchrun
sets them), streams every worker's output line by line, and exits 0 when all of them did. When
one fails, the others are stopped at once (they would wait forever in a collective for it) and
tfrun exits with the failed worker's code (128 + signal when it was killed, so a worker killed
for memory still reads as such to the supervisor).

With `--ps P` (tf-ps, ParameterServerStrategy) it starts P + N + 1 processes instead: a chief
(the coordinator, which trains), P parameter servers and N workers, in that order (`ps_roles`),
all with the one cluster {"chief": [...], "ps": [...], "worker": [...]}. Servers and workers
serve until they are stopped, so the chief's exit decides: when it ends, every other process is
stopped and tfrun exits with the chief's code; when a server or worker fails first, the rest are
stopped and tfrun exits with that one's code.

TensorFlow has no launcher of its own for MultiWorkerMirroredStrategy; its guides set TF_CONFIG
by hand. This module is that, without the hand. It imports nothing but the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, suppress


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct ports free on `host` right now (all bound at once, so never the same twice)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]


def worker_envs(nproc: int, ports: list[int], host: str = "127.0.0.1") -> list[dict[str, str]]:
    """The environment additions of each worker: TF_CONFIG and torchrun-style rank variables."""
    cluster = {"worker": [f"{host}:{p}" for p in ports]}
    return [
        {
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
            "RANK": str(i),
            "WORLD_SIZE": str(nproc),
            "LOCAL_RANK": str(i),
            "LOCAL_WORLD_SIZE": str(nproc),
        }
        for i in range(nproc)
    ]


def ps_roles(workers: int, ps: int) -> list[tuple[str, int]]:
    """(task type, index) of every process of a tf-ps run, in process order: the chief, the
    parameter servers, the workers. Under SLURM task i of the step is process i."""
    return [("chief", 0), *(("ps", i) for i in range(ps)), *(("worker", i) for i in range(workers))]


def ps_cluster(addresses: list[str], ps: int) -> dict[str, list[str]]:
    """The tf-ps cluster from every process's `host:port`, in `ps_roles` order."""
    return {"chief": addresses[:1], "ps": addresses[1 : 1 + ps], "worker": addresses[1 + ps :]}


def ps_envs(workers: int, ps: int, ports: list[int], host: str = "127.0.0.1") -> list[dict]:
    """The environment additions of each tf-ps process: TF_CONFIG with its role, and for a
    worker its index as LOCAL_RANK (which GPU it takes)."""
    cluster = ps_cluster([f"{host}:{p}" for p in ports], ps)
    envs = []
    for kind, i in ps_roles(workers, ps):
        e = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": i}})}
        if kind == "worker":
            e.update(LOCAL_RANK=str(i), LOCAL_WORLD_SIZE=str(workers))
        envs.append(e)
    return envs


def exit_code(returncode: int) -> int:
    """A shell's view of a child's status: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class Workers:
    """The running workers: start, stream, stop."""

    def __init__(
        self,
        argv: list[str],
        envs: list[dict[str, str]],
        names: list[str] | None = None,
        decider: int | None = None,
    ) -> None:
        """`names` label the processes in messages (default "worker i"); when `decider` is
        the index of one, its exit ends the run (the others serve until stopped)."""
        self.names = names or [f"worker {i}" for i in range(len(envs))]
        self.decider = decider
        self._lock = threading.Lock()
        self.procs: list[subprocess.Popen] = []
        self._pumps: list[threading.Thread] = []
        for extra in envs:
            p = subprocess.Popen(
                [sys.executable, *argv],
                env={**os.environ, **extra},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
            self.procs.append(p)
            t = threading.Thread(target=self._pump, args=(p.stdout,), daemon=True)
            t.start()
            self._pumps.append(t)

    def _pump(self, stream) -> None:
        for line in iter(stream.readline, ""):
            with self._lock:  # whole lines, never two workers' output interleaved in one
                sys.stdout.write(line)
                sys.stdout.flush()

    def wait(self, poll: float = 0.2) -> int:
        """Wait for all workers (or for the decider); on the first failure stop the rest.
        Returns tfrun's exit code."""
        while True:
            codes = [p.poll() for p in self.procs]
            if self.decider is not None and codes[self.decider] is not None:
                code = codes[self.decider]
                self.stop()  # the servers: they never end on their own
                self._flush()
                if code:
                    print(
                        f"trainscale.launch.tfrun: {self.names[self.decider]} exited with code "
                        f"{code}; stopped the others",
                        flush=True,
                    )
                return exit_code(code)
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i, code = failed[0]
                self.stop()
                self._flush()
                print(
                    f"trainscale.launch.tfrun: {self.names[i]} exited with code {code}; "
                    "stopped the others",
                    flush=True,
                )
                return exit_code(code)
            if all(c == 0 for c in codes):
                self._flush()
                return 0
            time.sleep(poll)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every live worker, SIGKILL what is left after `grace` seconds."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            live = [p for p in self.procs if p.poll() is None]
            for p in live:
                with suppress(ProcessLookupError):
                    p.send_signal(sig)
            deadline = time.monotonic() + grace
            while any(p.poll() is None for p in live) and time.monotonic() < deadline:
                time.sleep(0.05)

    def _flush(self) -> None:
        for t in self._pumps:
            t.join(timeout=5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m trainscale.launch.tfrun", description=__doc__.splitlines()[0]
    )
    p.add_argument("--nproc", type=int, required=True, help="workers on this host")
    p.add_argument(
        "--ps", type=int, default=0, help="parameter servers (tf-ps): adds them and a chief"
    )
    p.add_argument("worker", nargs=argparse.REMAINDER, help="-- then the worker's python args")
    a = p.parse_args(argv)
    worker = a.worker[1:] if a.worker[:1] == ["--"] else a.worker
    if a.nproc < 1 or a.ps < 0 or not worker:
        p.error("need --nproc >= 1, --ps >= 0 and, after --, the worker's python arguments")
    if a.ps:
        roles = ps_roles(a.nproc, a.ps)
        names = [f"{kind} {i}" if kind != "chief" else "chief" for kind, i in roles]
        envs = ps_envs(a.nproc, a.ps, free_ports(len(roles)))
        workers = Workers(worker, envs, names, decider=0)
    else:
        workers = Workers(worker, worker_envs(a.nproc, free_ports(a.nproc)))

    def terminate(signum, frame):  # the supervisor's timeout: take the workers down too
        workers.stop()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    return workers.wait()


if __name__ == "__main__":
    sys.exit(main())
