"""Local launcher for tf-multiworker: N worker processes with TF_CONFIG, as torchrun is for DDP.

    python -m trainscale.tfrun --nproc N -- <python arguments of one worker>

Picks N free TCP ports on 127.0.0.1, gives worker i the cluster {"worker": [127.0.0.1:p0, ...]}
and task index i in TF_CONFIG (plus RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, as torchrun
sets them), streams every worker's output line by line, and exits 0 when all of them did. When
one fails, the others are stopped at once (they would wait forever in a collective for it) and
tfrun exits with the failed worker's code (128 + signal when it was killed, so a worker killed
for memory still reads as such to the supervisor).

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


def exit_code(returncode: int) -> int:
    """A shell's view of a child's status: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class Workers:
    """The running workers: start, stream, stop."""

    def __init__(self, argv: list[str], envs: list[dict[str, str]]) -> None:
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
        """Wait for all workers; on the first failure stop the rest. Returns tfrun's exit code."""
        while True:
            codes = [p.poll() for p in self.procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i, code = failed[0]
                self.stop()
                self._flush()
                print(
                    f"trainscale.tfrun: worker {i} exited with code {code}; stopped the others",
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
        prog="python -m trainscale.tfrun", description=__doc__.splitlines()[0]
    )
    p.add_argument("--nproc", type=int, required=True, help="workers on this host")
    p.add_argument("worker", nargs=argparse.REMAINDER, help="-- then the worker's python args")
    a = p.parse_args(argv)
    worker = a.worker[1:] if a.worker[:1] == ["--"] else a.worker
    if a.nproc < 1 or not worker:
        p.error("need --nproc >= 1 and, after --, the worker's python arguments")
    workers = Workers(worker, worker_envs(a.nproc, free_ports(a.nproc)))

    def terminate(signum, frame):  # the supervisor's timeout: take the workers down too
        workers.stop()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    return workers.wait()


if __name__ == "__main__":
    sys.exit(main())
