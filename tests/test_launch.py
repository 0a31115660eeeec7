"""The launch layer is a pure function: every strategy and form is checked here, including the
GPU and multi-node forms this CPU machine cannot run."""

import shlex
from pathlib import Path

import pytest

from trainscale.launch import supervise as launch
from trainscale.launch.supervise import Environment, command
from trainscale.plan.matrix import build_runs

from conftest import base_config


def spec(strategy="torch", **m):
    runs, _ = build_runs(base_config(strategy=[strategy], **m), accelerator="cuda")
    return runs[0]


LOCAL = Environment(mode="local", python="/venv/bin/python")
THREADS = ["env", "MKL_NUM_THREADS=1", "OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1"]


@pytest.mark.parametrize("strategy", ["torch", "torch-dp"])
def test_single_process_strategies(strategy):
    s = spec(strategy)
    argv = command(s, LOCAL, "out/metrics.json")
    assert argv == [
        *THREADS,
        "/venv/bin/python",
        "-m",
        "trainscale.runners",
        "--spec",
        s.to_json(),
        "--out",
        "out/metrics.json",
    ]


def test_dataparallel_on_gpus_is_still_one_process():
    s = spec("torch-dp", workers=[4])
    assert s.workers == 4
    assert "torch.distributed.run" not in command(s, LOCAL, "m.json")


def test_ddp_single_node_uses_torchrun_with_c10d_and_os_chosen_port():
    s = spec("torch-ddp", workers=[4])
    argv = command(s, LOCAL, "m.json")
    i = argv.index("torch.distributed.run")
    assert argv[: i - 1] == [*THREADS, "/venv/bin/python"]
    assert argv[i + 1 : i + 7] == [
        "--nnodes=1",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:0",
        argv[i + 5],
        "--max-restarts=0",
    ]
    assert argv[i + 5].startswith("--rdzv-id=t-")
    # distinct runs get distinct rendezvous ids, the same run always the same (pure function)
    other = spec("torch-ddp", workers=[2])
    assert command(other, LOCAL, "m.json")[i + 5] != argv[i + 5]
    assert command(s, LOCAL, "m.json") == argv
    assert argv[-6:] == ["-m", "trainscale.runners", "--spec", s.to_json(), "--out", "m.json"]


def test_ddp_multi_node_on_slurm_is_srun_one_task_per_node_running_torchrun():
    s = spec("torch-ddp", workers=[4], nodes=[2])
    env = Environment(
        mode="slurm", python="python", nodes=("gpu01", "gpu02"), port=29411, job_id="123"
    )
    argv = command(s, env, "m.json")
    line = shlex.join(argv)
    assert (
        "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=4 --kill-on-bad-exit=1 "
        "python -m "
        "torch.distributed.run --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d "
        "--rdzv-endpoint=gpu01:29411 --rdzv-id=slurm-123 --max-restarts=0"
    ) in line
    assert argv[: len(THREADS)] == THREADS


def test_ddp_multi_node_without_slurm_is_refused():
    s = spec("torch-ddp", workers=[1], nodes=[2])
    with pytest.raises(ValueError, match="SLURM allocation"):
        command(s, LOCAL, "m.json")


def test_single_node_inside_slurm_keeps_the_local_form():
    s = spec("torch-ddp", workers=[2])
    env = Environment(mode="slurm", python="python", nodes=("n1",), job_id="9")
    argv = command(s, env, "m.json")
    # loopback with an OS-chosen port: the store is local, and a SLURM node name need not
    # resolve (the local test cluster's n1 does not)
    assert "srun" not in argv and "--rdzv-endpoint=127.0.0.1:0" in argv


def test_thread_budget_follows_spec():
    cfg = base_config(strategy=["torch"])
    cfg["threads_per_worker"] = 3
    runs, _ = build_runs(cfg)
    assert command(runs[0], LOCAL, "m.json")[:4] == [
        "env",
        "MKL_NUM_THREADS=3",
        "OMP_NUM_THREADS=3",
        "OPENBLAS_NUM_THREADS=3",
    ]


