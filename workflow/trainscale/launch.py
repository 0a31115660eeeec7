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
import math
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

from trainscale import attempts, metrics
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
    addrs: tuple[str, ...] = ()  # SLURM NodeAddr of each node (how other nodes reach it)
    time_limit: float | None = None  # the SLURM job's time limit, seconds
    time_left: float | None = None  # seconds until it, when the run starts
    restarts: int | None = None  # times SLURM requeued the job before this start

    @property
    def head(self) -> str:
        """Rendezvous host: the first node's SLURM NodeAddr, else its name, else loopback."""
        return (self.addrs or self.nodes or ("127.0.0.1",))[0]


def worker_env(spec: RunSpec, env: Environment | None = None) -> dict[str, str]:
    """Environment every worker process gets: its thread budget (a worker is a fixed unit),
    and for DeepSpeed a persistent cache for the ops it JIT-compiles (built once, not per run)."""
    n = str(spec.threads_per_worker)
    out = {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n}
    if spec.framework == "deepspeed":
        cache = env.cache_dir if env else ".cache"
        out["TORCH_EXTENSIONS_DIR"] = f"{cache}/torch_extensions"
    if spec.framework == "tensorflow" or spec.strategy == "horovod-keras":
        out.update(TF_ENV)
    return out


def single_process(spec: RunSpec, env: Environment, worker: list[str]) -> list[str]:
    """One process (it may drive several GPUs itself, as nn.DataParallel does)."""
    return [env.python, *worker]


def srun(spec: RunSpec, tasks_per_node: int) -> list[str]:
    """srun across the run's nodes; one failing task ends the step (no rank waits forever)."""
    return [
        "srun",
        f"--nodes={spec.nodes}",
        f"--ntasks={spec.nodes * tasks_per_node}",
        f"--ntasks-per-node={tasks_per_node}",
        "--kill-on-bad-exit=1",
    ]


def torchrun(spec: RunSpec, env: Environment, worker: list[str]) -> list[str]:
    """torchrun with a c10d rendezvous; across SLURM nodes, srun starts one torchrun per node.

    Locally the endpoint's port is 0: the rendezvous store binds a port the OS picks, so
    several runs on one host never clash. Across nodes the supervisor picks a free port on
    the first node (where the batch script runs) and every node's torchrun dials it.
    """
    rdzv_id = f"{spec.study}-{hashlib.sha1(spec.path.encode()).hexdigest()[:12]}"
    if env.job_id:
        rdzv_id = f"slurm-{env.job_id}"
    # one node (inside SLURM too): the local form, whatever the allocation's node name is
    endpoint = f"{env.head}:{env.port}" if spec.nodes > 1 else "127.0.0.1:0"
    cmd = [
        env.python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={spec.nodes}",
        f"--nproc-per-node={spec.workers}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
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
    return [*srun(spec, tasks_per_node=1), *cmd]


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
    cluster = ["env", "TRAINSCALE_TF_CLUSTER=slurm", f"TRAINSCALE_TF_PORT={env.port}"]
    if env.addrs:  # SlurmClusterResolver lists node names; workers dial their NodeAddr
        pairs = ",".join(f"{n}={a}" for n, a in zip(env.nodes, env.addrs, strict=True))
        cluster.append(f"TRAINSCALE_NODE_ADDRS={pairs}")
    return [*srun(spec, tasks_per_node=spec.workers), *cluster, env.python, *worker]


def horovodrun(spec: RunSpec, env: Environment, worker: list[str]) -> list[str]:
    """horovodrun (`python -m horovod.runner.launch`) over gloo, one process per worker.

    Locally `-H localhost:N` on the loopback interface (without `--network-interface lo`
    elastic gloo waits silently for its timeout); every server horovodrun starts binds a port
    the OS has free, so several runs share a host. Across SLURM nodes horovodrun runs on the
    first node and starts each node's workers over ssh (`-H n1:W,n2:W`). The elastic form
    names a host discovery script (`trainscale.horovod_hosts`) and lets the world shrink to
    one worker and grow back to the spec's. The workers inherit the environment horovodrun
    runs in (it exports it to remote hosts too), so the thread budget in `worker_env` reaches
    every one of them: horovodrun itself sets no OMP_NUM_THREADS.
    """
    if spec.nodes > 1 and env.mode != "slurm":
        raise ValueError(
            f"{spec.strategy} with nodes={spec.nodes} needs a SLURM allocation of that many"
        )
    local = spec.nodes == 1
    cmd = [env.python, "-m", "horovod.runner.launch", "--gloo", "-np", str(spec.world_size)]
    if local:
        cmd += ["--network-interface", "lo"]
    if spec.strategy == "horovod-torch-elastic":
        discovery = f"{env.python} -m trainscale.horovod_hosts --slots {spec.workers}"
        cmd += ["--min-np", "1", "--max-np", str(spec.world_size)]
        cmd += ["--host-discovery-script", discovery]
    elif local:
        cmd += ["-H", f"localhost:{spec.workers}"]
    else:
        cmd += ["-H", ",".join(f"{h}:{spec.workers}" for h in env.nodes[: spec.nodes])]
    return [*cmd, env.python, *worker]


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
    "horovod-torch": horovodrun,
    "horovod-keras": horovodrun,
    "horovod-torch-elastic": horovodrun,
    "lightning-ddp": torchrun,
}


