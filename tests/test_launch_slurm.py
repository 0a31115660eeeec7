"""Where a run lands in a SLURM allocation, how long it may take there and what its job asks
for (trainscale.launch.slurm): pure functions of the environment and `scontrol`'s answers, checked
here without a cluster (tests/test_slurm.py runs a real one)."""

import shlex

import pytest

from trainscale.launch import commands as launch_commands
from trainscale.launch import slurm
from trainscale.launch.commands import Environment, command
from trainscale.plan.matrix import build_runs

from conftest import base_config


def spec(strategy="torch", **m):
    runs, _ = build_runs(base_config(strategy=[strategy], **m), accelerator="cuda")
    return runs[0]


LOCAL = Environment(mode="local", python="/venv/bin/python")


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("n1", ("n1",)),
        ("n[1-3]", ("n1", "n2", "n3")),
        ("gpu[01-02,7],login", ("gpu01", "gpu02", "gpu7", "login")),
        ("a[9-11]", ("a9", "a10", "a11")),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert slurm.expand_nodelist(nodelist) == hosts


def test_detect_environment():
    assert slurm.detect({}).mode == "local"
    env = slurm.detect({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]"})
    assert (env.mode, env.nodes, env.job_id, env.head) == ("slurm", ("n1", "n2"), "42", "n1")


@pytest.mark.parametrize(
    "strategy, workers, nodes, accelerator, expected",
    [
        ("torch", 1, 1, "cpu", {"nodes": 1, "tasks": 1, "cpus_per_task": 1}),
        ("torch-ddp", 2, 1, "cpu", {"nodes": 1, "tasks": 1, "cpus_per_task": 2}),
        (
            "torch-ddp",
            4,
            2,
            "cuda",
            {
                "nodes": 2,
                "tasks": 2,
                "cpus_per_task": 4,
                "mpi": "srun",
                "gres": "gpu:4",
                "tasks_per_gpu": 0,
            },
        ),
        (
            "tf-multiworker",
            2,
            2,
            "cpu",
            {
                "nodes": 2,
                "tasks": 4,
                "cpus_per_task": 1,
                "mpi": "srun",
                "slurm_extra": "--ntasks-per-node=2",
            },
        ),
        ("tf-multiworker", 2, 1, "cpu", {"nodes": 1, "tasks": 1, "cpus_per_task": 2}),
        (
            "deepspeed-zero2",
            2,
            2,
            "cpu",
            {"nodes": 2, "tasks": 2, "cpus_per_task": 2, "mpi": "srun"},
        ),
        ("horovod-keras-elastic", 2, 1, "cpu", {"nodes": 1, "tasks": 1, "cpus_per_task": 2}),
    ],
)
def test_slurm_resources_allocate_what_the_launcher_starts(
    strategy, workers, nodes, accelerator, expected
):
    s = spec(strategy, workers=[workers], nodes=[nodes], batch_size=[64])
    res = slurm.slurm_resources(s, accelerator)
    assert res.pop("runtime") == s.timeout_minutes + 5  # the run's own timeout fires first
    assert res == expected
    env = Environment(mode="slurm", nodes=tuple(f"n{i}" for i in range(nodes)), port=1, job_id="1")
    line = shlex.join(command(s, env, "m.json"))
    if nodes > 1:  # the launcher's srun asks for exactly the tasks the allocation holds
        per_node = expected["tasks"] // nodes
        assert f"srun --nodes={nodes} --ntasks={expected['tasks']} " in line
        assert f"--ntasks-per-node={per_node}" in line
        srun = launch_commands.srun(s, per_node)  # the check target probes the same tasks
        assert launch_commands.probe_command(s, env)[: len(srun)] == srun
    else:
        assert "srun" not in line and launch_commands.probe_command(s, env)[0] == env.python


def test_slurm_time_parsing_and_scontrol_fields():
    assert slurm.slurm_seconds("1-02:03:04") == 93784
    assert slurm.slurm_seconds("05:00") == 300
    assert slurm.slurm_seconds("UNLIMITED") is None
    f = slurm.scontrol_fields(
        "JobId=7 JobName=x NodeList=n[1-2] TimeLimit=00:10:00 RunTime=00:01:30"
    )
    assert f["NodeList"] == "n[1-2]" and f["TimeLimit"] == "00:10:00"


def test_in_allocation_reads_nodes_addresses_and_time_left_from_scontrol():
    """The jobstep executor drops SLURM_JOB_NODELIST: the launcher asks the controller."""
    answers = {
        ("show", "job", "-o", "7"): "JobId=7 NodeList=n[1-2] TimeLimit=00:10:00 RunTime=00:01:30",
        ("show", "node", "-o", "n1,n2"): "NodeName=n1 NodeAddr=10.0.0.1 Port=1\n"
        "NodeName=n2 NodeAddr=10.0.0.2 Port=2\n",
    }
    s = spec("torch-ddp", workers=[1], nodes=[2])
    env = slurm.in_allocation(
        Environment(mode="slurm", job_id="7"), s, scontrol=lambda *a: answers[a]
    )
    assert env.nodes == ("n1", "n2") and env.addrs == ("10.0.0.1", "10.0.0.2")
    assert (env.time_limit, env.time_left) == (600, 510)
    assert env.head == "10.0.0.1"


def test_deadline_is_the_runs_timeout_unless_slurm_ends_the_job_sooner():
    s = spec("torch-ddp", workers=[2])  # timeout_minutes from the schema default
    own = s.timeout_minutes * 60
    far = Environment(mode="slurm", job_id="7", time_limit=own + 600, time_left=own + 500)
    assert slurm.deadline(s, far)[0] == own
    near = Environment(mode="slurm", job_id="7", time_limit=120, time_left=100)
    seconds, why = slurm.deadline(s, near)
    assert seconds == 100 - slurm.SLURM_MARGIN_SECONDS
    assert "SLURM time limit of job 7" in why and "TimeLimit 2 min" in why
    assert slurm.deadline(s, LOCAL)[0] == own


def test_every_job_asks_for_memory_and_exclusive_ones_the_whole_node():
    s = spec("torch-ddp", workers=[8], nodes=[2], batch_size=[64])
    own = slurm.slurm_resources(s, "cuda", 3 * 2**30)
    assert own["mem_mb"] > 8 * 3 * 1024  # 8 ranks of 3 GiB on each node, with a margin
    whole = slurm.slurm_resources(s, "cuda", 3 * 2**30, {"exclusive": True})
    assert whole["mem_mb"] == slurm.WHOLE_NODE == 0 and "--exclusive" in whole["slurm_extra"]
    # the benchmark of a shape: its largest training run's; a build: 2 GiB a compiler
    assert slurm.collectives_mem_mb([own["mem_mb"], 1200]) == own["mem_mb"]
    assert slurm.build_mem_mb(8) == 16 * 1024 + 512
