"""Progress a person can follow while a study runs: a line per finished run (its cell,
status, throughput and how long its job took), how many runs remain, and an estimate of the
time left from the runs so far.

The terminal shows a bounded number of them, whatever the study's size: the first run's, one
per twentieth of the runs planned at the start (STEPS), every failed run's and the last planned
run's. Snakemake's log file keeps every run's line (the others are marked DETAIL, which
`trainscale.launch.terminal` holds back from the terminal), and `--quiet host` shows them all.

It lives in the Snakemake process, as a handler on Snakemake's logger (added by
workflow/rules/common.smk), and reads each run's record when Snakemake reports its job
finished. So it reports alike whether the jobs run on this machine or as SLURM jobs on other
nodes, and it costs the runs nothing: no process beside them, no polling, one small file read
per finished run.

    trainscale: [12/56] ok torch-ddp workers=2 batch_size=64 repeat=1: 5,120 samples/s,
        job 9 s; 44 to go, about 6 min 50 s left

Where a study's `repeats: {min, max}` races, the repeats it adds after the plan count past it:

    trainscale: [56+1] ok tf workers=1 batch_size=256 repeat=2: 46,857 samples/s, job 7 s;
        a repeat the race asked for (repeats: min/max)
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

#: Snakemake's log events this reads (snakemake_interface_logger_plugins.common.LogEvent, a
#: StrEnum: each member equals its value as a string)
RUN_INFO, JOB_INFO, JOB_FINISHED, JOB_ERROR = "run_info", "job_info", "job_finished", "job_error"
#: Lines the terminal shows in a study (besides the first, the failed and the last planned run):
#: one per 1/STEPS of the runs planned at the start, as Snakemake's "N of M steps (5%) done".
STEPS = 20
#: The log record's attribute, true on a line only Snakemake's log file shows (the terminal
#: holds it back under the profiles' quiet setting: trainscale.launch.terminal).
DETAIL = "trainscale_detail"


def duration(seconds: float) -> str:
    """`seconds` as a person reads it: 42 s, 6 min 50 s, 2 h 05 min."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def cell_label(spec: Mapping, keys: list[str]) -> str:
    """The run's strategy and its values of the study's `keys` (those that vary among its runs)."""
    parts = [str(spec.get("strategy", "?"))]
    parts += [f"{k}={spec.get(k)}" for k in keys if k != "strategy"]
    return " ".join(parts)


def varying(runs: list, keys: list[str]) -> list[str]:
    """Of `keys`, those whose value differs among `runs` (RunSpecs): what tells a study's
    cells apart in a progress line."""
    return [
        key
        for key in keys
        if runs and hasattr(runs[0], key) and len({repr(getattr(r, key)) for r in runs}) > 1
    ]


def rate(record: Mapping) -> str:
    """The run's steady throughput as its record has it: tokens/s on token data, else
    samples/s; '-' where it has none (a failed run)."""
    tokens = record.get("tokens_per_second")
    if tokens:
        return f"{tokens:,.0f} tokens/s"
    samples = record.get("throughput")
    return f"{samples:,.0f} samples/s" if samples else "-"


def shown(done: int, total: int | None, failed: bool) -> bool:
    """Whether the line of the `done`-th finished run (of `total` planned, None: not known)
    belongs in the terminal: the first, a failed one, the last planned, and one per
    1/STEPS of `total` (racing repeats past `total` keep that pace; with none planned at the
    start, a resumed race, every line)."""
    if failed or done == 1 or not total or done == total:
        return True
    return done % -(-total // STEPS) == 0


class Progress(logging.Handler):
    """One line, given to `say` with whether it belongs in the terminal (`shown`), per finished
    job of `rule`, read from its record (`record_of`: the record's path from the job's
    wildcards). The count of jobs comes from Snakemake's job stats at the start; the estimate
    is the time since the first of them started, per run finished, times the runs left (so it
    counts the jobs that run side by side)."""

    def __init__(
        self,
        record_of: Callable[[Mapping], str],
        cell_keys: list[str],
        say: Callable[[str, bool], None],
        rule: str = "train",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(level=logging.INFO)
        self.record_of, self.cell_keys, self.rule = record_of, cell_keys, rule
        self.say, self.clock = say, clock
        self.total: int | None = None  # this invocation's jobs of `rule`
        self.started: dict[int, tuple[dict, float]] = {}  # jobid -> (wildcards, start)
        self.first: float | None = None
        self.done = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.handle_event(record)
        except Exception:  # a progress line must never stop a study
            self.handleError(record)

    def handle_event(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        if event == RUN_INFO:
            stats = getattr(record, "stats", None) or {}
            self.total = stats.get(self.rule, self.total)
        elif event == JOB_INFO and getattr(record, "rule_name", None) == self.rule:
            now = self.clock()
            self.first = now if self.first is None else self.first
            self.started[record.jobid] = (dict(record.wildcards or {}), now)
        elif event == JOB_FINISHED and record.job_id in self.started:
            self.finished(record.job_id, failed=False)
        elif event == JOB_ERROR and getattr(record, "jobid", None) in self.started:
            self.finished(record.jobid, failed=True)

    def finished(self, jobid: int, failed: bool) -> None:
        wildcards, start = self.started.pop(jobid)
        now = self.clock()
        self.done += 1
        try:
            rec = json.loads(Path(self.record_of(wildcards)).read_bytes())
        except (OSError, ValueError):
            rec = {}
        status = rec.get("status", "no record")
        if failed:  # the job failed (on_failure: stop, or no record at all)
            status = f"{status}, job failed" if rec else "job failed"
        spec = rec.get("spec")
        cell = cell_label(spec, self.cell_keys) if spec else wildcards.get("run", "?")
        raced = self.total is not None and self.done > self.total  # a repeat past the plan
        count = (
            f"{self.total}+{self.done - self.total}"
            if raced
            else f"{self.done}/{self.total or '?'}"
        )
        line = f"trainscale: [{count}] {status} {cell}: {rate(rec)}, job {duration(now - start)}"
        if raced:
            line += "; a repeat the race asked for (repeats: min/max)"
        elif self.total is not None:
            left = max(self.total - self.done, 0)
            line += f"; {left} to go"
            if left:
                eta = (now - self.first) / self.done * left
                line += f", about {duration(eta)} left"
        self.say(line, shown(self.done, self.total, failed or status != "ok"))


def watch(
    logger: logging.Logger, record_of: Callable[[Mapping], str], cell_keys: list[str]
) -> Progress:
    """Add a Progress handler for the `train` jobs to Snakemake's `logger`; its lines go
    through that logger (no event of their own: this handler passes them by), so they reach
    Snakemake's log file as its own lines do, and the terminal those `shown` (DETAIL false)."""

    def say(line: str, brief: bool) -> None:
        logger.info(line, extra={DETAIL: not brief})

    handler = Progress(record_of, cell_keys, say)
    logger.addHandler(handler)
    return handler
