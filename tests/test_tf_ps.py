"""tf-ps (ParameterServerStrategy): the launcher's roles and teardown, the command lines and
SLURM requests, the matrix, the cluster under srun, and real asynchronous runs on digits."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from trainscale.launch import commands as launch_commands
from trainscale.launch import slurm, tfrun
from trainscale.launch.commands import Environment, command
from trainscale.measure import metrics
from trainscale.plan.matrix import build_runs
from trainscale.plan.runspec import ConfigError

import tap
from conftest import PYTHON, base_config, launch, run_env, validated

LOCAL = Environment(mode="local", python="/venv/bin/python")


def spec(accelerator="cuda", ps_tasks=None, **m):
    cfg = base_config(strategy=["tf-ps"], **m)
    if ps_tasks is not None:
        cfg = validated({**cfg, "ps_tasks": ps_tasks})
    return build_runs(cfg, accelerator=accelerator)[0][0]


# --- tfrun --ps: roles, TF_CONFIG, teardown, exit codes ---------------------------------------


def test_roles_are_the_chief_then_the_servers_then_the_workers():
    assert tfrun.ps_roles(3, 2) == [
        ("chief", 0),
        ("ps", 0),
        ("ps", 1),
        ("worker", 0),
        ("worker", 1),
        ("worker", 2),
    ]


def test_every_process_gets_the_whole_cluster_and_its_own_role():
    envs = tfrun.ps_envs(2, 2, [1, 2, 3, 4, 5])
    cluster = {
        "chief": ["127.0.0.1:1"],
        "ps": ["127.0.0.1:2", "127.0.0.1:3"],
        "worker": ["127.0.0.1:4", "127.0.0.1:5"],
    }
    tasks = [json.loads(e["TF_CONFIG"]) for e in envs]
    assert all(t["cluster"] == cluster for t in tasks)
    assert [t["task"] for t in tasks] == [
        {"type": "chief", "index": 0},
        {"type": "ps", "index": 0},
        {"type": "ps", "index": 1},
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
    ]
    assert [e.get("LOCAL_RANK") for e in envs] == [None, None, None, "0", "1"]  # its GPU


def _tfrun_ps(code: str, tmp: Path, workers=2, ps=1, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            PYTHON,
            "-m",
            "trainscale.launch.tfrun",
            f"--nproc={workers}",
            f"--ps={ps}",
            "--",
            "-c",
            code,
        ],
        env=run_env(PIDS=str(tmp)),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: Each process records its pid under $PIDS/<role>; servers and workers then serve for ever.
ROLE = (
    "import json, os, sys, time\n"
    "t = json.loads(os.environ['TF_CONFIG'])['task']\n"
    "role = f\"{t['type']}{t['index']}\"\n"
    "open(os.path.join(os.environ['PIDS'], role), 'w').write(str(os.getpid()))\n"
    "print('role', role, flush=True)\n"
)
WAIT_FOR_ALL = "while len(os.listdir(os.environ['PIDS'])) < 4: time.sleep(0.05)\n"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text()[:64]


def _all_gone(tmp: Path) -> bool:
    pids = [int(f.read_text()) for f in tmp.iterdir()]
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(_alive(p) for p in pids)


def test_the_chief_decides_and_the_servers_are_stopped_when_it_ends(tmp_path):
    code = ROLE + "if t['type'] != 'chief': time.sleep(300)\n" + WAIT_FOR_ALL
    t = time.monotonic()
    p = _tfrun_ps(code, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert time.monotonic() - t < 30
    assert sorted(f.name for f in tmp_path.iterdir()) == ["chief0", "ps0", "worker0", "worker1"]
    assert _all_gone(tmp_path)  # no server left behind
    assert "stopped the others" not in p.stdout


def test_a_failing_chief_fails_tfrun_with_its_code_and_stops_the_servers(tmp_path):
    code = ROLE + "if t['type'] != 'chief': time.sleep(300)\n" + WAIT_FOR_ALL + "sys.exit(5)\n"
    t = time.monotonic()
    p = _tfrun_ps(code, tmp_path)
    assert p.returncode == 5
    assert time.monotonic() - t < 30
    assert "chief exited with code 5; stopped the others" in p.stdout
    assert _all_gone(tmp_path)


@pytest.mark.parametrize("role", ["worker1", "ps0"])
def test_a_failing_worker_or_server_stops_the_chief_at_once(tmp_path, role):
    """The chief would wait for the lost process (as it does for a step scheduled there)."""
    code = ROLE + WAIT_FOR_ALL + f"if role == {role!r}: sys.exit(7)\ntime.sleep(300)\n"
    t = time.monotonic()
    p = _tfrun_ps(code, tmp_path)
    assert p.returncode == 7
    assert time.monotonic() - t < 30
    name = role[:-1] + " " + role[-1]
    assert f"{name} exited with code 7; stopped the others" in p.stdout
    assert _all_gone(tmp_path)


def test_tfrun_refuses_a_negative_server_count():
    p = subprocess.run(
        [PYTHON, "-m", "trainscale.launch.tfrun", "--nproc=1", "--ps=-1", "--", "-c", "pass"],
        env=run_env(),
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and "--ps >= 0" in p.stderr


# --- the matrix: ps_tasks flows into the spec, paths stay as they were --------------------------


def test_ps_tasks_defaults_to_one_and_flows_into_tf_ps_specs_only():
    s = spec()
    assert (s.ps_tasks, s.processes) == (1, 3)  # 1 worker, 1 server, the chief
    assert spec(ps_tasks=3, workers=[2]).processes == 6
    cfg = validated({**base_config(strategy=["tf-ps", "torch-ddp"], workers=[2]), "ps_tasks": 2})
    runs, _ = build_runs(cfg)
    assert {(r.strategy, r.ps_tasks) for r in runs} == {("tf-ps", 2), ("torch-ddp", 0)}
    ddp = next(r for r in runs if r.strategy == "torch-ddp")
    assert ddp.processes == ddp.world_size
    assert "ps_tasks" not in ddp.path and "ps_tasks" not in spec().path  # paths unchanged


def test_tf_ps_runs_on_cpu_across_nodes_and_at_every_worker_count():
    cfg = base_config(strategy=["tf-ps"], workers=[1, 2], nodes=[1, 2], batch_size=[64])
    runs, dropped = build_runs(cfg, accelerator="cpu")
    assert {(r.workers, r.nodes) for r in runs} == {(1, 1), (2, 1), (1, 2), (2, 2)}
    assert not dropped
    assert all(r.per_worker_batch_size * r.world_size == 64 for r in runs)


def test_a_fault_on_a_tf_ps_server_rank_is_refused():
    """Only the chief (rank 0) runs training code of ours; a fault elsewhere would not fire."""
    cfg = base_config(strategy=["tf-ps"], workers=[2])
    cfg["faults"] = [{"match": {"strategy": "tf-ps"}, "kind": "raise", "rank": 1}]
    with pytest.raises(ConfigError, match="rank 1 does not exist"):
        build_runs(validated(cfg))


# --- command lines and SLURM requests ----------------------------------------------------------

TF_THREADS = [
    "env",
    "MKL_NUM_THREADS=1",
    "OMP_NUM_THREADS=1",
    "OPENBLAS_NUM_THREADS=1",
    "TF_CPP_MIN_LOG_LEVEL=1",
    "TF_USE_LEGACY_KERAS=1",
]


@pytest.mark.parametrize("workers, ps", [(1, 1), (4, 2)])
def test_tf_ps_on_one_node_is_tfrun_with_servers(workers, ps):
    s = spec(workers=[workers], ps_tasks=ps)
    assert command(s, LOCAL, "m.json") == [
        *TF_THREADS,
        "/venv/bin/python",
        "-m",
        "trainscale.launch.tfrun",
        f"--nproc={workers}",
        f"--ps={ps}",
        "--",
        "-m",
        "trainscale.runners",
        "--spec",
        s.to_json(),
        "--out",
        "m.json",
    ]


def test_tf_ps_multi_node_on_slurm_is_srun_one_task_per_role():
    """2 nodes × 2 workers + 2 servers + the chief = 7 tasks, at most 4 on a node."""
    s = spec(workers=[2], nodes=[2], ps_tasks=2)
    env = Environment(
        mode="slurm",
        python="python",
        nodes=("n1", "n2"),
        addrs=("10.0.0.1", "10.0.0.2"),
        port=29411,
        job_id="5",
    )
    line = shlex.join(command(s, env, "m.json"))
    assert (
        "srun --nodes=2 --ntasks=7 --ntasks-per-node=4 --cpus-per-task=1 --kill-on-bad-exit=1 "
        "env TRAINSCALE_TF_CLUSTER=slurm TRAINSCALE_TF_PORT=29411 "
        "TRAINSCALE_NODE_ADDRS=n1=10.0.0.1,n2=10.0.0.2 python -m trainscale.runners --spec"
    ) in line
    assert "trainscale.launch.tfrun" not in line
    with pytest.raises(ValueError, match="SLURM allocation"):
        command(s, LOCAL, "m.json")


@pytest.mark.parametrize(
    "workers, nodes, ps, accelerator, expected",
    [
        (2, 1, 1, "cpu", {"nodes": 1, "tasks": 1, "cpus_per_task": 4}),  # 2 + 1 server + chief
        (
            2,
            2,
            2,
            "cpu",
            {
                "nodes": 2,
                "tasks": 7,
                "cpus_per_task": 1,
                "mpi": "srun",
                "slurm_extra": "--ntasks-per-node=4",
            },
        ),
        (
            1,
            2,
            1,
            "cuda",
            {
                "nodes": 2,
                "tasks": 4,
                "cpus_per_task": 1,
                "mpi": "srun",
                "slurm_extra": "--ntasks-per-node=2",
                "gres": "gpu:1",
                "tasks_per_gpu": 0,
            },
        ),
    ],
)
def test_slurm_request_counts_the_servers_and_the_chief(workers, nodes, ps, accelerator, expected):
    s = spec(workers=[workers], nodes=[nodes], ps_tasks=ps, batch_size=[64])
    res = slurm.slurm_resources(s, accelerator)
    res.pop("runtime")
    assert res == expected
    if nodes > 1:  # the srun of the run and of the device probe start exactly those tasks
        env = Environment(mode="slurm", nodes=("n1", "n2"), port=1, job_id="1")
        line = shlex.join(command(s, env, "m.json"))
        assert f"--ntasks={expected['tasks']} " in line
        srun = launch_commands.srun(s, launch_commands.tasks_per_node(s))
        assert launch_commands.probe_command(s, env)[: len(srun)] == srun


# --- the cluster under srun (the runner's side) -------------------------------------------------


def test_srun_tasks_resolve_to_chief_servers_and_workers():
    from trainscale.runners.tensorflow import tf_ps_cluster as tf_ps

    environ = {
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "4,3",
        "TRAINSCALE_TF_PORT": "29411",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
    }
    config = tf_ps.slurm_tf_config(environ, ps_tasks=2)
    assert config["cluster"] == {
        "chief": ["n1:29411"],
        "ps": ["n1:29412", "n1:29413"],
        "worker": ["n1:29414", "n2:29411", "n2:29412", "n2:29413"],
    }
    assert config["task"] == {"type": "worker", "index": 2}
    assert tf_ps.worker_gpu_slot(config, environ) == 1  # n2's second worker
    first = {**environ, "SLURM_PROCID": "3", "SLURM_LOCALID": "3"}
    assert tf_ps.worker_gpu_slot(tf_ps.slurm_tf_config(first, 2), first) == 0  # n1's only one
    assert tf_ps.slurm_tasks_per_node("2(x3),1") == [2, 2, 2, 1]


def test_a_cluster_of_the_wrong_shape_is_refused_before_training(monkeypatch):
    from trainscale.runners.tensorflow import tf_ps

    monkeypatch.delenv("TRAINSCALE_TF_CLUSTER", raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(RuntimeError, match="trainscale.launch.tfrun --nproc N --ps P"):
        tf_ps.tf_config(spec(workers=[2]))
    monkeypatch.setenv("TF_CONFIG", tfrun.ps_envs(1, 1, [1, 2, 3])[0]["TF_CONFIG"])
    with pytest.raises(RuntimeError, match=r"\(chief, ps, workers\) = \(1, 1, 1\)"):
        tf_ps.tf_config(spec(workers=[2]))


# --- a real run: 2 workers and 2 servers on digits, through the supervisor -----------------


@pytest.mark.slow
@pytest.mark.parametrize("workers, ps", [(2, 2)])  # 1 worker, 1 server: .test/seeds.yaml
def test_tf_ps_trains_digits_asynchronously(tmp_path, workers, ps):
    """With 2 servers every variable is cut in 2 shards: the chief's evaluation joins them.
    The samples each epoch records are those its worker steps trained (the test plug-in's
    count of every train_step's rows, tap.assert_recorded_samples_were_fed)."""
    cfg = base_config(strategy=["tf-ps"], workers=[workers], batch_size=[64], scale=[2])
    s = build_runs(validated({**cfg, "epochs": 2, "ps_tasks": ps}), accelerator="cpu")[0][0]
    out, taps = tmp_path / "metrics.json", tmp_path / "tap"
    p = launch(s, out, timeout=300, **tap.env(taps))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = metrics.read(out)  # validated against the schema
    assert rec["status"] == "ok", rec["error"]
    assert rec["test"]["accuracy"] > 0.5  # chance is 0.1
    assert rec["epochs"][-1]["train_loss"] < rec["epochs"][0]["train_loss"]
    assert rec["device"]["count"] == workers and rec["env"]["ps_tasks"] == ps
    assert "asynchronous" in rec["env"]["note"]
    assert rec["model"]["params"] == 33_802  # the same network as every other strategy
    steps = 1437 * 2 // 64  # whole global batches of the training set × scale
    assert [e["steps"] for e in rec["epochs"]] == [steps * workers] * 2  # worker steps
    assert [e["samples"] for e in rec["epochs"]] == [steps * 64] * 2  # the same samples
    tap.assert_recorded_samples_were_fed(rec, taps)  # ... and what the workers trained
    assert rec["oversubscribed"] == (workers + ps + 1 > metrics.cpu_count())
    assert f"trainscale.launch.tfrun --nproc={workers} --ps={ps}" in rec["launch"]["command"]


def test_the_report_says_beside_every_tf_ps_row_that_it_is_asynchronous():
    from types import SimpleNamespace

    from trainscale.report import rows as report_rows

    row = SimpleNamespace(strategy="tf-ps", baseline_note="")
    assert report_rows.cell_note(row).startswith("asynchronous training (ParameterServerStrategy)")
    assert report_rows.cell_note(SimpleNamespace(strategy="tf-multiworker", baseline_note="")) == ""
    both = report_rows.cell_note(SimpleNamespace(strategy="tf-ps", baseline_note="no N = 1 run"))
    assert both.startswith("no N = 1 run; asynchronous training")


def test_the_summary_says_that_tf_ps_is_asynchronous():
    import pandas as pd

    from trainscale.analysis.summary import summary_text

    row = {"run": "r", "status": "ok", "spec.strategy": "tf-ps", "error": None}
    text = summary_text(pd.DataFrame([row]), [], "s", scaling=pd.DataFrame())
    assert "read beside the numbers:\n  tf-ps: asynchronous training" in text
    assert "read beside" not in summary_text(
        pd.DataFrame([{**row, "spec.strategy": "tf"}]), [], "s", scaling=pd.DataFrame()
    )


def test_mixed_precision_is_dropped_with_the_reason():
    """tf-keras raises "Mixed precision is not supported with ... ParameterServerStrategyV2"."""
    cfg = base_config(strategy=["tf-ps"], precision=["fp32", "bf16", "fp16"])
    runs, dropped = build_runs(cfg, accelerator="cuda")
    assert [r.precision for r in runs] == ["fp32"]
    assert {d.reason for d in dropped} == {
        f"tf-ps: {p} is a mixed-precision policy, which tf-keras does not support under "
        "ParameterServerStrategy; use fp32"
        for p in ("bf16", "fp16")
    }


@pytest.mark.parametrize("workers", [1, 2])
def test_each_worker_step_reads_its_share_of_the_global_batch_from_its_own_shard(workers):
    """What the record counts (worker steps × per_worker_batch_size samples an epoch) is what
    the workers read. Under ParameterServerStrategy the InputContext's batch was the global
    one and its shard all of the data: 2 workers each read 64 samples a step, the same ones,
    where the record counted 32. Here each worker's pipeline (tf_ps.pipeline, the data set
    dataset_fn builds on the worker with its index) yields per_worker_batch_size samples a
    step, from a shard disjoint from the other workers'."""
    import numpy as np

    from trainscale import data
    from trainscale.runners.tensorflow import tf_ps

    s = build_runs(base_config(strategy=["tf-ps"], batch_size=[64], workers=[workers]),
                   accelerator="cpu")[0][0]  # fmt: skip
    arrays = data.load(s.dataset, s.data_dir, seed=s.seed)
    n = len(arrays.train_y)
    # each sample's "image" its index (normalised: an affine map, so still one value each)
    x = np.arange(n, dtype=np.float32).reshape(n, 1, 1, 1)
    assert s.per_worker_batch_size == 64 // workers
    seen = []
    for w in range(workers):
        steps = (n // workers) // s.per_worker_batch_size  # one pass over the worker's shard
        batches = list(tf_ps.pipeline(s, arrays, x, w).take(steps))
        assert {len(b[1]) for b in batches} == {s.per_worker_batch_size}
        values = np.concatenate([b[0].numpy().ravel() for b in batches])
        assert len(set(values.tolist())) == steps * s.per_worker_batch_size  # no sample twice
        seen.append(set(values.tolist()))
    if workers == 2:
        assert not seen[0] & seen[1]  # each worker its own samples
