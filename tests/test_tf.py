"""TensorFlow runners (tf, tf-mirrored, tf-multiworker): the local launcher, the matrix rules,
the optimizer's parity with PyTorch's, and real CPU runs through Snakemake beside PyTorch."""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import time

import numpy as np
import pytest
import torch

from trainscale.launch import tfrun
from trainscale.measure import metrics
from trainscale.plan.matrix import build_runs

import tap
from conftest import PYTHON, ROOT, base_config, launch, load_yaml, run_env, validated

#: Convergence parity: |test accuracy(tf) - test accuracy(torch)| on digits, same data, seed,
#: epochs and hyper-parameters. Why 0.03: the two frameworks draw different initial weights and
#: data orders from the same seed, so the difference is run-to-run noise. Measured here for
#: seeds 0-4 (3 epochs, scale 4, batch 64): torch 0.969-0.981, tf 0.967-0.978, largest
#: same-seed gap 0.011 (4 of 360 test images); one framework's own seed-to-seed range is
#: 0.011 too, and the binomial standard error of one accuracy on 360 images at 0.975 is 0.008,
#: so 0.03 is ~2.5 standard errors of a difference. A broken model, optimizer or normalisation
#: costs far more (valid padding or a missing normalisation: several points).
ACCURACY_TOLERANCE = 0.03


# --- the local multi-worker launcher (no TensorFlow needed) -----------------------------------


def test_free_ports_are_distinct_and_bindable():
    ports = tfrun.free_ports(4)
    assert len(set(ports)) == 4 and all(p > 0 for p in ports)


def test_every_worker_gets_the_whole_cluster_and_its_own_index():
    envs = tfrun.worker_envs(3, [1001, 1002, 1003])
    for i, e in enumerate(envs):
        cfg = json.loads(e["TF_CONFIG"])
        assert cfg["cluster"] == {"worker": [f"127.0.0.1:{p}" for p in (1001, 1002, 1003)]}
        assert cfg["task"] == {"type": "worker", "index": i}
        assert (e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) == (str(i), str(i), "3")


def _tfrun(code: str, nproc: int = 2, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "trainscale.launch.tfrun", f"--nproc={nproc}", "--", "-c", code],
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_tfrun_runs_every_worker_and_streams_their_output():
    p = _tfrun("import os, json; print('task', json.loads(os.environ['TF_CONFIG'])['task'])")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "task {'type': 'worker', 'index': 0}" in p.stdout
    assert "task {'type': 'worker', 'index': 1}" in p.stdout


def test_tfrun_stops_every_worker_when_one_fails_and_exits_with_its_code():
    """Worker 1 fails at once; worker 0 would wait forever (as in a collective): it is stopped."""
    code = "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(3)\ntime.sleep(120)\n"
    t = time.monotonic()
    p = _tfrun(code)
    assert p.returncode == 3
    assert time.monotonic() - t < 30
    assert "worker 1 exited with code 3; stopped the others" in p.stdout


def test_tfrun_reports_a_killed_worker_as_the_shell_does():
    p = _tfrun("import os, signal\nif os.environ['RANK'] == '0': os.kill(os.getpid(), 9)\n")
    assert p.returncode == 128 + 9  # what the supervisor classifies as killed (oom)