def test_a_compiled_cpu_worker_compiles_with_its_own_threads():
    """Inductor's compile processes per rank follow threads_per_worker on CPU; on GPUs, and
    where config `env` sets them, trainscale leaves them alone."""
    cfg = base_config(strategy=["torch-ddp"], workers=[2])
    cfg["threads_per_worker"], cfg["compile"] = 2, True
    (run,), _ = build_runs(cfg)
    assert "TORCHINDUCTOR_COMPILE_THREADS=2" in command(run, LOCAL, "m.json")
    given = Environment(mode="local", python="/venv/bin/python",
                        variables=(("TORCHINDUCTOR_COMPILE_THREADS", "8"),))  # fmt: skip
    assert "TORCHINDUCTOR_COMPILE_THREADS=2" not in command(run, given, "m.json")
    (gpu,), _ = build_runs(cfg, accelerator="cuda")
    (plain,), _ = build_runs({**cfg, "compile": False})
    for other in (gpu, plain):
        assert not any("TORCHINDUCTOR" in a for a in command(other, LOCAL, "m.json"))


def test_one_process_strategies_are_the_single_process_launches():
    from trainscale.plan import catalog
    from trainscale.plan.matrix import IMPLEMENTED

    single = {s for s in IMPLEMENTED if launch.LAUNCHERS[s] is launch.single_process}
    assert single == set(catalog.names(one_process=True)) & IMPLEMENTED


def test_unlaunchable_strategy_raises():
    s = spec("torch")
    object.__setattr__(s, "strategy", "no-such-strategy")
    with pytest.raises(ValueError, match="no launcher"):
        command(s, LOCAL, "m.json")


def test_spec_survives_the_shell():
    s = spec("torch-ddp", workers=[2])
    argv = command(s, LOCAL, "results/a b/metrics.json")
    assert shlex.split(shlex.join(argv)) == argv


def test_classify():
    assert launch.classify(1, "boom", timed_out=True) == "timeout"
    assert launch.classify(1, "torch.OutOfMemoryError: CUDA out of memory", False) == "oom"
    assert launch.classify(1, "MemoryError", False) == "oom"
    assert launch.classify(1, "ValueError: x", False) == "failed"
    tf_oom = "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating"
    assert launch.classify(1, tf_oom, False) == "oom"
    # SIGKILL: out of memory when the OOM killer struck, or when that cannot be known
    assert launch.classify(-9, "", False, oom_killed=True) == "oom"
    assert launch.classify(-9, "", False, oom_killed=None) == "oom"
    assert launch.classify(-9, "", False, oom_killed=False) == "failed"  # a lost node, say


def test_oom_kill_counter_is_read_from_the_cgroup_where_there_is_one():
    n = launch.oom_kills()
    assert n is None or n >= 0
    if Path("/sys/fs/cgroup/memory.events").exists() or Path("/sys/fs/cgroup/memory").is_dir():
        assert n is not None


def test_exception_lines_finds_the_root_cause_not_the_wrapper():
    out = [
        "Traceback (most recent call last):\n",
        '  File "x.py", line 1, in <module>\n',
        "trainscale.data.DataError: missing files for mnist:\n",
        "    - /data/mnist/train-images-idx3-ubyte.gz\n",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
        "ValueError\n",
    ]
    assert launch.exception_lines(out) == [
        "trainscale.data.DataError: missing files for mnist:",
        "ValueError",
    ]


def test_exception_lines_put_torchruns_root_cause_first():
    out = [
        "  RuntimeError: [gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:1\n",
        "Root Cause (first observed failure):\n",
        "  rank      : 1 (local_rank: 1)\n",
        "  RuntimeError: injected fault: rank 1 raised in epoch 2\n",
    ]
    first = launch.exception_lines(out)[0]
    assert first == "RuntimeError: injected fault: rank 1 raised in epoch 2"
    killed = [*out[:3], "  traceback : Signal 9 (SIGKILL) received by PID 8945\n"]
    assert launch.exception_lines(killed)[0] == "Signal 9 (SIGKILL) received by PID 8945"
    # the surviving rank may notice first and become torchrun's "root cause": still second
    peer_first = [
        "Root Cause (first observed failure):\n",
        "  rank      : 0 (local_rank: 0)\n",
        "  RuntimeError: [gloo/pair.cc:537] Read error [127.0.0.1]:26282: Connection reset\n",
        "Other Failures:\n",
        "  traceback : Signal 9 (SIGKILL) received by PID 8945\n",
    ]
    assert launch.exception_lines(peer_first) == [
        "Signal 9 (SIGKILL) received by PID 8945",
        "RuntimeError: [gloo/pair.cc:537] Read error [127.0.0.1]:26282: Connection reset",
    ]
    # torchrun's own SIGTERM to the other ranks is not a cause
    stopped = [out[3], "  traceback : Signal 15 (SIGTERM) received by PID 8946\n"]
    assert launch.exception_lines(stopped)[0].startswith("RuntimeError: injected fault")


