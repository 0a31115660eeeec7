"""Faults caused for real (exceptions, memory caps, hangs, SIGKILL) never lose a result.

Each fault is injected through the config key `faults` (trainscale.runners.common.maybe_fault)
into real multi-process runs, or caused from outside (SIGKILL of a whole job); the tests check
the failure record, that no process of the run is left behind, that other runs' metrics are
intact, and that the report still renders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from test_aggregate import failed_record
from test_runners import make as runners_make

from trainscale.analysis.study import Study
from trainscale.measure import metrics
from trainscale.plan.runspec import Fault

from conftest import (
    PYTHON,
    ROOT,
    SNAKEMAKE,
    launch,
    load_yaml,
    run_env,
    snakemake,
    study_records,
)  # fmt: skip

pytestmark = pytest.mark.slow


def make(strategy: str, workers: int = 1, fault: Fault | None = None, **kw):
    return dataclasses.replace(runners_make(strategy, workers, **kw), fault=fault)


def leftovers(marker: str) -> list[str]:
    """Processes still running whose command line mentions `marker` (a test's tmp path)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if marker in cmd and p.pid != os.getpid():
            found.append(cmd[:200])
    return found


def run_fault(tmp_path: Path, spec, timeout: float = 300) -> tuple[dict, float]:
    out = tmp_path / "metrics.json"
    t = time.perf_counter()
    p = launch(spec, out, timeout=timeout)
    wall = time.perf_counter() - t
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]  # a failure is a result
    rec = metrics.read(out)
    assert rec["spec"] == spec.to_dict()
    assert rec["spec"]["fault"] == dataclasses.asdict(spec.fault)
    time.sleep(1)
    assert not leftovers(str(out)), "processes of the run were left running"
    return rec, wall


@pytest.mark.parametrize("strategy, workers", [("torch", 1), ("torch-ddp", 2)])
def test_allocating_past_a_memory_cap_is_recorded_as_oom(tmp_path, strategy, workers):
    spec = make(strategy, workers, Fault("oom", rank=workers - 1, epoch=1))
    rec, _ = run_fault(tmp_path, spec)
    assert rec["status"] == "oom", rec["error"]
    assert "MemoryError" in rec["error"]


def test_a_hung_collective_is_ended_by_the_timeout_watchdog(tmp_path):
    spec = make("torch-ddp", 2, Fault("hang", rank=1, epoch=1), timeout_minutes=0.3)
    rec, wall = run_fault(tmp_path, spec)
    assert rec["status"] == "timeout"
    assert "timeout_minutes=0.3" in rec["error"]
    assert 18 <= rec["wall_seconds"] < 18 + 15 and wall < 60  # the group was killed promptly


def test_sigkill_while_writing_metrics_never_leaves_a_partial_file(tmp_path):
    """Kill a process that rewrites a large metrics file in a loop, at varied moments, until
    3 kills have landed mid-write (bounded: 30 tries): the file is always absent or whole and
    valid, never partial. A kill mid-write is one that leaves metrics.write's temp file behind
    written partly (never renamed): only such a kill can show a non-atomic write."""
    out = tmp_path / "metrics.json"
    # a valid record (metrics.write validates first: an invalid one is never written at all)
    rec = failed_record(make("torch"), "failed", "x" * 2_000_000)  # ~2 MB: writes take a while
    metrics.validate(rec)
    src = tmp_path / "rec.json"
    src.write_text(json.dumps(rec))
    whole = len(json.dumps(rec, indent=1, sort_keys=True))
    writer = (
        "import json, sys; from trainscale.measure import metrics\n"
        f"r = json.load(open({str(src)!r}))\n"
        "print('ready', flush=True)\n"
        f"while True: metrics.write({str(out)!r}, r)\n"
    )
    mid_write = tries = 0
    while mid_write < 3:
        tries += 1
        assert tries <= 30, f"only {mid_write} of {tries - 1} kills landed during a write"
        p = subprocess.Popen(
            [PYTHON, "-c", writer], cwd=ROOT, env=run_env(), stdout=subprocess.PIPE, text=True
        )
        assert p.stdout.readline() == "ready\n"
        time.sleep(0.05 + 0.037 * tries)  # varied moments within and between writes
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        left = list(tmp_path.glob(".metrics.*.tmp"))
        assert len(left) <= 1, left
        if left:  # killed between the temp file's creation and its rename
            # partly written: the kill landed mid-write; whole (killed in fsync, before the
            # rename) is a kill between writing and renaming, and does not count
            mid_write += left[0].stat().st_size < whole
            left[0].unlink()
        if out.exists():
            assert metrics.read(out)["error"] == rec["error"]
    assert not [f for f in tmp_path.iterdir() if f.name.endswith("metrics.json") and f != out]