def command(spec: RunSpec, env: Environment, out: str) -> list[str]:
    """The command line that runs `spec` in `env` and writes metrics to `out`."""
    try:
        launcher = LAUNCHERS[spec.strategy]
    except KeyError:
        raise ValueError(f"strategy {spec.strategy!r} has no launcher in this version") from None
    worker = ["-m", "trainscale.runners", "--spec", spec.to_json(), "--out", out]
    extra = worker_env(spec, env)
    if spec.horovod_timeline:  # Horovod's timeline, kept beside the run's metrics
        extra["HOROVOD_TIMELINE"] = str(Path(out).parent / "horovod-timeline.json")
    prefix = ["env", *(f"{k}={v}" for k, v in sorted(extra.items()))]
    return [*prefix, *launcher(spec, env, worker)]


def tasks_per_node(spec: RunSpec) -> int:
    """SLURM tasks per node of a run: one per worker for tf-multiworker across nodes (srun
    starts each worker), else one (torchrun or the runner starts the node's workers)."""
    return spec.workers if LAUNCHERS.get(spec.strategy) is tfrun and spec.nodes > 1 else 1


def probe_command(spec: RunSpec, env: Environment) -> list[str]:
    """The device probe (trainscale.devices) in every task the run would have."""
    argv = [env.python, "-m", "trainscale.devices"]
    return [*srun(spec, tasks_per_node(spec)), *argv] if spec.nodes > 1 else argv


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


def scontrol_fields(text: str) -> dict[str, str]:
    """`scontrol show ... -o` output (one `Key=Value` line per record) as a dict."""
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))