# --- TensorFlow: tf, tf-mirrored (one process), tf-multiworker (tfrun locally, srun on SLURM) ---

TF_THREADS = [*THREADS, "TF_CPP_MIN_LOG_LEVEL=1", "TF_USE_LEGACY_KERAS=1"]


@pytest.mark.parametrize(
    "strategy, workers",
    [("tf", 1), ("tf-mirrored", 1), ("tf-mirrored", 4)],
    ids=["tf", "tf-mirrored-1", "tf-mirrored-4-gpus"],
)
def test_tf_one_process_strategies(strategy, workers):
    """tf-mirrored drives all of a node's GPUs (or logical CPU devices) from one process."""
    s = spec(strategy, workers=[workers])
    assert s.workers == workers
    argv = command(s, LOCAL, "out/metrics.json")
    assert argv == [
        *TF_THREADS,
        "/venv/bin/python",
        "-m",
        "trainscale.runners",
        "--spec",
        s.to_json(),
        "--out",
        "out/metrics.json",
    ]


@pytest.mark.parametrize("workers", [2, 8])
def test_tf_multiworker_on_one_node_is_tfrun_with_a_process_per_worker(workers):
    """Locally (CPU processes or one process per GPU) trainscale.launch.tfrun sets TF_CONFIG."""
    s = spec("tf-multiworker", workers=[workers])
    argv = command(s, LOCAL, "m.json")
    assert argv == [
        *TF_THREADS,
        "/venv/bin/python",
        "-m",
        "trainscale.launch.tfrun",
        f"--nproc={workers}",
        "--",
        "-m",
        "trainscale.runners",
        "--spec",
        s.to_json(),
        "--out",
        "m.json",
    ]


def test_tf_multiworker_multi_node_on_slurm_is_srun_one_task_per_worker():
    s = spec("tf-multiworker", workers=[4], nodes=[2])
    env = Environment(
        mode="slurm", python="python", nodes=("gpu01", "gpu02"), port=29411, job_id="123"
    )
    argv = command(s, env, "m.json")
    line = shlex.join(argv)
    assert (
        "srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=1 --gpus-per-task=1 "
        "--gpu-bind=per_task:1 --kill-on-bad-exit=1 "
        "env TRAINSCALE_TF_CLUSTER=slurm TRAINSCALE_TF_PORT=29411 "
        "python -m trainscale.runners --spec"
    ) in line
    assert argv[: len(TF_THREADS)] == TF_THREADS
    assert "trainscale.launch.tfrun" not in line and "torch.distributed.run" not in line


def test_tf_multiworker_multi_node_without_slurm_is_refused():
    s = spec("tf-multiworker", workers=[1], nodes=[2])
    with pytest.raises(ValueError, match="SLURM allocation"):
        command(s, LOCAL, "m.json")


def test_tf_multiworker_single_node_inside_slurm_keeps_tfrun():
    s = spec("tf-multiworker", workers=[2])
    env = Environment(mode="slurm", python="python", nodes=("n1",), job_id="9")
    argv = command(s, env, "m.json")
    assert "srun" not in argv and "trainscale.launch.tfrun" in argv


def test_tf_environment_is_set_for_tf_strategies_only():
    assert "TF_USE_LEGACY_KERAS=1" in command(spec("tf"), LOCAL, "m.json")
    for strategy in ("torch", "torch-ddp"):
        assert not any(a.startswith("TF_") for a in command(spec(strategy), LOCAL, "m.json"))


def test_multi_node_rendezvous_dials_the_first_nodes_slurm_address():
    s = spec("torch-ddp", workers=[1], nodes=[2])
    env = Environment(
        mode="slurm", nodes=("n1", "n2"), addrs=("10.0.0.1", "10.0.0.2"), port=5, job_id="7"
    )
    assert "--rdzv-endpoint=10.0.0.1:5" in command(s, env, "m.json")
    tf = spec("tf-multiworker", workers=[1], nodes=[2])
    assert "TRAINSCALE_NODE_ADDRS=n1=10.0.0.1,n2=10.0.0.2" in command(tf, env, "m.json")


