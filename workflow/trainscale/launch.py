"""Launch one run with its framework's own launcher, watch it, and make sure a record exists.

`command(spec, env)` is a pure function from a run spec and the machine it lands on (local
or a SLURM allocation) to the exact command line; it is unit-tested for every strategy and
every form, including GPU and multi-node ones this machine cannot run. `main` is the
supervisor the Snakemake rule calls: it runs that command in its own process group under the
run's timeout and, if the run ended without writing metrics (crash, OOM, timeout), writes a
failure record in its place, so one bad cell never hides the rest of the matrix.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainscale import metrics
from trainscale.matrix import RunSpec


@dataclass(frozen=True)
class Environment:
    """Where a run is launched: this host alone, or a SLURM allocation of `nodes`."""

    mode: str  # "local" or "slurm"
    python: str = "python"
    nodes: tuple[str, ...] = ()  # SLURM host names, first = rendezvous host
    port: int = 0  # rendezvous port; 0 = the OS picks a free one (single node only)
    job_id: str | None = None
    cache_dir: str = ".cache"  # persistent build caches (DeepSpeed's JIT-compiled ops)

    @property
    def head(self) -> str:
        return self.nodes[0] if self.nodes else "127.0.0.1"


def worker_env(spec: RunSpec, env: Environment | None = None) -> dict[str, str]:
    """Environment every worker process gets: its thread budget (a worker is a fixed unit),
    and for DeepSpeed a persistent cache for the ops it JIT-compiles (built once, not per run)."""
    n = str(spec.threads_per_worker)
    out = {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n}
    if spec.framework == "deepspeed":
        cache = env.cache_dir if env else ".cache"
        out["TORCH_EXTENSIONS_DIR"] = f"{cache}/torch_extensions"
    if spec.framework == "tensorflow":
        out.update(TF_ENV)
    return out


def single_process(spec: RunSpec, env: Environment, worker: list[str]) -> list[str]:
    """One process (it may drive several GPUs itself, as nn.DataParallel does)."""
    return [env.python, *worker]


def torchrun(spec: RunSpec, env: Environment, worker: list[str]) -> list[str]:
    """torchrun with a c10d rendezvous; across SLURM nodes, srun starts one torchrun per node.

    Locally the endpoint's port is 0: the rendezvous store binds a port the OS picks, so
    several runs on one host never clash. Across nodes the supervisor picks a free port on
    the first node (where the batch script runs) and every node's torchrun dials it.
    """
    rdzv_id = f"{spec.study}-{hashlib.sha1(spec.path.encode()).hexdigest()[:12]}"
    if env.job_id:
        rdzv_id = f"slurm-{env.job_id}"
    cmd = [
        env.python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={spec.nodes}",
        f"--nproc-per-node={spec.workers}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={env.head}:{env.port}",
        f"--rdzv-id={rdzv_id}",
        "--max-restarts=0",
        *worker,
    ]
    if spec.nodes == 1:
        return cmd
    if env.mode != "slurm":
        raise ValueError(
            f"{spec.strategy} with nodes={spec.nodes} needs a SLURM allocation of that many"
        )
    srun = [
        "srun",
        f"--nodes={spec.nodes}",
        f"--ntasks={spec.nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
    ]
    return [*srun, *cmd]


#: What every TensorFlow worker needs: tf-keras 2 as tf.keras for every TF strategy (Keras 3's
#: fit fails under MultiWorkerMirroredStrategy), and TensorFlow's C++ INFO lines silenced.
TF_ENV = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "1"}


def tfrun(spec: RunSpec, env: Environment, worker: list[str]) -> list[str]:
    """tf-multiworker: one process per worker, MultiWorkerMirroredStrategy between them.

    On one node `python -m trainscale.tfrun` starts the workers with TF_CONFIG on free
    127.0.0.1 ports (and stops them all when one fails). Across SLURM nodes srun starts one
    task per worker and the runner resolves the cluster with SlurmClusterResolver, each node's
    workers listening on the port the supervisor picked on the first node, +1, ...
    """
    if spec.nodes == 1:
        return [env.python, "-m", "trainscale.tfrun", f"--nproc={spec.workers}", "--", *worker]
    if env.mode != "slurm":
        raise ValueError(
            f"{spec.strategy} with nodes={spec.nodes} needs a SLURM allocation of that many"
        )
    srun = [
        "srun",
        f"--nodes={spec.nodes}",
        f"--ntasks={spec.world_size}",
        f"--ntasks-per-node={spec.workers}",
        "--kill-on-bad-exit=1",
    ]
    cluster = ["env", "TRAINSCALE_TF_CLUSTER=slurm", f"TRAINSCALE_TF_PORT={env.port}"]
    return [*srun, *cluster, env.python, *worker]


#: strategy -> function building its launcher's command line (the one place to add one)
LAUNCHERS: dict[str, Callable[[RunSpec, Environment, list[str]], list[str]]] = {
    "torch": single_process,
    "torch-dp": single_process,
    "torch-ddp": torchrun,
    "torch-fsdp": torchrun,
    "torch-pipeline": torchrun,
    # DeepSpeed through torchrun, not the `deepspeed` launcher: that one always rendezvouses
    # on port 29500 (runs side by side clash) and needs a hostfile for multi-node; torchrun
    # gives free ports locally and the same srun form as torch-ddp across SLURM nodes.
    "deepspeed-zero0": torchrun,
    "deepspeed-zero1": torchrun,
    "deepspeed-zero2": torchrun,
    "deepspeed-zero3": torchrun,
    "tf": single_process,
    "tf-mirrored": single_process,
    "tf-multiworker": tfrun,
}


def command(spec: RunSpec, env: Environment, out: str) -> list[str]:
    """The command line that runs `spec` in `env` and writes metrics to `out`."""
    try:
        launcher = LAUNCHERS[spec.strategy]
    except KeyError:
        raise ValueError(f"strategy {spec.strategy!r} has no launcher in this version") from None
    worker = ["-m", "trainscale.runners", "--spec", spec.to_json(), "--out", out]
    prefix = ["env", *(f"{k}={v}" for k, v in sorted(worker_env(spec, env).items()))]
    return [*prefix, *launcher(spec, env, worker)]


def job_environment(package_dir: str | os.PathLike, python: str) -> dict[str, str]:
    """PYTHONPATH and PATH for Snakemake's jobs: the package importable without installing it
    (conda envs hold only its dependencies), and `python` resolving to the interpreter that
    runs Snakemake, so `.venv/bin/snakemake` works without activating the venv."""
    pythonpath = [str(package_dir), *filter(None, [os.environ.get("PYTHONPATH")])]
    path = [str(Path(python).parent), os.environ.get("PATH", "")]
    return {"PYTHONPATH": os.pathsep.join(pythonpath), "PATH": os.pathsep.join(path)}


def free_port() -> int:
    """A TCP port free on this host right now (for rendezvous hosts other hosts must reach)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def expand_nodelist(nodelist: str) -> tuple[str, ...]:
    """Expand SLURM's compressed host list ('n[1-3,5],gpu7') without needing scontrol."""
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist):
        stem, ranges = m.group(1), m.group(2)
        if not ranges:
            hosts.append(stem)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{stem}{i:0{width}d}")
    return tuple(h for h in hosts if h)


