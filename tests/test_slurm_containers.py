"""Containers, `env` and `slurm` options for real: `snakemake --profile profiles/slurm` on the
local 2-node cluster (scripts/local-slurm.sh), with stand-ins for the container runtimes, which
cannot be installed here: `apptainer` on PATH records its arguments and runs the command it is
given (tests/standins/apptainer), and a SPANK plugin built against Debian's libslurm-dev gives
srun pyxis's --container-* options and logs what each task got (tests/standins/pyxis_stub.c).
The runs train on the host; the tests check what each runtime was asked, that every record
names the image and holds the study's variables, and what every job asked of SLURM."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from test_slurm import FAST, cluster, profile_run  # noqa: F401  (cluster: the fixture)

from trainscale.launch import slurm as launch_slurm
from trainscale.measure import metrics

from conftest import ROOT, SNAKEMAKE

pytestmark = pytest.mark.xdist_group(name="slurm")  # one cluster: its tests in one worker
STANDINS = ROOT / "tests" / "standins"
PLUGSTACK = Path("/etc/slurm/plugstack.conf.d/trainscale-pyxis-stub.conf")
FEATURE = "trainscale-test"
#: one tiny torch-ddp cell per run: 2 epochs of 2 steps
STUDY = {
    "epochs": 2,
    "repeats": 1,
    "steps_per_epoch": 2,
    "timeout_minutes": 5,
    "accelerator": "cuda",  # train jobs ask for (fake) GPUs, as on a GPU cluster,
    "slurm": {"fake_gpus": True},  # and their ranks train on the CPU: the GPUs are not real
    "collectives": {"enabled": False},
    "env": {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "lo", "SITE_FLAG": "on"},
    "matrix": {"strategy": ["torch-ddp"], "model": ["seed-small"], "dataset": ["digits"],
               "batch_size": [32], "workers": [1], "nodes": [2], "exclude": []},
}  # fmt: skip


@pytest.fixture(scope="module")
def features(cluster):  # noqa: F811
    """The nodes carry a feature for slurm.constraint to ask for."""
    name = f"NodeName=n[1-2] AvailableFeatures={FEATURE} ActiveFeatures={FEATURE}"
    subprocess.run(["scontrol", "update", *name.split()], check=True)
    yield FEATURE


@pytest.fixture(scope="module")
def pyxis(cluster, tmp_path_factory):  # noqa: F811
    """The pyxis stand-in, built and listed in the cluster's plugstack for this module only."""
    header = Path("/usr/include/slurm/spank.h")
    if not header.exists() and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "libslurm-dev"], capture_output=True)
    if not header.exists() or not shutil.which("gcc"):
        pytest.skip("no gcc or no slurm/spank.h (Debian's libslurm-dev) to build the stand-in")
    d = tmp_path_factory.mktemp("pyxis")
    so, log = d / "pyxis_stub.so", d / "pyxis.log"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", so, STANDINS / "pyxis_stub.c"], check=True)
    PLUGSTACK.parent.mkdir(parents=True, exist_ok=True)
    PLUGSTACK.write_text(f"optional {so} log={log}\n")
    try:
        yield log
    finally:
        PLUGSTACK.unlink(missing_ok=True)


def run_study(work: Path, study: dict, target: str, **env: str) -> subprocess.CompletedProcess:
    work.mkdir(parents=True, exist_ok=True)
    (work / "study.yaml").write_text(yaml.safe_dump(study))
    environ = {**os.environ, "PATH": f"{STANDINS}{os.pathsep}{os.environ['PATH']}", **env}
    return profile_run(work, "--profile", "profiles/slurm", "--configfile",
                       str(work / "study.yaml"), *FAST, target, env=environ)  # fmt: skip


def records(work: Path, study: str) -> list[dict]:
    return [metrics.read(f) for f in sorted((work / "results" / study).rglob("metrics.json"))]