def test_killed_workflow_reruns_the_incomplete_run_and_keeps_finished_ones(tmp_path):
    """SIGKILL Snakemake and every process of its running job, as a crashed node would;
    the next `snakemake --rerun-incomplete` redoes only the interrupted run."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "study: crash\nepochs: 3\nrepeats: 2\nmatrix:\n  strategy: [torch]\n"
        "  model: [seed-small]\n  dataset: [digits]\n  scale: [6]\n  exclude: []\n"
    )
    runs = tmp_path / "results" / "crash" / "runs"
    cmd = [SNAKEMAKE, "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path)]
    job = subprocess.Popen(
        [*cmd, "--cores", "1", "--configfile", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline:  # one run done, the other under way
        done = list(runs.rglob("metrics.json"))
        logs = list((tmp_path / "logs" / "crash" / "runs").rglob("*.log"))
        if len(done) == 1 and len(logs) == 2:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the first run did not finish in time")
    time.sleep(1.0)
    victims = [psutil.Process(job.pid), *psutil.Process(job.pid).children(recursive=True)]
    for p in victims:  # the training runs in its own session: kill it explicitly too
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    job.wait()
    first = done[0]
    before = first.stat().st_mtime_ns
    assert len(list(runs.rglob("metrics.json"))) == 1  # no partial file for the killed run

    # The killed run's metrics.json was never created (atomic write), so Snakemake sees it
    # missing and plans exactly that run again; --rerun-incomplete covers the job's other
    # files (its log) should Snakemake have marked them incomplete.
    p = subprocess.run([*cmd, "-n", "--configfile", str(cfg)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert re.search(r"^train\s+1$", p.stdout + p.stderr, re.M), p.stdout + p.stderr
    # A killed Snakemake leaves its lock: the documented first step is --unlock.
    p = subprocess.run([*cmd, "--configfile", str(cfg), "--unlock"], capture_output=True)
    assert p.returncode == 0
    p = subprocess.run(
        [*cmd, "--cores", "1", "--configfile", str(cfg), "--rerun-incomplete"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(list(runs.rglob("metrics.json"))) == 2
    assert first.stat().st_mtime_ns == before  # the finished run was not redone
    study = Study.read(tmp_path / "results" / "crash")
    assert list(study.runs["status"]) == ["ok", "ok"]


def test_fault_study_runs_end_to_end_with_concurrent_jobs(tmp_path):
    """`.test/faults.yaml`: good and deliberately failing 2-worker runs of several frameworks,
    4 jobs at once on this machine (oversubscribed on purpose: --cores 8): no run collides on
    ports or files, every good run is ok, every faulty one recorded, and the report lists them.
    A run whose fault strikes a part after training (evaluation, the memory gather, exposed
    communication, the FLOP count, the framework block) stays ok with that part null. A rank
    that raises fails its run with its own traceback first; a rank SIGKILLed fails its run as
    torchrun reports it; neither leaves the other rank hung, nor any process behind."""
    conf = ROOT / ".test" / "faults.yaml"
    p = snakemake(tmp_path, "--cores", "8", "--keep-going", "--configfile", str(conf))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    cfg = load_yaml(conf)
    res = tmp_path / "results" / cfg["study"]
    study = Study.read(res)
    cell = lambda f: (f["match"]["strategy"], f["match"]["batch_size"])  # noqa: E731
    faulty = {cell(f): f["kind"] for f in cfg["faults"] if not f.get("part")}
    parts = {cell(f): f["part"] for f in cfg["faults"] if f.get("part")}
    expect = {"raise": "failed", "hang": "timeout", "oom": "oom", "kill": "failed"}
    for _, row in study.runs.iterrows():
        kind = faulty.get((row["spec.strategy"], row["spec.batch_size"]))
        assert row["status"] == (expect[kind] if kind else "ok"), (row["run"], row["error"])
    assert (study.runs["status"] == "ok").sum() >= 4
    html = (res / "report.html").read_text()
    for kind in set(faulty.values()):
        assert expect[kind] in html
    assert "injected fault" in html
    # a fault in a part after training: the run is ok, that part null and named, the rest kept
    recs = {(r["spec"]["strategy"], r["spec"]["batch_size"]): r for r, _ in study_records(res)}
    for key, part in parts.items():
        rec = recs[key]
        assert rec["status"] == "ok" and rec["throughput"] > 0 and len(rec["epochs"]) == 2, key
        assert [w["part"] for w in rec["warnings"]] == [part], key
        assert "injected fault: the " + part in rec["warnings"][0]["error"]
        assert (rec["test"]["accuracy"] is None) == (part == "evaluation"), key
        assert (rec["memory"]["peak_host_rss_bytes"] is None) == (part == "memory"), key
        assert (rec["flops"]["per_sample"] is None) == (part == "flops"), key
        exposed = (rec.get("communication") or {}).get("exposed_seconds_per_step")
        if part == "communication":
            assert exposed is None and rec["communication"]["method"] is None
        elif key[0] == "torch-ddp":
            assert exposed is not None, key
    raised, killed = recs[("torch-ddp", 256)], recs[("torch-ddp", 128)]
    # the root cause comes first, before rank 0's "connection closed by peer"
    assert raised["error"].splitlines()[1] == (
        "RuntimeError: injected fault: rank 1 raised in epoch 2"
    )
    # torchrun reports the worker's SIGKILL and ends the other rank; no OOM killer was involved
    assert killed["error"].splitlines()[1].startswith("Signal 9 (SIGKILL) received by PID")
    assert raised["wall_seconds"] < 120 and killed["wall_seconds"] < 120  # no rank hung
    assert raised["warnings"] == []  # a failed run has no part warnings
    time.sleep(1)
    assert not leftovers(str(tmp_path)), "processes of the study's runs were left running"
    assert "Failed parts of runs that trained" in html
    summary = (res / "summary.txt").read_text()
    assert all(f": {part}: RuntimeError: injected fault" in summary for part in parts.values())


def test_a_stopped_supervisor_stops_its_run(tmp_path):
    """SIGTERM to the supervisor (Snakemake on Ctrl-C, scancel) ends the run's process group,
    which lives in a session of its own, instead of leaving it training as an orphan."""
    out = tmp_path / "metrics.json"
    spec = make("torch-ddp", 2, Fault("hang", rank=1, epoch=1))
    p = subprocess.Popen(
        [PYTHON, "-m", "trainscale.launch", "--spec", spec.to_json(), "--out", str(out)],
        cwd=ROOT,
        env=run_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and len(leftovers(str(out))) < 3:  # launcher + 2 ranks
        time.sleep(0.5)
    assert len(leftovers(str(out))) >= 3
    time.sleep(2)
    p.terminate()
    assert p.wait(timeout=60) == 128 + signal.SIGTERM
    time.sleep(1)
    assert not leftovers(str(out)) and not out.exists()
