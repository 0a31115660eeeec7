"""A run's attempts, kept beside its metrics, so that a run whose SLURM job died without
warning still ends with a record.

The supervisor (`trainscale.launch`) notes each attempt in `<run dir>/attempts.json` when it
starts, and closes the note once the run's record is written. A note left open means the
attempt was lost: its job was cancelled (`scancel`), its node failed, SLURM's OOM killer or a
SIGKILL struck the supervisor. Snakemake then deletes whatever the job wrote (it deletes the
outputs of a job it sees fail) and runs the job again: at once where the profile sets
`retries`, else at the next invocation. That attempt finds the open note, asks `sacct` what
became of the lost job, and writes the run's record from SLURM's account of it instead of
training again, unless `retry_lost_runs` still allows a new measurement. The file is not a
Snakemake output, so it outlives the deletion.

A job that SLURM requeues (preemption, `scontrol requeue`, `--requeue` after a node failure)
keeps its job id: its next start is a restart of the same attempt, counted in `restarts`.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainscale.launch.slurm import scontrol_fields
from trainscale.measure import metrics

#: SLURM job states (sacct's first word) that end a job for good, and the run status each one
#: is recorded as when the job wrote no record of its own.
LOST_STATUS = {
    "OUT_OF_MEMORY": "oom",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "CANCELLED": "failed",
    "NODE_FAIL": "failed",
    "FAILED": "failed",
    "BOOT_FAIL": "failed",
    "PREEMPTED": "failed",
    "REVOKED": "failed",
}
#: What each lost state means, for the record's first line.
LOST_WHY = {
    "OUT_OF_MEMORY": "out of memory: SLURM's OOM handling killed the job",
    "TIMEOUT": "timeout: the job reached its SLURM time limit",
    "DEADLINE": "timeout: the job reached its SLURM deadline",
    "CANCELLED": "cancelled by SLURM (scancel, or an administrator)",
    "NODE_FAIL": "node failure: SLURM lost a node of the job",
    "FAILED": "the job failed without a record (its supervisor was killed, e.g. SIGKILL)",
    "BOOT_FAIL": "node failure: a node of the job failed to boot",
    "PREEMPTED": "preempted by SLURM and not requeued",
    "REVOKED": "revoked by SLURM (federation)",
}
#: States of a job that is not over yet (sacct may lag behind a cancellation for a moment).
PENDING_STATES = {
    "PENDING",
    "RUNNING",
    "COMPLETING",
    "CONFIGURING",
    "REQUEUED",
    "RESIZING",
    "SUSPENDED",
    "STAGE_OUT",
    "SIGNALING",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
}


@dataclass(frozen=True)
class JobEnd:
    """SLURM's account of a job (one `sacct -X` row)."""

    job_id: str
    state: str  # as sacct prints it: "CANCELLED by 0", "NODE_FAIL", ...
    exit_code: str  # "rc:signal"
    nodes: str
    elapsed: str

    @property
    def word(self) -> str:
        """The state without sacct's "by <uid>" suffix."""
        return self.state.split()[0] if self.state else ""

    @property
    def lost(self) -> bool:
        return self.word in LOST_STATUS


def ledger_path(out: str | Path) -> Path:
    return Path(out).parent / "attempts.json"