def detect(environ: dict[str, str] | None = None) -> Environment:
    """Local host, or the SLURM allocation this process runs in (SLURM_JOB_ID is set)."""
    environ = dict(os.environ if environ is None else environ)
    job = environ.get("SLURM_JOB_ID")
    cache = str(Path.cwd() / ".cache")  # the workflow's working directory
    if not job:
        return Environment(mode="local", python=sys.executable, cache_dir=cache)
    nodes = expand_nodelist(environ.get("SLURM_JOB_NODELIST", ""))
    return Environment(
        mode="slurm", python=sys.executable, nodes=nodes, job_id=job, cache_dir=cache
    )


OOM_PATTERNS = ("OutOfMemoryError", "CUDA out of memory", "MemoryError", "Cannot allocate memory")


def classify(returncode: int | None, tail: str, timed_out: bool) -> str:
    """Status of a run that wrote no metrics: timeout, oom or failed."""
    if timed_out:
        return "timeout"
    if any(p in tail for p in OOM_PATTERNS) or returncode in (-signal.SIGKILL, 137):
        return "oom"
    return "failed"


_EXC_LINE = re.compile(
    r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt)\b(?::.*)?$"
)


def exception_lines(lines: list[str]) -> list[str]:
    """The exception lines (`pkg.SomeError: message`) in a run's output, first one first,
    without the launcher's own wrapper (torchrun's ChildFailedError)."""
    seen: list[str] = []
    for line in lines:
        text = line.strip()
        if _EXC_LINE.match(text) and "ChildFailedError" not in text and text not in seen:
            seen.append(text)
    return seen