def job(job_id: str) -> dict[str, str]:
    """What SLURM's controller holds of a job (it keeps an ended one for MinJobAge)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    return launch_slurm.scontrol_fields(out.stdout)


def test_apptainer_study_runs_in_the_image_with_its_variables_and_slurm_options(features, tmp_path):
    """Across 2 nodes: srun outside, `apptainer exec --nv` around each node's torchrun with
    the working and package directories and the study's mount bound, the variables set inside;
    the record names the image and its digest, lists the variables, and its job asked SLURM
    for exclusive nodes of the feature with 2 GPUs each."""
    image = tmp_path / "trainscale.sif"
    image.write_bytes(b"not a real SIF: the stand-in never opens it")
    data = tmp_path / "data"
    data.mkdir()
    study = {**STUDY, "study": "ci-apptainer",
             "container": {"image": str(image), "runtime": "apptainer", "mounts": [str(data)]},
             "slurm": {"exclusive": True, "gpus_per_node": 2, "constraint": features,
                       "fake_gpus": True}}  # fmt: skip
    work, log = tmp_path / "w", tmp_path / "apptainer.log"
    p = run_study(work, study, "results/ci-apptainer/runs.csv", TRAINSCALE_STANDIN_LOG=str(log))
    assert p.returncode == 0, p.stderr[-5000:]
    (rec,) = records(work, "ci-apptainer")
    assert rec["status"] == "ok", rec["error"]
    digest = "sha256:" + hashlib.sha256(image.read_bytes()).hexdigest()
    assert rec["env"]["container"] == {"image": str(image), "digest": digest,
                                       "runtime": "apptainer"}  # fmt: skip
    seen = rec["env"]["variables"]
    assert {k: seen[k] for k in STUDY["env"]} == STUDY["env"] and seen["OMP_NUM_THREADS"] == "1"
    assert sorted(rec["env"]["rank_hosts"]) == ["n1", "n2"]
    assert rec["launch"]["command"].startswith("srun --nodes=2 ")
    assert " apptainer exec --nv " in rec["launch"]["command"]

    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(c["node"] for c in calls) == ["n1", "n2"]  # one per srun task
    for c in calls:
        assert c["image"] == str(image) and c["options"]["--nv"] == [True]
        binds = c["options"]["--bind"]
        assert binds[0] == f"{work}:{work}" and binds[-1] == f"{data}:{data}"
        assert binds[1] == f"{launch_slurm.PACKAGE_DIR}:{launch_slurm.PACKAGE_DIR}"
        assert c["options"]["--pwd"] == [str(work)]
        cmd = c["command"]
        assert cmd[0] == "env" and "NCCL_DEBUG=INFO" in cmd and "SITE_FLAG=on" in cmd
        program = next(i for i, a in enumerate(cmd[1:], 1) if "=" not in a)  # after env's
        assert cmd[program : program + 3] == ["python", "-m", "torch.distributed.run"]

    asked = job(rec["env"]["slurm_job_id"])
    assert asked["OverSubscribe"] == "NO", asked  # --exclusive
    assert asked["Features"] == features and asked["TresPerNode"] == "gres:gpu:2", asked

    # the three settings stay outside the run spec: changing them re-runs nothing (but
    # slurm.fake_gpus, which decides what the ranks train on: it stays)
    study.update(env={"NCCL_DEBUG": "WARN"}, slurm={"fake_gpus": True},
                 container={"image": "other.sif"})  # fmt: skip
    (work / "study.yaml").write_text(yaml.safe_dump(study))
    again = subprocess.run(
        [SNAKEMAKE, "--directory", str(work), "-n", "results/ci-apptainer/runs.csv",
         "--configfile", str(work / "study.yaml")], cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_pyxis_study_runs_every_run_through_srun_with_the_container_options(pyxis, tmp_path):
    """On one node too (an srun --overlap inside the job's step) and across 2: srun took
    --container-image/-mounts/-workdir in every task, and the records name the pinned image."""
    pinned = "nvcr.io#nvidia/pytorch:25.01-py3@sha256:" + "0123abcd" * 8
    study = {**STUDY, "study": "ci-pyxis", "container": {"image": pinned, "runtime": "pyxis"},
             "matrix": {**STUDY["matrix"], "nodes": [1, 2]}}  # fmt: skip
    work = tmp_path / "w"
    p = run_study(work, study, "results/ci-pyxis/runs.csv")
    assert p.returncode == 0, p.stderr[-5000:]
    recs = {r["spec"]["nodes"]: r for r in records(work, "ci-pyxis")}
    assert sorted(recs) == [1, 2]
    for nodes, rec in recs.items():
        assert rec["status"] == "ok", rec["error"]
        assert rec["env"]["container"] == {"image": pinned, "digest": "sha256:" + "0123abcd" * 8,
                                           "runtime": "pyxis"}  # fmt: skip
        assert rec["env"]["variables"]["NCCL_SOCKET_IFNAME"] == "lo"
        line = rec["launch"]["command"]
        assert line.startswith("srun --overlap --nodes=1 " if nodes == 1 else "srun --nodes=2 ")
        assert f"--container-image={pinned}" in line and "apptainer" not in line
    tasks = [dict(f.split("=", 1) for f in ln.split()) for ln in pyxis.read_text().splitlines()]
    by_job = {}
    for t in tasks:
        by_job.setdefault(t["job"], []).append(t)
    got = {recs[n]["env"]["slurm_job_id"]: n for n in recs}
    assert {j: len(by_job.get(j, [])) for j in got} == {j: n for j, n in got.items()}, tasks
    for t in tasks:
        if t["job"] in got:
            assert t["image"] == pinned and t["workdir"] == str(work)
            package = launch_slurm.PACKAGE_DIR
            assert t["mounts"].split(",")[:2] == [f"{work}:{work}", f"{package}:{package}"]
