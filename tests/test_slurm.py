"""SLURM for real: `snakemake --profile profiles/slurm` through snakemake-executor-plugin-slurm
on the 2-node cluster of scripts/local-slurm.sh (two slurmd daemons on this host, fake GPUs,
slurmdbd accounting so that the plugin's sacct status checks work).

The cluster needs root (slurmd runs jobs as their users) and Debian's slurm-wlm, munge,
slurmdbd and mariadb-server (.ci/run installs them; the script does where they are missing).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from trainscale.measure import metrics

from conftest import ROOT, SNAKEMAKE

SCRIPT = ROOT / "scripts" / "local-slurm.sh"
STUDY = ROOT / ".test" / "slurm.yaml"
#: the SLURM time limit (minutes) a long run is given, and meets (a study of its own: the limit
#: is the train rule's, every run of a study's; one beside it, tf-multiworker across 2 nodes,
#: met a limit of 1 minute on CI, with other tests training beside it)
RUNTIME = 1
#: seconds between the plugin's sacct checks (its default is 40: too slow for a test)
FAST = ["--slurm-init-seconds-before-status-checks", "2"]


def profile_run(workdir: Path, *args: str, env: dict | None = None, timeout: float = 900):
    """snakemake from the repository root (where `--profile profiles/slurm` resolves) on the
    workflow, its files in `workdir`."""
    return subprocess.run(
        [SNAKEMAKE, "--directory", str(workdir), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_profile_spellings_dry_run_the_default_matrix(tmp_path):
    """`--profile profiles/slurm` from the repo root, and `--profile slurm` once
    `make slurm-profile` has installed it in the user's config dir (here a temporary one)."""
    default = ["--configfile", str(ROOT / "config.yaml")]
    p = profile_run(tmp_path / "w1", "-n", "--profile", "profiles/slurm", *default)
    assert p.returncode == 0, p.stderr
    assert "Using profiles profiles/slurm and workflow specific profile" in p.stderr
    assert "train " in p.stdout and "trainscale: study 'showcase'" in p.stderr

    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    m = subprocess.run(["make", "slurm-profile"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert m.returncode == 0, m.stderr
    installed = tmp_path / "config" / "snakemake" / "slurm" / "config.yaml"
    assert installed.read_text() == (ROOT / "profiles" / "slurm" / "config.yaml").read_text()
    p = profile_run(tmp_path / "w2", "-n", "--profile", "slurm", *default, env=env)
    assert p.returncode == 0, p.stderr
    assert "Using profiles slurm and workflow specific profile" in p.stderr
    assert "train " in p.stdout


def local_cluster(taskplugin: str = "task/none"):
    """The local 2-node cluster, started with `taskplugin` (scripts/local-slurm.sh's
    TASKPLUGIN) and always stopped afterwards: a generator for a module's fixture."""
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (slurmd starts jobs as their users)")
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        pytest.skip("no SLURM packages and no apt-get to install Debian's slurm-wlm")
    # the suite points SLURM clients at a controller that refuses at once (conftest): the
    # cluster's clients read its /etc/slurm/slurm.conf, Snakemake's jobstep srun included
    offline = os.environ.pop("SLURM_CONF", None)
    environ = {**os.environ, "TASKPLUGIN": taskplugin}
    try:
        t0 = time.perf_counter()
        p = subprocess.run(
            [str(SCRIPT), "start"], capture_output=True, text=True, timeout=900, env=environ
        )
        if p.returncode and "apt-get" in p.stderr and not shutil.which("slurmctld"):
            pytest.skip(f"Debian's SLURM packages cannot be installed here: {p.stderr[-500:]}")
        try:
            assert p.returncode == 0, p.stdout + p.stderr
            print(f"local SLURM ({taskplugin}) up in {time.perf_counter() - t0:.1f} s")
            yield
        finally:
            subprocess.run([str(SCRIPT), "stop"], capture_output=True, text=True, timeout=120)
    finally:
        if offline is not None:
            os.environ["SLURM_CONF"] = offline


@pytest.fixture(scope="module")
def cluster():
    """The local 2-node cluster for this module's tests; always stopped afterwards."""
    yield from local_cluster()


def sacct_states(job_ids: list[str]) -> dict[str, str]:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("|", 1) for line in out.split())


def test_study_runs_through_slurm_across_two_nodes(cluster, tmp_path):
    """The study's default target (runs, tables, all-reduce benchmarks, figures, report) on
    1 and 2 nodes through the profile."""
    t0 = time.perf_counter()
    p = profile_run(tmp_path, "--profile", "profiles/slurm", "--configfile", str(STUDY), *FAST)
    print(f"study through SLURM: {time.perf_counter() - t0:.1f} s")
    assert p.returncode == 0, p.stderr[-5000:]
    res = tmp_path / "results" / "ci-slurm"
    assert (res / "report.html").stat().st_size > 0 and (res / "figures").is_dir()

    # the all-reduce benchmark of each multi-worker shape ran as a SLURM job of that shape:
    # across 2 nodes its ranks sat on n1 and n2. The study asks for GPUs (accelerator: cuda),
    # so it is the nccl benchmark, which the fake-GPU nodes cannot run: it is recorded as such
    # with the reason, and the report says so instead of stopping without one.
    coll = {
        (r["workers"], r["nodes"]): r
        for r in map(lambda f: json.loads(f.read_text()), (res / "collectives").rglob("*.json"))
    }
    assert sorted(coll) == [(1, 2), (2, 1)], sorted(coll)
    assert sorted(coll[(1, 2)]["rank_hosts"]) == ["n1", "n2"], coll[(1, 2)]
    assert all(c["backend"] == "nccl" and c["status"] == "failed" for c in coll.values())
    assert "nccl needs a GPU for every rank" in coll[(1, 2)]["error"]
    html = (res / "report.html").read_text()
    assert "could not run" in html and "nccl needs a GPU for every rank" in html
    runs = {}
    for f in (tmp_path / "results" / "ci-slurm" / "runs").rglob("metrics.json"):
        rec = metrics.read(f)
        s = rec["spec"]
        runs[(s["strategy"], s["workers"], s["nodes"])] = rec
    assert len(runs) == 5, sorted(runs)

    # every run was a SLURM job, and the ok ones' jobs ended COMPLETED in SLURM's accounting
    ok = [r for r in runs.values() if r["status"] == "ok"]
    assert {(r["spec"]["strategy"], r["spec"]["nodes"]) for r in ok} == {
        ("torch", 1),
        ("torch-ddp", 1),
        ("torch-ddp", 2),
        ("tf-multiworker", 2),
    }, {k: r["error"] for k, r in runs.items()}
    ids = [r["env"]["slurm_job_id"] for r in runs.values()]
    assert all(ids) and len(set(ids)) == 5
    assert all(r["env"]["attempts"] == 1 and r["env"]["slurm_restarts"] == 0 for r in ok)
    states = sacct_states(ids)
    assert all(states[r["env"]["slurm_job_id"]] == "COMPLETED" for r in ok), states

    # across 2 nodes, the ranks really ran on two slurmd nodes; on one node, on one
    for strategy in ("torch-ddp", "tf-multiworker"):
        two = runs[(strategy, 1, 2)]
        # (which node gets rank 0 is the rendezvous' choice: torchrun's c10d may pick either)
        assert sorted(two["env"]["rank_hosts"]) == ["n1", "n2"], two["env"]
        assert two["env"]["hostnames"] == ["n1", "n2"]
        assert two["env"]["slurm_nodelist"] == "n[1-2]"
        assert two["spec"]["world_size"] == 2 and two["throughput"] > 0
    one = runs[("torch-ddp", 2, 1)]
    assert len(one["env"]["rank_hosts"]) == 2 and len(set(one["env"]["rank_hosts"])) == 1

    # a run that fails is recorded as such with the reason, and the rest of the study
    # completed around it
    failed = runs[("torch-dp", 2, 1)]
    assert failed["status"] == "failed" and "needs 2 GPUs, found 0" in failed["error"]
    with open(tmp_path / "results" / "ci-slurm" / "runs.csv") as f:
        table = list(csv.DictReader(f))
    assert sorted(r["status"] for r in table) == ["failed", "ok", "ok", "ok", "ok"]
    summary = (tmp_path / "results" / "ci-slurm" / "summary.txt").read_text()
    assert "[failed]" in summary


def test_check_target_shows_what_every_task_sees(cluster, tmp_path):
    p = profile_run(
        tmp_path, "--profile", "profiles/slurm", "--configfile", str(STUDY), *FAST, "check"
    )
    assert p.returncode == 0, p.stderr[-5000:]
    probes = {
        str(f.relative_to(tmp_path / "results" / "ci-slurm" / "check")): f.read_text()
        for f in (tmp_path / "results" / "ci-slurm" / "check").rglob("*.txt")
    }
    # one probe per allocation shape: 1 node × 1 GPU, 1 node × 2 GPUs, 2 nodes × 1 task/GPU
    assert len(probes) == 3, probes
    two = [t for path, t in probes.items() if "/nodes~2/" in path]
    assert len(two) == 1, probes
    # one line per task, each on its own node, each seeing the one GPU SLURM allocated it
    lines = sorted(two[0].splitlines())
    assert [line.split(":")[0] for line in lines] == ["task 0/2 on n1", "task 1/2 on n2"], lines
    assert all(re.search(r"CUDA_VISIBLE_DEVICES=\d+ ", line) for line in lines), lines
    pair = [t for path, t in probes.items() if "/workers~2/" in path]
    assert pair[0].startswith("task 0/1 on n"), probes
    assert re.search(r"CUDA_VISIBLE_DEVICES=\d+,\d+ ", pair[0]), probes
    # and what the software sees: no NVIDIA driver on this machine, so torch counts none
    assert all("torch: 0 cuda device(s)" in t for t in probes.values()), probes


#: one long run per repeat (digits × 5000 at one worker trains for many minutes): the tests
#: below end it from outside while it trains
LONG = """
study: {study}
epochs: 2
repeats: {repeats}
timeout_minutes: 10
accelerator: cpu
collectives: {{enabled: false}}
matrix:
  strategy: [torch]
  model: [seed-small]
  dataset: [digits]
  scale: [5000]
  batch_size: [64]
  workers: [1]
  nodes: [1]
  exclude: []
"""


def supervisors(workdir: Path) -> dict[int, tuple[int, str]]:
    """repeat -> (pid, SLURM job id) of each run supervisor now training in `workdir`."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"trainscale.launch" not in argv or Path(os.readlink(proc / "cwd")) != workdir:
                continue
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        spec = json.loads(argv[argv.index(b"--spec") + 1])
        job = next(v.split(b"=", 1)[1] for v in environ if v.startswith(b"SLURM_JOB_ID="))
        found[spec["repeat"]] = (int(proc.name), job.decode())
    return found


def leftovers(workdir: Path) -> list[tuple[int, str]]:
    """(pid, command) of every process still running in `workdir`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")) == workdir:
                found.append((int(proc.name), (proc / "cmdline").read_text().replace("\0", " ")))
        except OSError:
            continue
    return found


def wait_for(what, timeout: float = 180.0, every: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = what()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def start_study(workdir: Path, study: str, repeats: int, *args: str) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "study.yaml"
    cfg.write_text(LONG.format(study=study, repeats=repeats))
    cmd = [SNAKEMAKE, "--directory", str(workdir), "--profile", "profiles/slurm"]
    cmd += ["--configfile", str(cfg), *FAST, *args]
    log = open(workdir / "snakemake.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)


def queued() -> list[str]:
    """Ids of the jobs SLURM has pending or running."""
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    return out.split()


def records(workdir: Path, study: str) -> dict[int, dict]:
    return {
        metrics.read(f)["spec"]["repeat"]: metrics.read(f)
        for f in (workdir / "results" / study / "runs").rglob("metrics.json")
    }


def closed(workdir: Path, study: str, repeat: int) -> bool:
    """The run's attempts ledger says its record was written (by the retry, from sacct)."""
    for f in (workdir / "results" / study / "runs").rglob(f"repeat~{repeat}/attempts.json"):
        entries = json.loads(f.read_text())["attempts"]
        return bool(entries and entries[-1].get("ended"))
    return False


def test_runs_cancelled_or_lost_with_their_node_are_recorded_and_the_report_built(
    cluster, tmp_path
):
    """scancel of a running train job, and its node set DOWN under another: Snakemake notices
    both (squeue states), the profile's retry writes each run's record from sacct, and the
    study ends with its tables and report listing them as failed."""
    work = tmp_path / "w"
    p = start_study(work, "ci-lost", 2, "--set-resources", "train:slurm_extra='--no-requeue'")
    down = None
    try:
        sup = wait_for(lambda: (s := supervisors(work)) and len(s) == 2 and s)
        time.sleep(3)  # both are training
        subprocess.run(["scancel", sup[0][1]], check=True)
        wait_for(lambda: closed(work, "ci-lost", 0))  # the retry recorded it, and its job
        wait_for(lambda: queued() == [sup[1][1]])  # is gone: only the other run's job is left
        node = subprocess.run(
            ["squeue", "-h", "-j", sup[1][1], "-o", "%N"], capture_output=True, text=True
        ).stdout.strip()
        assert node in ("n1", "n2"), node
        down = node
        subprocess.run(
            ["scontrol", "update", f"nodename={node}", "state=DOWN", "reason=trainscale-test"],
            check=True,
        )
        assert p.wait(timeout=300) == 0, (work / "snakemake.log").read_text()[-5000:]
    finally:
        if p.poll() is None:
            p.terminate()
            p.wait(timeout=60)
        if down:
            subprocess.run(["scontrol", "update", f"nodename={down}", "state=RESUME"])
            # a node "lost" on this host keeps the lost job's batch process (the jobstep
            # Snakemake, waiting for files that never come): end it as a lost node would
            for proc, _ in leftovers(work):
                os.kill(proc, signal.SIGKILL)
    recs = records(work, "ci-lost")
    cancelled, lost = recs[0], recs[1]
    assert cancelled["status"] == "failed", cancelled["error"]
    first = cancelled["error"].splitlines()[0]
    assert "cancelled by SLURM" in first and f"SLURM job {sup[0][1]} ended CANCELLED" in first
    assert "received SIGTERM" in cancelled["error"]  # its supervisor noted the signal
    assert lost["status"] == "failed", lost["error"]
    assert (
        f"node failure: SLURM lost a node of the job: SLURM job {sup[1][1]} ended NODE_FAIL"
        in (lost["error"])
    )
    assert all(r["env"]["attempts"] == 1 for r in recs.values())
    html = (work / "results" / "ci-lost" / "report.html").read_text()
    assert "cancelled by SLURM" in html and "NODE_FAIL" in html


def test_a_run_whose_supervisor_was_killed_is_recorded_from_sacct_next_time(cluster, tmp_path):
    """A SIGKILL of the supervisor and its run (as SLURM's OOM kill or a dying node leaves
    them): the job fails with nothing written, Snakemake removes nothing of value; the next
    invocation asks sacct about the lost job and writes the record instead of training."""
    work = tmp_path / "w"
    p = start_study(work, "ci-killed", 1, "--retries", "0")
    try:
        (pid, job) = wait_for(lambda: supervisors(work).get(0))
        time.sleep(3)
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        for child in children:  # the run's process group (its own session), then the supervisor
            os.killpg(child, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
        assert p.wait(timeout=300) != 0  # the job failed: no record, no report yet
    finally:
        if p.poll() is None:
            p.terminate()
            p.wait(timeout=60)
    assert records(work, "ci-killed") == {}
    assert wait_for(lambda: sacct_states([job]).get(job) == "FAILED", timeout=60)

    again = profile_run(
        work, "--profile", "profiles/slurm", "--configfile", str(work / "study.yaml"), *FAST
    )
    assert again.returncode == 0, again.stderr[-5000:]
    rec = records(work, "ci-killed")[0]
    assert rec["status"] == "failed"
    assert f"SLURM job {job} ended FAILED" in rec["error"].splitlines()[0], rec["error"]
    log = next((work / "logs" / "ci-killed" / "runs").rglob("*.log")).read_text()
    assert "recorded status 'failed' from sacct" in log and "launching" not in log, log
    assert (work / "results" / "ci-killed" / "report.html").exists()


def test_a_run_that_meets_its_slurm_time_limit_is_recorded_as_a_timeout(cluster, tmp_path):
    """A long run given a SLURM time limit of RUNTIME minutes: SLURM ends its job, the
    record says so with the limit, and the study's tables and report are made around it."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "study.yaml").write_text(LONG.format(study="ci-timeout", repeats=1))
    p = profile_run(work, "--profile", "profiles/slurm", "--configfile", str(work / "study.yaml"),
                    "--set-resources", f"train:runtime={RUNTIME}", *FAST)  # fmt: skip
    assert p.returncode == 0, p.stderr[-5000:]
    timeout = records(work, "ci-timeout")[0]
    assert timeout["status"] == "timeout", timeout["error"]
    assert f"SLURM time limit of job {timeout['env']['slurm_job_id']}" in timeout["error"]
    assert f"TimeLimit {RUNTIME} min" in timeout["error"]
    summary = (work / "results" / "ci-timeout" / "summary.txt").read_text()
    assert "[timeout]" in summary and "SLURM time limit" in summary
    assert (work / "results" / "ci-timeout" / "report.html").stat().st_size > 0


def test_a_tune_runs_its_rounds_as_slurm_jobs(cluster, tmp_path):
    """`snakemake tune --profile slurm` (.test/tune.yaml, docs/tune.md): every tune run is a
    SLURM job of its own, the failed one recorded as such; each round's checkpoint runs where
    Snakemake runs, and a later round's jobs are submitted after it has read the round before
    (a DAG that grows with the data: a tune on the cluster's queue)."""
    t0 = time.perf_counter()
    p = profile_run(tmp_path, "tune", "--profile", "profiles/slurm", "--configfile",
                    str(ROOT / ".test" / "tune.yaml"), *FAST)  # fmt: skip
    print(f"tune through SLURM: {time.perf_counter() - t0:.1f} s")
    assert p.returncode == 0, p.stderr[-5000:]
    out = tmp_path / "results" / "ci-tune" / "tune"
    assert (out / "tune.csv").stat().st_size and (out / "best.yaml").stat().st_size
    by_round: dict[int, list[dict]] = {}
    for f in out.glob("round~*/runs/**/metrics.json"):
        by_round.setdefault(int(f.relative_to(out).parts[0].split("~")[1]), []).append(
            metrics.read(f)
        )
    ids = {r: [int(rec["env"]["slurm_job_id"]) for rec in recs] for r, recs in by_round.items()}
    assert len(ids[1]) == 6 and len({i for v in ids.values() for i in v}) == sum(
        map(len, ids.values())
    )
    assert [rec["status"] for rec in by_round[1]].count("failed") == 1
    for r in sorted(ids)[1:]:
        assert min(ids[r]) > max(ids[r - 1]), ids
    assert sorted(ids) == list(range(1, len(ids) + 1))
