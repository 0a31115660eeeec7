"""Launch one run with its framework's own launcher, watch it, and make sure a record exists.

`main` is the supervisor the Snakemake rule calls (`python -m trainscale.launch`): it runs the
run's command line (trainscale.launch.commands) in its own process group under the run's
timeout, or less where its SLURM job ends sooner (trainscale.launch.slurm), and, if the run ended
without writing metrics (crash, OOM, timeout), writes a failure record in its place, so one bad
cell never hides the rest of the matrix. This module is also the launch interface the rules and
benchmarks import: it re-exports the command-line and SLURM names.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trainscale.launch import attempts, container, node_record
from trainscale.launch.commands import (
    LAUNCHER_FORMS,
    LAUNCHERS,
    TF_ENV,
    Environment,
    command,
    horovodrun,
    in_image,
    job_environment,
    probe_command,
    single_process,
    srun,
    tasks_per_node,
    tfrun,
    torchrun,
    worker_env,
)
from trainscale.launch.slurm import (
    SLURM_MARGIN_SECONDS,
    SLURM_RESOURCE_KEYS,
    _scontrol,
    deadline,
    detect,
    expand_nodelist,
    in_allocation,
    scontrol_fields,
    slurm_request,
    slurm_resources,
    slurm_seconds,
)
from trainscale.measure import metrics, nccl_log, variables
from trainscale.measure.timeline import process_start_unix
from trainscale.plan.preflight import memory
from trainscale.plan.runspec import RunSpec

__all__ = [
    "LAUNCHERS",
    "LAUNCHER_FORMS",
    "OOM_PATTERNS",
    "SLURM_MARGIN_SECONDS",
    "SLURM_RESOURCE_KEYS",
    "TF_ENV",
    "Environment",
    "classify",
    "command",
    "deadline",
    "detect",
    "exception_lines",
    "expand_nodelist",
    "free_port",
    "horovodrun",
    "in_allocation",
    "in_image",
    "job_environment",
    "main",
    "oom_kills",
    "probe_command",
    "recorded_from_slurm",
    "scontrol_fields",
    "single_process",
    "slurm_request",
    "slurm_resources",
    "slurm_seconds",
    "srun",
    "stamp",
    "supervise",
    "tasks_per_node",
    "tfrun",
    "torchrun",
    "worker_env",
]


def free_port() -> int:
    """A TCP port free on this host right now (for rendezvous hosts other hosts must reach)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


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


def _pump(stream, sink, tail: collections.deque, nccl: nccl_log.Transports) -> None:
    for line in iter(stream.readline, ""):
        sink.write(line)
        sink.flush()
        tail.append(line)
        nccl.see(line)


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
    image = container.describe(env.container, env.cache_dir)  # hashed before the run starts
    # what the ranks were given, for a record the run could not write itself
    given = variables.seen({**os.environ, **dict(env.variables), **worker_env(spec, env)})
    cmdline = shlex.join(argv)
    print(f"trainscale: {spec.path}\ntrainscale: launching: {cmdline}", flush=True)
    node_record.save_topology(out)
    nccl = nccl_log.Transports()  # NCCL's channel lines in every rank's output
    start_utc, t0 = metrics.utc_now(), time.perf_counter()
    #: the supervisor's moments in the record's timeline (trainscale.measure.timeline)
    times = {"supervisor_start_unix": process_start_unix(), "launched_unix": time.time()}
    kills_before = oom_kills()
    launch = {"command": cmdline, "mode": env.mode, "exit_code": None}
    child_env = {**node_record.nccl_debug(spec.accelerator, dict(os.environ)), **os.environ}
    child_env.update(TRAINSCALE_LAUNCH=json.dumps(launch), PYTHONUNBUFFERED="1")
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
        rec = node_record.stamp(rec, nccl.answer)
        metrics.write(out, stamp(rec, spec, attempt, env, image, given, times))

    _end_with_us(proc, cancelled)
    pump = threading.Thread(target=_pump, args=(proc.stdout, sys.stdout, tail, nccl), daemon=True)
    pump.start()
    timed_out = outlived(proc, limit)
    if timed_out:
        _kill_group(proc, grace)
    times["exited_unix"] = time.time()
    pump.join(timeout=5)
    launch["exit_code"] = proc.returncode
    if out.exists():
        try:
            times["written_unix"] = out.stat().st_mtime
            rec = metrics.read(out)
            if proc.returncode:
                print(
                    f"trainscale: exit code {proc.returncode} after metrics were written "
                    f"(status {rec['status']} kept)",
                    flush=True,
                )
            rec = node_record.stamp(rec, nccl.answer)
            metrics.write(out, stamp(rec, spec, attempt, env, image, times=times))
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
    rec = node_record.stamp(rec, nccl.answer)
    metrics.write(out, stamp(rec, spec, attempt, env, image, given, times))
    print(f"trainscale: recorded status {status!r} in {out}", flush=True)
    return status


def stamp(
    rec: dict,
    spec: RunSpec,
    attempt: int,
    env: Environment,
    image: dict | None = None,
    given: dict[str, str] | None = None,
    times: dict | None = None,
) -> dict:
    """What only the supervisor knows, added to `spec`'s record: the attempt it was, how often
    SLURM requeued its job (null outside SLURM), the memory the planner predicted, the
    container the run entered (`image`: launch.container.describe), for a record written in
    the run's place the variables its ranks were `given`, and its moments in the record's
    `timeline` (`times`)."""
    rec["env"]["container"] = image
    if given is not None:
        rec["env"]["variables"] = given
    if times:
        rec["timeline"] = {**rec.get("timeline", {}), **times}
    rec["env"]["attempts"] = attempt
    rec["env"]["slurm_restarts"] = (env.restarts or 0) if env.mode == "slurm" else None
    predicted = memory.recorded(spec)
    if predicted is not None:  # the planner's prediction (config memory:), beside the peaks
        rec["memory"]["predicted"] = predicted
    return rec


def outlived(proc: subprocess.Popen, limit: float) -> bool:
    """Wait for `proc` to end; True if it is still running after `limit` seconds.

    Where Linux gives a pidfd this sleeps in one select() until the run ends or the limit
    passes. Popen.wait(timeout) instead wakes every 50 ms to poll, and on a CPU study each
    wake-up takes a core from one of the worker's compute threads, which the others then wait
    for at their next barrier: the supervisor's polling alone cost the run involuntary context
    switches while it trained (docs/performance.md, "Against nanoGPT's own benchmark")."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux 5.3+: poll as Popen does
        try:
            proc.wait(timeout=limit)
            return False
        except subprocess.TimeoutExpired:
            return True
    try:
        ready, _, _ = select.select([fd], [], [], limit)
    finally:
        os.close(fd)
    if not ready:
        return True
    proc.wait()  # it has ended: this reaps it at once
    return False


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
    trainscale.launch.attempts), write the run's record from sacct and return its status, unless
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
    rec["env"]["container"] = container.describe(env.container, env.cache_dir)
    metrics.write(out, rec)
    attempts.note(out, ended=True, status=rec["status"], ended_utc=metrics.utc_now())
    print(f"trainscale: recorded status {rec['status']!r} from sacct: {rec['error']}", flush=True)
    return rec["status"]


if __name__ == "__main__":
    sys.exit(main())