def _pump(stream, sink, tail: collections.deque) -> None:
    for line in iter(stream.readline, ""):
        sink.write(line)
        sink.flush()
        tail.append(line)


def supervise(spec: RunSpec, out: Path, env: Environment, grace: float = 10.0) -> str:
    """Run `spec`, stream its output, enforce its timeout; return the final status."""
    if env.mode == "slurm" and spec.nodes > 1 and not env.port:
        env = dataclasses.replace(env, port=free_port())
    argv = command(spec, env, str(out))
    cmdline = shlex.join(argv)
    print(f"trainscale: {spec.path}\ntrainscale: launching: {cmdline}", flush=True)
    start_utc, t0 = metrics.utc_now(), time.perf_counter()
    launch = {"command": cmdline, "mode": env.mode, "exit_code": None}
    child_env = {**os.environ, "TRAINSCALE_LAUNCH": json.dumps(launch), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,  # own process group: a timeout kills every rank and launcher
        env=child_env,
    )
    tail: collections.deque = collections.deque(maxlen=400)
    pump = threading.Thread(target=_pump, args=(proc.stdout, sys.stdout, tail), daemon=True)
    pump.start()
    timed_out = False
    try:
        proc.wait(timeout=spec.timeout_minutes * 60)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc, grace)
    pump.join(timeout=5)
    launch["exit_code"] = proc.returncode
    if out.exists():
        try:
            rec = metrics.read(out)
            if proc.returncode:
                print(
                    f"trainscale: exit code {proc.returncode} after metrics were written "
                    f"(status {rec['status']} kept)",
                    flush=True,
                )
            return rec["status"]
        except metrics.MetricsError as e:
            tail.append(f"metrics written by the run are invalid: {e}\n")
            out.unlink()
    status = classify(proc.returncode, "".join(tail), timed_out)
    reason = {
        "timeout": f"timeout: no result after timeout_minutes={spec.timeout_minutes}; "
        "the run's process group was killed",
        "oom": "out of memory",
        "failed": f"the run exited with code {proc.returncode} before writing metrics",
    }[status]
    lines = list(tail)
    exc = exception_lines(lines)
    error = "\n".join([reason, *exc[:3], "--- last lines of the run's output ---"])
    error += "\n" + "".join(lines[-30:])
    rec = metrics.failure_record(
        spec.to_dict(), status, error, start_utc, time.perf_counter() - t0, launch
    )
    metrics.write(out, rec)
    print(f"trainscale: recorded status {status!r} in {out}", flush=True)
    return status


def _kill_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the run's whole process group, then SIGKILL what is left after `grace`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True, help="run spec as JSON (RunSpec.to_json)")
    p.add_argument("--out", required=True, help="metrics.json to write")
    p.add_argument(
        "--on-failure",
        choices=["record", "stop"],
        default="record",
        help="record: a failed run writes a failure record and the job succeeds; "
        "stop: the record is written and the job fails",
    )
    a = p.parse_args(argv)
    spec = RunSpec.from_json(a.spec)
    status = supervise(spec, Path(a.out), detect())
    return 1 if status != "ok" and a.on_failure == "stop" else 0


if __name__ == "__main__":
    sys.exit(main())