def test_tfrun_needs_a_worker_command():
    p = subprocess.run(
        [PYTHON, "-m", "trainscale.launch.tfrun", "--nproc=2"],
        env=run_env(),
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and "after --" in p.stderr


# --- the matrix -------------------------------------------------------------------------------


def test_tf_strategies_are_implemented_and_dropped_where_they_cannot_run():
    cfg = base_config(
        strategy=["tf", "tf-mirrored", "tf-multiworker"], workers=[1, 2], nodes=[1, 2]
    )
    runs, dropped = build_runs(cfg, accelerator="cpu")
    kept = {(r.strategy, r.workers, r.nodes) for r in runs}
    assert kept == {
        ("tf", 1, 1),
        ("tf-mirrored", 1, 1),
        ("tf-mirrored", 2, 1),  # logical CPU devices: kept, labelled in the metrics
        ("tf-multiworker", 1, 1),
        ("tf-multiworker", 2, 1),
        ("tf-multiworker", 1, 2),
        ("tf-multiworker", 2, 2),
    }
    reasons = {d.reason for d in dropped}
    assert "tf is one process on one device: needs workers=1, nodes=1" in reasons
    assert any(r.startswith("tf-mirrored (MirroredStrategy) is one process") for r in reasons)
    assert all(r.framework == "tensorflow" for r in runs)


def test_conda_env_is_complete_for_the_tf_runner_and_holds_no_torch():
    deps = load_yaml(ROOT / "envs" / "tensorflow.yaml")["dependencies"]
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    names = {line.split("==")[0] for line in pip}
    assert {"tensorflow", "tf-keras", "numpy", "scikit-learn", "pyyaml", "jsonschema"} <= names
    assert "torch" not in names and "tensorflow-cpu" not in names and "keras" not in names


def test_tf_runner_and_its_launchers_never_import_torch():
    """The conda env of TF runs has no torch: the runner, supervisor and tfrun must not need it."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import trainscale.launch.supervise, trainscale.launch.tfrun\n"
        "import trainscale.runners.tensorflow.tf\n"
        "import trainscale.runners.tensorflow.keras_loop, trainscale.measure.device_usage\n"
        "import tf_keras, tensorflow as tf\n"
        "assert tf.keras.__name__.startswith('tf_keras'), tf.keras.__name__\n"
        "print('ok', tf.__version__, tf_keras.__version__)\n"
    )
    p = subprocess.run(
        [PYTHON, "-c", code],
        env=run_env(TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "ok 2.21.0 2.21.0" in p.stdout


def test_multiworker_cluster_comes_from_srun_under_slurm(monkeypatch):
    """What every srun task of a 2-node × 2-worker tf-multiworker run resolves (task 3 here):
    the same cluster on every task, ports from the supervisor's TRAINSCALE_TF_PORT."""
    from trainscale.runners.tensorflow import tf as tf_runner

    runs, _ = build_runs(base_config(strategy=["tf-multiworker"], workers=[2], nodes=[2]))
    for k, v in {
        "TRAINSCALE_TF_CLUSTER": "slurm",
        "TRAINSCALE_TF_PORT": "29411",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    resolver, local_rank = tf_runner.cluster_resolver(runs[0], gpus=False)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["n1:29411", "n1:29412", "n2:29411", "n2:29412"]
    }
    assert (resolver.task_type, resolver.task_id, local_rank) == ("worker", 3, 1)
    assert resolver.num_accelerators() == {"GPU": 0}  # CPU workers: MWMS must not look for GPUs
    assert tf_runner.cluster_resolver(runs[0], gpus=True)[0].num_accelerators() == {"GPU": 1}


def test_multiworker_without_a_cluster_says_how_to_start_it(monkeypatch):
    from trainscale.runners.tensorflow import tf as tf_runner

    runs, _ = build_runs(base_config(strategy=["tf-multiworker"], workers=[2]))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TRAINSCALE_TF_CLUSTER", raising=False)
    with pytest.raises(RuntimeError, match="trainscale.launch.tfrun"):
        tf_runner.cluster_resolver(runs[0], gpus=False)


# --- the optimizer: PyTorch's update rules, step for step ------------------------------------


def _spec(**kw):
    cfg = validated({"study": "t", "matrix": {"strategy": ["tf"], "model": ["seed-small"],
                                              "dataset": ["digits"]}, **kw})  # fmt: skip
    return build_runs(cfg)[0][0]


@pytest.mark.parametrize(
    "optimizer",
    [
        {"name": "adam", "lr": 0.01},
        {"name": "adam", "lr": 0.01, "weight_decay": 0.1},
        {"name": "adamw", "lr": 0.01, "weight_decay": 0.1},
        {"name": "sgd", "lr": 0.1, "momentum": 0.9},
        {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.05},
    ],
    ids=["adam", "adam-l2", "adamw", "sgd-momentum", "sgd-l2"],
)
def test_keras_optimizer_follows_pytorch_step_for_step(optimizer):
    """Gradients kept away from zero: there Keras' Adam adds epsilon to sqrt(v) before the bias
    correction (PyTorch after it), a difference that only shows where sqrt(v) ~ eps."""
    from trainscale.runners.tensorflow import keras_loop

    spec = _spec(optimizer=optimizer)
    w0 = np.linspace(-1, 1, 6).astype(np.float32)
    target = w0 + np.float32(2.0)
    wt = torch.tensor(w0, requires_grad=True)
    adams = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    topt = adams.get(spec.optimizer, torch.optim.SGD)
    kw = {"betas": spec.betas, "eps": spec.eps} if spec.optimizer in adams else {}
    if spec.optimizer == "sgd":
        kw["momentum"] = spec.momentum
    topt = topt([wt], lr=spec.lr, weight_decay=spec.weight_decay, **kw)
    wk = keras_loop.tf.Variable(w0)
    kopt = keras_loop.make_optimizer(spec)
    for _ in range(5):
        loss = ((wt - torch.from_numpy(target)) ** 3).abs().sum()
        topt.zero_grad()
        loss.backward()
        topt.step()
        with keras_loop.tf.GradientTape() as tape:
            kloss = keras_loop.tf.reduce_sum(keras_loop.tf.abs((wk - target) ** 3))
        kopt.apply_gradients([(tape.gradient(kloss, wk), wk)])
    np.testing.assert_allclose(wk.numpy(), wt.detach().numpy(), rtol=1e-5, atol=1e-6)


# --- real runs ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_failing_worker_fails_the_run_and_is_recorded(tmp_path):
    """tf-multiworker with a dataset that is not there: both workers raise, tfrun exits non-zero,
    the supervisor records `failed` with the worker's exception."""
    runs, _ = build_runs(base_config(strategy=["tf-multiworker"], workers=[2], batch_size=[64]))
    s = dataclasses.replace(runs[0], dataset="mnist", data_dir=str(tmp_path / "nodata"))
    out = tmp_path / "metrics.json"
    p = launch(s, out, timeout=180)
    assert p.returncode == 0  # the job succeeds: the failure is a result
    rec = metrics.read(out)
    assert rec["status"] == "failed"
    assert "DataError" in rec["error"] and "trainscale.launch.tfrun: worker" in rec["error"]
    assert rec["launch"]["exit_code"] not in (0, None)


@pytest.fixture(scope="module")
def study(tf_study) -> dict[str, dict]:
    """`.test/tf.yaml` through Snakemake (conftest.tf_study, whose TensorFlow records
    tests/test_keras_loop.py reads too): metrics records by strategy."""
    return tf_study


STRATEGIES = ["torch", "torch-ddp", "tf", "tf-mirrored", "tf-multiworker"]


@pytest.mark.slow
def test_study_runs_every_tf_strategy_beside_pytorch(study):
    assert sorted(k for k in study if k != "_dir") == sorted(STRATEGIES)
    for s in STRATEGIES:
        rec = study[s]
        assert rec["status"] == "ok", rec["error"]
        assert rec["throughput"] > 0 and rec["first_epoch_seconds"] > 0
        assert rec["test"]["accuracy"] > 0.9  # chance is 0.1
        assert rec["epochs"][-1]["train_loss"] < rec["epochs"][0]["train_loss"]
        assert rec["model"]["params"] == 33_802  # the same network in both frameworks
        assert rec["data"]["train_samples"] == study["tf"]["data"]["train_samples"]
        assert [e["steps"] for e in rec["epochs"]] == [e["steps"] for e in study["tf"]["epochs"]]
    for s in ("tf", "tf-mirrored", "tf-multiworker"):
        rec = study[s]
        assert rec["env"]["frameworks"] == {"tensorflow": "2.21.0", "tf-keras": "2.21.0"}
        assert rec["device"]["kind"] == "cpu" and rec["memory"]["peak_device_bytes"] is None
        assert rec["memory"]["peak_host_rss_bytes"] > 200 * 2**20
        assert all(e["step_seconds_p50"] > 0 for e in rec["epochs"])
        assert rec["time_to_accuracy_seconds"] is not None  # target 0.9, per-epoch evaluation
    assert study["tf-mirrored"]["device"]["logical"] is True  # 2 logical CPU devices
    assert study["tf-mirrored"]["device"]["count"] == 2
    assert study["tf-mirrored"]["device"]["name"].endswith("(as 2 logical devices)")
    assert study["tf"]["device"]["logical"] is False
    assert study["tf-multiworker"]["device"]["count"] == 2
    assert study["tf-multiworker"]["device"]["logical"] is False
    assert "trainscale.launch.tfrun --nproc=2" in study["tf-multiworker"]["launch"]["command"]
    assert "TF_USE_LEGACY_KERAS=1" in study["tf"]["launch"]["command"]
    assert "TF_USE_LEGACY_KERAS" not in study["torch"]["launch"]["command"]
    flops = study["tf"]["flops"]  # Keras takes its torch twin's count (keras_flops)
    assert flops["method"] == "torch twin: flop_counter"
    assert flops["per_sample"] == study["torch"]["flops"]["per_sample"] > 0
    assert flops["peak_source"] == "measured" and 0 < flops["mfu"] <= 1
    results = study["_dir"]["results"]
    rows = list(csv.DictReader((results / "runs.csv").open()))
    assert {r["spec.strategy"] for r in rows} == set(STRATEGIES)
    assert {r["status"] for r in rows} == {"ok"}
    summary = (results / "summary.txt").read_text()
    assert all(s in summary for s in STRATEGIES)


@pytest.mark.slow
def test_convergence_parity_tf_and_torch_reach_the_same_accuracy(study):
    """Same data, seed, epochs, batch and Adam hyper-parameters: the same accuracy, within noise."""
    torch_acc, tf_acc = study["torch"]["test"]["accuracy"], study["tf"]["test"]["accuracy"]
    assert torch_acc > 0.95 and tf_acc > 0.95
    assert abs(tf_acc - torch_acc) <= ACCURACY_TOLERANCE, (tf_acc, torch_acc)


@pytest.mark.slow
def test_tf_data_parallelism_is_real(study):
    """tf-mirrored (2 replicas) and tf-multiworker (2 processes) each take a share of every global
    batch of the one-device run: the same losses and accuracy, not 2× the data or half."""
    base = study["tf"]
    for s in ("tf-mirrored", "tf-multiworker"):
        rec = study[s]
        assert rec["spec"]["global_batch_size"] == base["spec"]["global_batch_size"] == 64
        assert rec["spec"]["per_worker_batch_size"] == 32
        for a, b in zip(rec["epochs"], base["epochs"], strict=True):
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-3)
        assert abs(rec["test"]["accuracy"] - base["test"]["accuracy"]) <= 1 / 360 + 1e-9