# --- Horovod: horovodrun over gloo locally, with the node list on SLURM, elastic discovery ---
HVD = ["/venv/bin/python", "-m", "horovod.runner.launch", "--gloo"]


@pytest.mark.parametrize("strategy", ["horovod-torch", "horovod-keras"])
def test_horovod_local_is_horovodrun_on_localhost_over_loopback(strategy):
    s = spec(strategy, workers=[2])
    argv = command(s, LOCAL, "m.json")
    i = argv.index("/venv/bin/python")
    assert argv[i : i + 10] == [*HVD, "-np", "2", "--network-interface", "lo", "-H", "localhost:2"]
    assert argv[i + 10 :] == ["/venv/bin/python", "-m", "trainscale.runners", "--spec",
                              s.to_json(), "--out", "m.json"]  # fmt: skip
    # horovodrun sets no thread budget: every worker inherits it from the env prefix
    assert argv[:i][:4] == THREADS
    assert ("TF_USE_LEGACY_KERAS=1" in argv[:i]) == (strategy == "horovod-keras")


@pytest.mark.parametrize("strategy", ["horovod-torch-elastic", "horovod-keras-elastic"])
def test_horovod_elastic_names_a_discovery_script_and_a_world_range(strategy):
    s = spec(strategy, workers=[4])
    line = shlex.join(command(s, LOCAL, "m.json"))
    assert (
        "-m horovod.runner.launch --gloo -np 4 --network-interface lo --min-np 1 --max-np 4 "
        "--host-discovery-script '/venv/bin/python -m trainscale.launch.horovod_hosts --slots 4' "
        "/venv/bin/python -m trainscale.runners"
    ) in line
    assert " -H " not in line
    assert ("TF_USE_LEGACY_KERAS=1" in line) == (strategy == "horovod-keras-elastic")


@pytest.mark.parametrize("elastic", ["horovod-torch-elastic", "horovod-keras-elastic"])
def test_horovod_multi_node_on_slurm_is_hvdrun_through_srun(elastic):
    """Static Horovod across nodes: gloo's rendezvous on the first node, each node's workers
    started through srun (trainscale.launch.hvdrun), not horovodrun over ssh."""
    s = spec("horovod-torch", workers=[4], nodes=[2])
    env = Environment(mode="slurm", python="python", nodes=("gpu01", "gpu02"), job_id="5")
    line = shlex.join(command(s, env, "m.json"))
    assert (
        "python -m trainscale.launch.hvdrun --hosts gpu01:4,gpu02:4 --np 8 --addr gpu01 "
        "--srun 'srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=4 "
        "--kill-on-bad-exit=1' -- python -m trainscale.runners"
    ) in line
    assert "horovod.runner.launch" not in line and "--network-interface" not in line
    line = shlex.join(command(spec(elastic, workers=[4], nodes=[2]), env, "m.json"))
    assert (
        "-np 8 --min-np 1 --max-np 8 --host-discovery-script "
        "'python -m trainscale.launch.horovod_hosts --slots 4 --hosts gpu01,gpu02' "
        "python -m trainscale.runners"
    ) in line
    assert "srun" not in line and "--network-interface" not in line and " -H " not in line


def test_horovod_multi_node_without_slurm_is_refused():
    with pytest.raises(ValueError, match="SLURM allocation"):
        command(spec("horovod-torch", nodes=[2]), LOCAL, "m.json")


def test_horovod_timeline_is_switched_on_per_study_and_kept_beside_the_metrics():
    cfg = base_config(strategy=["horovod-torch", "torch-ddp"], workers=[2])
    assert not any(r.horovod_timeline for r in build_runs(cfg)[0])
    cfg["horovod_timeline"] = True
    runs = {r.strategy: r for r in build_runs(cfg)[0]}
    assert runs["horovod-torch"].horovod_timeline and not runs["torch-ddp"].horovod_timeline
    argv = command(runs["horovod-torch"], LOCAL, "results/s/run/metrics.json")
    assert "HOROVOD_TIMELINE=results/s/run/horovod-timeline.json" in argv
    assert not any("HOROVOD" in a for a in command(runs["torch-ddp"], LOCAL, "m.json"))