def slurm_seconds(value: str) -> float | None:
    """SLURM's `[days-][hours:]minutes:seconds` as seconds; None for UNLIMITED and the like."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", value.strip())
    if not m:
        return None
    d, h, mi, s = (int(x or 0) for x in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def _scontrol(*args: str) -> str:
    try:
        out = subprocess.run(
            ["scontrol", *args], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout


def in_allocation(env: Environment, spec: RunSpec, scontrol=_scontrol) -> Environment:
    """Complete a SLURM environment from the controller: the job's nodes (Snakemake's jobstep
    executor drops SLURM_JOB_NODELIST from the job's environment), their NodeAddr for
    rendezvous across nodes, and the job's time left (so the run stops, and is recorded as a
    timeout, before SLURM's time limit kills the job with nothing written), and how often
    SLURM requeued it."""
    if env.mode != "slurm" or not env.job_id:
        return env
    job = scontrol_fields(scontrol("show", "job", "-o", env.job_id))
    nodes = env.nodes or expand_nodelist(job.get("NodeList", ""))
    addrs: tuple[str, ...] = ()
    if spec.nodes > 1 and nodes:
        found = {}
        for line in scontrol("show", "node", "-o", ",".join(nodes)).splitlines():
            f = scontrol_fields(line)
            found[f.get("NodeName")] = f.get("NodeAddr")
        addrs = tuple(found.get(n) or n for n in nodes)
    limit, ran = slurm_seconds(job.get("TimeLimit", "")), slurm_seconds(job.get("RunTime", ""))
    left = limit - ran if limit is not None and ran is not None else None
    restarts = int(job["Restarts"]) if job.get("Restarts", "").isdigit() else None
    return dataclasses.replace(
        env, nodes=nodes, addrs=addrs, time_limit=limit, time_left=left, restarts=restarts
    )


#: Seconds before SLURM's time limit at which a run is stopped, to write its timeout record
#: (the job then ends COMPLETED with that record, instead of TIMEOUT with no output).
SLURM_MARGIN_SECONDS = 30


def deadline(spec: RunSpec, env: Environment) -> tuple[float, str]:
    """(seconds the run may take, why that long): the run's own timeout, or less where the
    SLURM job it runs in ends sooner."""
    own = spec.timeout_minutes * 60
    why = f"timeout: no result after timeout_minutes={spec.timeout_minutes}"
    if env.time_left is not None and env.time_left - SLURM_MARGIN_SECONDS < own:
        limit = env.time_limit or 0
        return max(env.time_left - SLURM_MARGIN_SECONDS, 1.0), (
            f"timeout: SLURM time limit of job {env.job_id} (TimeLimit {limit / 60:g} min, "
            f"sbatch -t / the `runtime` resource) reached before the run finished; stopped "
            f"{SLURM_MARGIN_SECONDS} s before it so that this record could be written"
        )
    return own, why


def slurm_request(
    workers: int,
    nodes: int,
    threads_per_worker: int,
    accelerator: str,
    timeout_minutes: float,
    tasks_per_node: int = 1,
) -> dict[str, int | str]:
    """The snakemake-executor-plugin-slurm resources of any job that starts `workers` processes
    on each of `nodes` nodes: a training run, the all-reduce benchmark of that shape, the
    device probe, a build. The one place SLURM requests are made, so that every rule asks for
    what its command launches.

    torchrun and single-process forms run one task per node holding all of the node's workers
    (cpus_per_task = workers × threads_per_worker); tf-multiworker across nodes runs one task
    per worker (`tasks_per_node`). A multi-node job runs its own `srun`, so it sets `mpi`
    (otherwise the jobstep executor wraps it in `srun -n1` and the inner srun finds one node,
    or waits for CPUs until the time limit). GPUs are requested per node (`gres`), one per
    worker, with `tasks_per_gpu=0` so the plugin does not turn `tasks` into --ntasks-per-gpu.
    `runtime` is the job's own timeout plus start-up slack, so that timeout fires first and is
    recorded.
    """
    res: dict[str, int | str] = {
        "nodes": nodes,
        "tasks": nodes * tasks_per_node,
        "cpus_per_task": threads_per_worker * workers // tasks_per_node,
        "runtime": math.ceil(timeout_minutes) + 5,
    }
    if nodes > 1:
        res["mpi"] = "srun"
        if tasks_per_node > 1:
            res["slurm_extra"] = f"--ntasks-per-node={tasks_per_node}"
    if accelerator == "cuda":
        res["gres"] = f"gpu:{workers}"
        res["tasks_per_gpu"] = 0
    return res


#: Every resource key `slurm_request` may set (rules declare each, None where a job needs none).
SLURM_RESOURCE_KEYS = (
    "nodes",
    "tasks",
    "cpus_per_task",
    "runtime",
    "mpi",
    "gres",
    "tasks_per_gpu",
    "slurm_extra",
)


def slurm_resources(spec: RunSpec, accelerator: str) -> dict[str, int | str]:
    """The SLURM resources of a training run (see `slurm_request`)."""
    return slurm_request(
        spec.workers,
        spec.nodes,
        spec.threads_per_worker,
        accelerator,
        spec.timeout_minutes,
        tasks_per_node(spec),
    )


OOM_PATTERNS = (
    "OutOfMemoryError",  # torch.OutOfMemoryError (CUDA)
    "CUDA out of memory",
    "MemoryError",  # Python/numpy on the host
    "Cannot allocate memory",
    "DefaultCPUAllocator: can't allocate memory",  # PyTorch on the host
    "ResourceExhaustedError",  # TensorFlow: "OOM when allocating tensor"
)


def classify(
    returncode: int | None, tail: str, timed_out: bool, oom_killed: bool | None = None
) -> str:
    """Status of a run that wrote no metrics: timeout, oom or failed.

    `oom_killed`: whether the kernel's OOM killer struck in this run's cgroup meanwhile (None:
    unknown). A SIGKILL counts as out of memory only then, or when that is unknown; otherwise
    something else killed the process (a lost node, an operator, SLURM)."""
    if timed_out:
        return "timeout"
    if any(p in tail for p in OOM_PATTERNS) or oom_killed:
        return "oom"
    if returncode in (-signal.SIGKILL, 137) and oom_killed is None:
        return "oom"
    return "failed"


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's cgroup (cgroup
    v2 memory.events, v1 memory.oom_control), or None where that cannot be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    files = []
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":  # cgroup v2
            files.append(Path("/sys/fs/cgroup") / rel.lstrip("/") / "memory.events")
        elif "memory" in controllers.split(","):  # cgroup v1
            files.append(Path("/sys/fs/cgroup/memory") / rel.lstrip("/") / "memory.oom_control")
            files.append(Path("/sys/fs/cgroup/memory/memory.oom_control"))  # a container's own
    for path in files:
        try:
            for row in path.read_text().splitlines():
                key, _, value = row.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


_EXC_LINE = re.compile(
    r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt)\b(?::.*)?$"
)


_SIGNAL_LINE = re.compile(r"^(?:traceback\s*:\s*)?(Signal \d+ \(SIG\w+\) received by PID \d+)$")
_ROOT_CAUSE = "Root Cause (first observed failure)"
_PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|Read error|Write error|"
    r"Broken pipe|Timed out waiting .* for recv|DistNetworkError|remote worker hanging"
)


def exception_lines(lines: list[str]) -> list[str]:
    """The exception lines (`pkg.SomeError: message`, or a worker's fatal signal) in a run's
    output, the most likely cause first, without torchrun's ChildFailedError wrapper:
    a worker killed by a signal other than SIGTERM/SIGINT (which torchrun itself sends), then
    torchrun's "Root Cause (first observed failure)" section, then the rest in order of
    appearance; a peer's lost connection (gloo's "Connection closed by peer", "Read error")
    comes last, since it is a consequence: which rank notices first is a race."""
    root = next((i for i, line in enumerate(lines) if _ROOT_CAUSE in line), None)
    ordered = lines if root is None else lines[root:] + lines[:root]
    seen: list[str] = []
    for line in ordered:
        text = line.strip()
        sig = _SIGNAL_LINE.match(text)
        if sig:
            text = sig.group(1)
        elif not _EXC_LINE.match(text) or "ChildFailedError" in text:
            continue
        if text not in seen:
            seen.append(text)

    def rank(text: str) -> int:
        if text.startswith("Signal ") and not re.search(r"\(SIG(TERM|INT)\)", text):
            return 0
        return 2 if _PEER_LOST.search(text) else 1

    return sorted(seen, key=rank)  # stable: keeps the order above within each rank


def _pump(stream, sink, tail: collections.deque) -> None:
    for line in iter(stream.readline, ""):
        sink.write(line)
        sink.flush()
        tail.append(line)


def supervise(
    spec: RunSpec, out: Path, env: Environment, grace: float = 10.0, attempt: int = 1
) -> str:
    """Run `spec`, stream its output, enforce its timeout; return the final status. The record
    says which `attempt` at the run this was, and how often SLURM requeued its job."""
    env = in_allocation(env, spec)
    out.unlink(missing_ok=True)  # a requeued job's stale record never stands for this start
    attempts.note(out, restarts=env.restarts or 0)
    if env.mode == "slurm" and spec.nodes > 1 and not env.port:
        env = dataclasses.replace(env, port=free_port())
    limit, timeout_reason = deadline(spec, env)
    argv = command(spec, env, str(out))
    cmdline = shlex.join(argv)
    print(f"trainscale: {spec.path}\ntrainscale: launching: {cmdline}", flush=True)
    start_utc, t0 = metrics.utc_now(), time.perf_counter()
    kills_before = oom_kills()
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

    def cancelled(signum: int) -> None:
        """Under SLURM a SIGTERM means scancel, a preemption or the job's end: record it."""
        if env.mode != "slurm":
            return  # local: Snakemake stops (Ctrl-C) and reruns the job; nothing to record
        name = signal.Signals(signum).name
        attempts.note(out, signal=name, signal_utc=metrics.utc_now())
        state = scontrol_fields(_scontrol("show", "job", "-o", env.job_id or "")).get("JobState")
        error = (
            f"cancelled by SLURM: job {env.job_id} received {name} while the run trained "
            f"(scancel, a preemption or requeue, or an administrator); SLURM state "
            f"{state or 'unknown'}. The run's process group was stopped.\n"
            "--- last lines of the run's output ---\n" + "".join(list(tail)[-30:])
        )
        launch["exit_code"] = proc.returncode
        rec = metrics.failure_record(
            spec.to_dict(), "failed", error, start_utc, time.perf_counter() - t0, launch
        )
        metrics.write(out, stamp(rec, attempt, env))

    _end_with_us(proc, cancelled)
    pump = threading.Thread(target=_pump, args=(proc.stdout, sys.stdout, tail), daemon=True)
    pump.start()
    timed_out = False
    try:
        proc.wait(timeout=limit)
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
            metrics.write(out, stamp(rec, attempt, env))
            return rec["status"]
        except metrics.MetricsError as e:
            tail.append(f"metrics written by the run are invalid: {e}\n")
            out.unlink()
    kills_after = oom_kills()
    oom_killed = None if None in (kills_before, kills_after) else kills_after > kills_before
    status = classify(proc.returncode, "".join(tail), timed_out, oom_killed)
    how = f"exited with code {proc.returncode}"
    if proc.returncode is not None and -proc.returncode in signal.valid_signals():
        how = f"was killed by {signal.Signals(-proc.returncode).name}"
    reason = {
        "timeout": f"{timeout_reason}; the run's process group was killed",
        "oom": "out of memory" + (" (the kernel's OOM killer struck)" if oom_killed else ""),
        "failed": f"the run {how} before writing metrics",
    }[status]
    lines = list(tail)
    exc = exception_lines(lines)
    error = "\n".join([reason, *exc[:3], "--- last lines of the run's output ---"])
    error += "\n" + "".join(lines[-30:])
    rec = metrics.failure_record(
        spec.to_dict(), status, error, start_utc, time.perf_counter() - t0, launch
    )
    metrics.write(out, stamp(rec, attempt, env))
    print(f"trainscale: recorded status {status!r} in {out}", flush=True)
    return status


