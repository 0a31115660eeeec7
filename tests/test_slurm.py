"""SLURM for real: `snakemake --profile profiles/slurm` through snakemake-executor-plugin-slurm
on the 2-node cluster of scripts/local-slurm.sh (two slurmd daemons on this host, fake GPUs,
slurmdbd accounting so that the plugin's sacct status checks work).

The cluster needs root (slurmd runs jobs as their users) and Debian's slurm-wlm, munge,
slurmdbd and mariadb-server (.ci/run installs them; the script does where they are missing).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from trainscale import metrics

from conftest import ROOT, SNAKEMAKE

SCRIPT = ROOT / "scripts" / "local-slurm.sh"
STUDY = ROOT / ".test" / "slurm.yaml"
#: the time limit (minutes) the test gives every train job: the long torch run must hit it
RUNTIME = 2
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


@pytest.fixture(scope="module")
def cluster():
    """The local 2-node cluster for this module's tests; always stopped afterwards."""
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (slurmd starts jobs as their users)")
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        pytest.skip("no SLURM packages and no apt-get to install Debian's slurm-wlm")
    t0 = time.perf_counter()
    p = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, timeout=900)
    if p.returncode and "apt-get" in p.stderr and not shutil.which("slurmctld"):
        pytest.skip(f"Debian's SLURM packages cannot be installed here: {p.stderr[-500:]}")
    try:
        assert p.returncode == 0, p.stdout + p.stderr
        print(f"local SLURM up in {time.perf_counter() - t0:.1f} s")
        yield
    finally:
        subprocess.run([str(SCRIPT), "stop"], capture_output=True, text=True, timeout=120)


def sacct_states(job_ids: list[str]) -> dict[str, str]:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("|", 1) for line in out.split())


def test_study_runs_through_slurm_across_two_nodes(cluster, tmp_path):
    t0 = time.perf_counter()
    p = profile_run(
        tmp_path,
        "--profile",
        "profiles/slurm",
        "--configfile",
        str(STUDY),
        "--set-resources",
        f"train:runtime={RUNTIME}",
        *FAST,
        "results/ci-slurm/runs.csv",
        "results/ci-slurm/summary.txt",
    )
    print(f"study through SLURM: {time.perf_counter() - t0:.1f} s")
    assert p.returncode == 0, p.stderr[-5000:]
    runs = {}
    for f in (tmp_path / "results" / "ci-slurm" / "runs").rglob("metrics.json"):
        rec = metrics.read(f)
        s = rec["spec"]
        runs[(s["strategy"], s["workers"], s["nodes"])] = rec
    assert len(runs) == 5, sorted(runs)

    # every run was a SLURM job, and the ok ones' jobs ended COMPLETED in SLURM's accounting
    ok = [r for r in runs.values() if r["status"] == "ok"]
    assert {(r["spec"]["strategy"], r["spec"]["nodes"]) for r in ok} == {
        ("torch-ddp", 1),
        ("torch-ddp", 2),
        ("tf-multiworker", 2),
    }, {k: r["error"] for k, r in runs.items()}
    ids = [r["env"]["slurm_job_id"] for r in runs.values()]
    assert all(ids) and len(set(ids)) == 5
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

    # a run that fails, and one that meets its SLURM time limit, are recorded as such with
    # the reason, and the rest of the study completed around them
    failed = runs[("torch-dp", 2, 1)]
    assert failed["status"] == "failed" and "needs 2 GPUs, found 0" in failed["error"]
    timeout = runs[("torch", 1, 1)]
    assert timeout["status"] == "timeout", timeout["error"]
    assert f"SLURM time limit of job {timeout['env']['slurm_job_id']}" in timeout["error"]
    assert f"TimeLimit {RUNTIME} min" in timeout["error"]
    with open(tmp_path / "results" / "ci-slurm" / "runs.csv") as f:
        table = list(csv.DictReader(f))
    assert sorted(r["status"] for r in table) == ["failed", "ok", "ok", "ok", "timeout"]
    summary = (tmp_path / "results" / "ci-slurm" / "summary.txt").read_text()
    assert "[timeout]" in summary and "SLURM time limit" in summary and "[failed]" in summary


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
