"""Ranks placed as asked, and nothing silently on the CPU, on the local 2-node cluster of
scripts/local-slurm.sh started with TaskPlugin=task/affinity (each task bound to the CPUs its
step asked for, as on clusters with task/cgroup's ConstrainCores: cgroups cannot run here).
One tiny cell each; the rest of the SLURM tests run under task/none (tests/test_slurm.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_slurm import FAST, local_cluster, profile_run

from trainscale.measure import metrics

from conftest import PYTHON, ROOT, run_env

pytestmark = pytest.mark.xdist_group(name="slurm")  # one cluster at a time on this host


@pytest.fixture(scope="module")
def cluster():
    yield from local_cluster("task/affinity")


#: one tiny cell across both nodes, each rank with 2 threads (every CPU of a node here); and one
#: that asks for GPUs the nodes do not really have (no slurm.fake_gpus)
TINY = {
    "epochs": 2,
    "repeats": 1,
    "steps_per_epoch": 2,
    "threads_per_worker": 2,
    "collectives": {"enabled": False},
    "matrix": {"strategy": ["torch-ddp"], "model": ["seed-small"], "dataset": ["digits"],
               "batch_size": [32], "workers": [1], "nodes": [2], "exclude": []},
}  # fmt: skip


def tiny_study(workdir: Path, study: dict) -> list[dict]:
    """Run `study` through the profile; its records."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "study.yaml").write_text(json.dumps(study))
    target = f"results/{study['study']}/runs.csv"
    config = ["--configfile", str(workdir / "study.yaml")]
    p = profile_run(workdir, "--profile", "profiles/slurm", *config, *FAST, target)
    assert p.returncode == 0, p.stderr[-5000:]
    return [metrics.read(f) for f in (workdir / "results").rglob("metrics.json")]


def test_ranks_get_the_cpus_their_cell_asks_for(cluster, tmp_path):
    """Under task/affinity: the inner srun asks for each task's CPUs, and each rank of a
    2-node cell may run on threads_per_worker CPUs or more (env.rank_cpus); the same for
    Horovod, whose workers start through srun too (trainscale.launch.hvdrun, not ssh)."""
    matrix = {**TINY["matrix"], "strategy": ["torch-ddp", "horovod-torch"]}
    study = {**TINY, "study": "ci-affinity", "accelerator": "cpu", "matrix": matrix}
    recs = {r["spec"]["strategy"]: r for r in tiny_study(tmp_path, study)}
    for rec in recs.values():
        assert rec["status"] == "ok", rec["error"]
        assert "--cpus-per-task=2 " in rec["launch"]["command"], rec["launch"]["command"]
        assert len(rec["env"]["rank_cpus"]) == 2 and min(rec["env"]["rank_cpus"]) >= 2
        assert sorted(rec["env"]["rank_hosts"]) == ["n1", "n2"]
    assert (
        "-m trainscale.launch.hvdrun --hosts n1:1,n2:1"
        in recs["horovod-torch"]["launch"]["command"]
    )


def test_a_cuda_cell_on_nodes_without_usable_gpus_fails_naming_cuda(cluster, tmp_path):
    """The nodes grant (fake) GPUs, no rank can use one: the run fails, never trains on CPU."""
    study = {**TINY, "study": "ci-nogpu", "accelerator": "cuda",
             "matrix": {**TINY["matrix"], "strategy": ["torch"], "nodes": [1]}}  # fmt: skip
    (rec,) = tiny_study(tmp_path, study)
    assert rec["status"] == "failed", rec["status"]
    assert "accelerator cuda: rank 0 on host n" in rec["error"], rec["error"]
    assert "has no usable CUDA GPU" in rec["error"]


def test_doctor_checks_each_node_through_srun(cluster, tmp_path):
    """`trainscale doctor --profile slurm`: one line per node; a cuda study on nodes whose
    GPUs no rank can use fails each, naming the cause."""
    from trainscale.gpu import doctor

    study = tmp_path / "cuda.yaml"
    study.write_text(json.dumps({**TINY, "study": "ci-doctor", "accelerator": "cuda"}))
    argv = [PYTHON, "-m", "trainscale", "doctor", "--profile", "slurm", str(study)]
    p = subprocess.run(argv, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=300)
    lines = p.stdout.splitlines()
    assert p.returncode == 1 and [ln.split(":")[0] for ln in lines] == ["n1", "n2"], p
    assert all(": FAIL " in ln and "CUDA" in ln for ln in lines), lines
    assert doctor.srun_line(doctor.Asked("cpu", 2, 1), "py")[-1] == "0"