def stamp(rec: dict, attempt: int, env: Environment) -> dict:
    """What only the supervisor knows, added to a run's record: the attempt it was, and how
    often SLURM requeued its job (null outside SLURM)."""
    rec["env"]["attempts"] = attempt
    rec["env"]["slurm_restarts"] = (env.restarts or 0) if env.mode == "slurm" else None
    return rec


def _end_with_us(proc: subprocess.Popen, before_exit: Callable[[int], None]) -> None:
    """When this supervisor is told to stop (SIGTERM from Snakemake on Ctrl-C or from
    scancel, SIGINT, SIGHUP), stop the run's process group first: it runs in a session of its
    own, so it would otherwise go on training as an orphan. Then `before_exit(signum)` (under
    SLURM it writes the cancellation's record; locally nothing: Snakemake reruns the job)."""

    def stop(signum, _frame) -> None:
        _kill_group(proc, grace=3.0)
        before_exit(signum)
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, stop)


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
    p.add_argument("--out", help="metrics.json to write")
    p.add_argument(
        "--probe",
        action="store_true",
        help="instead of training, print what every task of the run sees (the check target)",
    )
    p.add_argument(
        "--on-failure",
        choices=["record", "stop"],
        default="record",
        help="record: a failed run writes a failure record and the job succeeds; "
        "stop: the record is written and the job fails",
    )
    p.add_argument(
        "--retry-lost-runs",
        type=int,
        default=0,
        help="times to train again after attempts whose SLURM job died without a record "
        "(default 0: write the record from sacct instead)",
    )
    a = p.parse_args(argv)
    spec = RunSpec.from_json(a.spec)
    if a.probe:
        env = in_allocation(detect(), spec)
        return subprocess.run(probe_command(spec, env), env=os.environ).returncode
    if not a.out:
        p.error("--out is required (except with --probe)")
    out, env = Path(a.out), detect()
    status = recorded_from_slurm(spec, out, env, a.retry_lost_runs)
    if status is None:
        entries = attempts.begin(out, env.job_id, metrics.hostname())
        status = supervise(spec, out, env, attempt=len(entries))
        attempts.note(out, ended=True, status=status, ended_utc=metrics.utc_now())
    return 1 if status != "ok" and a.on_failure == "stop" else 0