#: tf-mirrored / tf-multiworker against tf, SGD without momentum: each replica's loss is scaled
#: by 1/global batch and the replicas' gradients summed, where one device averages all 64: the
#: same numbers up to float32 rounding (measured largest difference: 3e-8 for both);
#: rtol 1e-4 / atol 1e-5 allow ~300× that and stay far below a summed-for-averaged gradient,
#: which would double every step, a difference of the order of the training move (checked
#: ≥ tap.MIN_RELATIVE_MOVE). SGD has no optimizer state that Adam could renormalise a wrong
#: scale with.
RTOL, ATOL = 1e-4, 1e-5


@pytest.mark.slow
def test_tf_data_parallel_sgd_trains_one_devices_weights(tmp_path):
    """tf-mirrored (2 replicas) and tf-multiworker (2 processes) from the same initial weights
    as tf end with tf's weights, after training that moved them; every run's samples and
    throughput against the batches its replicas really took (Keras train_step calls)."""
    opt = {"name": "sgd", "lr": 0.05}
    finals, inits = {}, {}
    for strategy, workers in (("tf", 1), ("tf-mirrored", 2), ("tf-multiworker", 2)):
        cfg = base_config(strategy=[strategy], workers=[workers], batch_size=[64])
        spec = build_runs(validated({**cfg, "optimizer": opt}))[0][0]
        out, taps = tmp_path / strategy / "metrics.json", tmp_path / f"{strategy}-tap"
        w = tmp_path / f"{strategy}.npz"
        p = launch(spec, out, timeout=240, TRAINSCALE_SAVE_WEIGHTS=str(w), **tap.env(taps))
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        rec = metrics.read(out)
        assert rec["status"] == "ok", rec["error"]
        tap.assert_throughput_matches_the_work(rec, taps, feeds_per_step=workers)
        finals[strategy], inits[strategy] = tap.load(w), tap.initial_weights(taps)
    ref = finals["tf"]
    tap.assert_moved(inits["tf"], ref, "tf")
    for s in ("tf-mirrored", "tf-multiworker"):
        for k in ref:
            np.testing.assert_array_equal(inits[s][k], inits["tf"][k], err_msg=f"{s} init {k}")
        worst = max(float(np.abs(finals[s][k] - ref[k]).max()) for k in ref)
        print(f"largest difference {s} - tf: {worst:.2e}")
        for k in ref:
            np.testing.assert_allclose(finals[s][k], ref[k], rtol=RTOL, atol=ATOL, err_msg=k)