def load(out: str | Path) -> list[dict]:
    """The attempts noted for the run whose metrics go to `out` (oldest first)."""
    try:
        entries = json.loads(ledger_path(out).read_text())["attempts"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return entries if isinstance(entries, list) else []


def save(out: str | Path, entries: list[dict]) -> None:
    """Write the ledger atomically (a SIGKILL mid-write leaves the old one)."""
    path = ledger_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".attempts.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump({"attempts": entries}, f, indent=1)
    os.replace(tmp, path)


def lost_attempts(entries: list[dict]) -> list[dict]:
    """The open notes since the last closed one: attempts that ended without a record."""
    lost: list[dict] = []
    for e in entries:
        lost = [] if e.get("ended") else [*lost, e]
    return lost


def begin(out: str | Path, job_id: str | None, host: str) -> list[dict]:
    """Note this attempt; a start within the same SLURM job as the open note is a restart
    (requeue) of that attempt. Returns the ledger as written."""
    entries = load(out)
    if not entries or entries[-1].get("ended"):
        entries = []  # a new measurement: earlier, finished ones are not its attempts
    last = entries[-1] if entries else None
    if last and job_id and last.get("job_id") == job_id:
        last["restarts"] = last.get("restarts", 0) + 1
        last["started_utc"] = metrics.utc_now()
    else:
        entries.append(
            {"job_id": job_id, "host": host, "started_utc": metrics.utc_now(), "restarts": 0}
        )
    save(out, entries)
    return entries


def note(out: str | Path, **fields) -> None:
    """Add facts to the current attempt (its end, or the signal it received)."""
    entries = load(out)
    if entries:
        entries[-1].update(fields)
        save(out, entries)


def _run(argv: list[str]) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return p.stdout if p.returncode == 0 else ""


def slurm_account(job_id: str) -> str:
    """`JobID|State|ExitCode|NodeList|Elapsed` of a job: from sacct (accounting), else from
    the controller's memory of it (`scontrol show job`, kept MinJobAge seconds after the job
    ended), for clusters without accounting."""
    fields = "JobID,State,ExitCode,NodeList,Elapsed"
    rows = _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", fields])
    if any(r.split("|")[0] == job_id for r in rows.splitlines()):
        return rows
    job = scontrol_fields(_run(["scontrol", "show", "job", "-o", job_id]))
    if job.get("JobId") != job_id:
        return ""
    keys = ("JobId", "JobState", "ExitCode", "NodeList", "RunTime")
    return "|".join(job.get(k, "") for k in keys) + "\n"


def job_end(
    job_id: str,
    sacct: Callable[[str], str] = slurm_account,
    wait: float = 60.0,
    sleep: Callable[[float], None] = time.sleep,
) -> JobEnd | None:
    """SLURM's account of `job_id` once it is over (polling up to `wait` seconds while sacct
    still shows it running: accounting may lag a cancellation), or None where sacct does not
    know the job (no accounting, or purged)."""
    deadline = time.monotonic() + wait
    while True:
        row = next((r for r in sacct(job_id).splitlines() if r.split("|")[0] == job_id), None)
        if row is None:
            return None
        jid, state, code, nodes, elapsed = (row.split("|") + [""] * 5)[:5]
        end = JobEnd(jid, state, code, nodes, elapsed)
        if end.word not in PENDING_STATES or time.monotonic() >= deadline:
            return end
        sleep(2.0)


def lost_record(spec: dict, end: JobEnd, lost: list[dict], job_id: str | None) -> dict:
    """The run's record written from SLURM's account of its lost job: `oom` for
    OUT_OF_MEMORY, `timeout` for TIMEOUT, `failed` otherwise; the error names the state, the
    exit code and the job id, and the attempt's last words where it had time to note them."""
    status = LOST_STATUS[end.word]
    last = lost[-1]
    lines = [
        f"{LOST_WHY[end.word]}: SLURM job {end.job_id} ended {end.state} "
        f"(exit code {end.exit_code}) on {end.nodes or 'no node'} after {end.elapsed}, "
        "before the run wrote its record",
        f"recorded from sacct by the next attempt (SLURM job {job_id or 'local'}) instead of "
        f"training again: {len(lost)} lost attempt(s), retry_lost_runs allows no more",
    ]
    if last.get("signal"):
        lines.append(f"the run's supervisor received {last['signal']} at {last['signal_utc']}")
    if last.get("restarts"):
        lines.append(f"the job had been requeued {last['restarts']} time(s)")
    rec = metrics.failure_record(
        spec,
        status,
        "\n".join(lines),
        last.get("started_utc") or metrics.utc_now(),
        0.0,
        {"command": None, "mode": "slurm", "exit_code": None},
    )
    rec["wall_seconds"] = None
    rec["env"]["slurm_job_id"] = end.job_id
    rec["env"]["hostnames"] = [last.get("host")] if last.get("host") else rec["env"]["hostnames"]
    rec["env"]["rank_hosts"] = []
    rec["env"]["attempts"] = len(lost)
    rec["env"]["slurm_restarts"] = last.get("restarts", 0)
    return rec