def recorded_from_slurm(
    spec: RunSpec, out: Path, env: Environment, retry_lost_runs: int, job_end=attempts.job_end
) -> str | None:
    """Where earlier attempts at this run were lost with their SLURM job (see
    trainscale.attempts), write the run's record from sacct and return its status, unless
    `retry_lost_runs` allows training again; None: train."""
    lost = [e for e in attempts.lost_attempts(attempts.load(out)) if e.get("job_id")]
    if not lost or lost[-1]["job_id"] == env.job_id:  # none, or a requeue of this very job
        return None
    end = job_end(lost[-1]["job_id"])
    if end is None or not end.lost:
        why = "sacct does not know it" if end is None else f"sacct says {end.state}"
        print(f"trainscale: earlier attempt's job {lost[-1]['job_id']}: {why}; training")
        return None
    if len(lost) <= retry_lost_runs:
        print(
            f"trainscale: attempt {len(lost)}'s job {end.job_id} ended {end.state} without a "
            f"record; training again (retry_lost_runs={retry_lost_runs})",
            flush=True,
        )
        return None
    rec = attempts.lost_record(spec.to_dict(), end, lost, env.job_id)
    metrics.write(out, rec)
    attempts.note(out, ended=True, status=rec["status"], ended_utc=metrics.utc_now())
    print(f"trainscale: recorded status {rec['status']!r} from sacct: {rec['error']}", flush=True)
    return rec["status"]


if __name__ == "__main__":
    sys.exit(main())
