"""The launch layer is a pure function: every strategy and form is checked here, including the
GPU and multi-node forms this CPU machine cannot run."""

import shlex

import pytest

from trainscale import launch
from trainscale.launch import Environment, command
from trainscale.matrix import build_runs

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
        "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 python -m "
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
    assert "srun" not in argv and "--rdzv-endpoint=n1:0" in argv


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


def test_unlaunchable_strategy_raises():
    s = spec("torch")
    object.__setattr__(s, "strategy", "no-such-strategy")
    with pytest.raises(ValueError, match="no launcher"):
        command(s, LOCAL, "m.json")


def test_spec_survives_the_shell():
    s = spec("torch-ddp", workers=[2])
    argv = command(s, LOCAL, "results/a b/metrics.json")
    assert shlex.split(shlex.join(argv)) == argv


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
    assert launch.expand_nodelist(nodelist) == hosts


def test_detect_environment():
    assert launch.detect({}).mode == "local"
    env = launch.detect({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]"})
    assert (env.mode, env.nodes, env.job_id, env.head) == ("slurm", ("n1", "n2"), "42", "n1")


def test_classify():
    assert launch.classify(1, "boom", timed_out=True) == "timeout"
    assert launch.classify(1, "torch.OutOfMemoryError: CUDA out of memory", False) == "oom"
    assert launch.classify(1, "MemoryError", False) == "oom"
    assert launch.classify(1, "ValueError: x", False) == "failed"


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
    """Locally (CPU processes or one process per GPU) trainscale.tfrun sets TF_CONFIG."""
    s = spec("tf-multiworker", workers=[workers])
    argv = command(s, LOCAL, "m.json")
    assert argv == [
        *TF_THREADS,
        "/venv/bin/python",
        "-m",
        "trainscale.tfrun",
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
        "srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --kill-on-bad-exit=1 "
        "env TRAINSCALE_TF_CLUSTER=slurm TRAINSCALE_TF_PORT=29411 "
        "python -m trainscale.runners --spec"
    ) in line
    assert argv[: len(TF_THREADS)] == TF_THREADS
    assert "trainscale.tfrun" not in line and "torch.distributed.run" not in line


def test_tf_multiworker_multi_node_without_slurm_is_refused():
    s = spec("tf-multiworker", workers=[1], nodes=[2])
    with pytest.raises(ValueError, match="SLURM allocation"):
        command(s, LOCAL, "m.json")


def test_tf_multiworker_single_node_inside_slurm_keeps_tfrun():
    s = spec("tf-multiworker", workers=[2])
    env = Environment(mode="slurm", python="python", nodes=("n1",), job_id="9")
    argv = command(s, env, "m.json")
    assert "srun" not in argv and "trainscale.tfrun" in argv


def test_tf_environment_is_set_for_tf_strategies_only():
    assert "TF_USE_LEGACY_KERAS=1" in command(spec("tf"), LOCAL, "m.json")
    for strategy in ("torch", "torch-ddp"):
        assert not any(a.startswith("TF_") for a in command(spec(strategy), LOCAL, "m.json"))


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


def test_horovod_elastic_names_a_discovery_script_and_a_world_range():
    s = spec("horovod-torch-elastic", workers=[4])
    line = shlex.join(command(s, LOCAL, "m.json"))
    assert (
        "-m horovod.runner.launch --gloo -np 4 --network-interface lo --min-np 1 --max-np 4 "
        "--host-discovery-script '/venv/bin/python -m trainscale.horovod_hosts --slots 4' "
        "/venv/bin/python -m trainscale.runners"
    ) in line
    assert " -H " not in line


def test_horovod_multi_node_on_slurm_is_horovodrun_with_the_node_list():
    s = spec("horovod-torch", workers=[4], nodes=[2])
    env = Environment(mode="slurm", python="python", nodes=("gpu01", "gpu02"), job_id="5")
    line = shlex.join(command(s, env, "m.json"))
    assert (
        "python -m horovod.runner.launch --gloo -np 8 -H gpu01:4,gpu02:4 python -m "
        "trainscale.runners"
    ) in line
    assert "srun" not in line and "--network-interface" not in line
    elastic = spec("horovod-torch-elastic", workers=[4], nodes=[2])
    line = shlex.join(command(elastic, env, "m.json"))
    assert "-np 8 --min-np 1 --max-np 8 --host-discovery-script" in line


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
