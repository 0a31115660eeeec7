"""A run's attempts (trainscale.launch.attempts): what a lost SLURM job leaves, and what the next
attempt writes from sacct. The real cluster cases are in tests/test_slurm.py; here the ledger
and the decisions, with sacct's answers as SLURM prints them."""

import json

import pytest

from trainscale.launch import attempts
from trainscale.launch import supervise as launch
from trainscale.launch.supervise import Environment
from trainscale.measure import metrics
from trainscale.plan.matrix import build_runs

from conftest import base_config


def spec():
    runs, _ = build_runs(base_config(strategy=["torch-ddp"], workers=[2]))
    return runs[0]


def sacct_says(state: str, code: str = "0:15", job: str = "41"):
    return lambda job_id: f"{job}|{state}|{code}|n2|00:00:31\n" if job_id == job else ""


def test_sacct_states_with_their_suffix_are_recognised():
    """sacct prints "CANCELLED by 0": the first word is the state (the SLURM plugin's exact
    comparison misses it, which is why profiles/slurm watches squeue)."""
    end = attempts.job_end("41", sacct=sacct_says("CANCELLED by 0"), wait=0)
    assert end.word == "CANCELLED" and end.lost and end.exit_code == "0:15"
    assert attempts.job_end("9", sacct=sacct_says("CANCELLED by 0"), wait=0) is None
    assert not attempts.job_end("41", sacct=sacct_says("COMPLETED", "0:0"), wait=0).lost


def test_job_end_waits_while_accounting_still_shows_the_job_running():
    answers = iter(["RUNNING", "COMPLETING", "NODE_FAIL"])
    slept = []

    def sacct(job_id):
        return f"41|{next(answers)}|0:0|n1|00:01:00\n"

    end = attempts.job_end("41", sacct=sacct, wait=60, sleep=slept.append)
    assert end.state == "NODE_FAIL" and len(slept) == 2


def test_ledger_counts_lost_attempts_and_requeues(tmp_path):
    out = tmp_path / "run" / "metrics.json"
    attempts.begin(out, "40", "n1")  # lost: never closed
    assert [e["job_id"] for e in attempts.lost_attempts(attempts.load(out))] == ["40"]
    entries = attempts.begin(out, "41", "n2")  # the retry
    assert len(entries) == 2
    entries = attempts.begin(out, "41", "n2")  # SLURM requeued job 41: the same attempt
    assert len(entries) == 2 and entries[-1]["restarts"] == 1
    attempts.note(out, ended=True, status="ok")
    assert attempts.lost_attempts(attempts.load(out)) == []
    assert len(attempts.begin(out, "50", "n1")) == 1  # a new measurement starts afresh


@pytest.mark.parametrize(
    ("state", "status", "words"),
    [
        ("CANCELLED by 0", "failed", "cancelled by SLURM"),
        ("NODE_FAIL", "failed", "node failure"),
        ("OUT_OF_MEMORY", "oom", "out of memory"),
        ("TIMEOUT", "timeout", "timeout"),
        ("FAILED", "failed", "without a record"),
    ],
)
def test_a_lost_job_is_recorded_from_sacct_instead_of_training(tmp_path, state, status, words):
    out = tmp_path / "metrics.json"
    attempts.begin(out, "41", "n2")
    attempts.note(out, signal="SIGTERM", signal_utc="2026-01-01T00:00:00Z")
    env = Environment(mode="slurm", job_id="42")
    got = launch.recorded_from_slurm(
        spec(), out, env, 0, job_end=lambda j: attempts.job_end(j, sacct_says(state), wait=0)
    )
    assert got == status
    rec = metrics.read(out)
    assert rec["status"] == status and rec["env"]["attempts"] == 1
    first = rec["error"].splitlines()[0]
    assert words in first and f"SLURM job 41 ended {state} (exit code 0:15)" in first
    assert "received SIGTERM" in rec["error"] and rec["env"]["slurm_job_id"] == "41"
    assert attempts.lost_attempts(attempts.load(out)) == []  # closed: a rerun trains again


def test_retry_lost_runs_trains_again_until_its_budget_is_spent(tmp_path):
    out = tmp_path / "metrics.json"
    attempts.begin(out, "41", "n2")
    env = Environment(mode="slurm", job_id="42")
    end = lambda j: attempts.job_end(j, sacct_says("NODE_FAIL", job=j), wait=0)  # noqa: E731
    assert launch.recorded_from_slurm(spec(), out, env, 1, job_end=end) is None
    attempts.begin(out, "42", "n1")  # lost too
    env = Environment(mode="slurm", job_id="43")
    assert launch.recorded_from_slurm(spec(), out, env, 1, job_end=end) == "failed"
    rec = metrics.read(out)
    assert rec["env"]["attempts"] == 2 and "2 lost attempt(s)" in rec["error"]


def test_no_record_from_sacct_where_nothing_was_lost(tmp_path):
    out = tmp_path / "metrics.json"
    env = Environment(mode="slurm", job_id="42")
    never = lambda j: pytest.fail("sacct asked")  # noqa: E731
    assert launch.recorded_from_slurm(spec(), out, env, 0, job_end=never) is None
    attempts.begin(out, None, "host")  # a local attempt killed with Snakemake: rerun it
    assert launch.recorded_from_slurm(spec(), out, env, 0, job_end=never) is None
    attempts.begin(out, "42", "n1")  # this very job, requeued
    assert launch.recorded_from_slurm(spec(), out, env, 0, job_end=never) is None
    # a job sacct calls COMPLETED, or does not know, left no record: train again
    for answer in ("COMPLETED", None):
        sacct = sacct_says(answer, job="42") if answer else (lambda j: "")
        end = lambda j, s=sacct: attempts.job_end(j, s, wait=0)  # noqa: E731
        other = Environment(mode="slurm", job_id="43")
        assert launch.recorded_from_slurm(spec(), out, other, 0, job_end=end) is None
    assert not out.exists()


def test_ledger_is_json_beside_the_metrics(tmp_path):
    out = tmp_path / "metrics.json"
    attempts.begin(out, "7", "n1")
    data = json.loads((tmp_path / "attempts.json").read_text())
    assert data["attempts"][0]["job_id"] == "7"


def test_without_accounting_the_controller_is_asked(monkeypatch):
    """Clusters without slurmdbd: sacct knows nothing, `scontrol show job` still does for
    MinJobAge seconds after the job ended."""
    line = (
        "JobId=41 JobName=x UserId=root(0) JobState=CANCELLED Reason=None ExitCode=0:15 "
        "RunTime=00:00:31 TimeLimit=00:15:00 NodeList=n2 BatchHost=n2\n"
    )
    answers = {"sacct": "", "scontrol": line}
    monkeypatch.setattr(attempts, "_run", lambda argv: answers[argv[0]])
    end = attempts.job_end("41", wait=0)
    assert (end.state, end.exit_code, end.nodes, end.elapsed) == (
        "CANCELLED",
        "0:15",
        "n2",
        "00:00:31",
    )
    assert end.lost
    answers["scontrol"] = ""
    assert attempts.job_end("41", wait=0) is None
