"""Horovod (horovod-torch, horovod-keras, horovod-torch-elastic): the build, host discovery,
and real 2-worker CPU runs (horovodrun over gloo) through Snakemake beside torch-ddp."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from trainscale import data
from trainscale.launch import horovod_hosts
from trainscale.measure import metrics
from trainscale.models import torch_models as models
from trainscale.plan.matrix import build_runs

import tap
from conftest import PYTHON, ROOT, launch_losing_a_worker, validated

#: |test accuracy(horovod-*) - test accuracy(torch-ddp)| on digits. Same tolerance and reasons
#: as tests/test_tf.py (run-to-run noise of one accuracy on 360 test images is ~0.008);
#: horovod-torch differs from DDP only in Horovod's optimizer-state broadcast (Adam's step count
#: starts at 1), horovod-keras in framework (initial weights and data order).
ACCURACY_TOLERANCE = 0.03
STRATEGIES = ["torch-ddp", "horovod-torch", "horovod-keras", "horovod-torch-elastic"]


def test_horovod_is_built_with_torch_tensorflow_and_gloo():
    """`horovodrun --check-build` of the wheel scripts/build-horovod.sh installed."""
    p = subprocess.run(
        [str(Path(PYTHON).parent / "horovodrun"), "--check-build"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Horovod v0.28.1" in p.stdout
    for line in ("[X] TensorFlow", "[X] PyTorch", "[X] Gloo"):
        assert line in p.stdout, p.stdout


def test_build_script_edits_are_scripted_and_explained():
    """The edits to Horovod's source live in the script as sed lines, each after a comment."""
    text = (ROOT / "scripts" / "build-horovod.sh").read_text()
    assert "HOROVOD_VERSION=0.28.1" in text
    assert text.count("sed -i") == 4 and "# Edit 3: leave out the XLA ops" in text
    assert "# Edit 4: no debug info" in text and 'sha256sum "${BASH_SOURCE[0]}"' in text
    assert "--no-deps" in text and "--no-build-isolation" in text


@pytest.mark.parametrize(
    "environ, lines",
    [
        ({}, ["localhost:2"]),
        ({"SLURM_JOB_NODELIST": "n[1-2]"}, ["n1:2", "n2:2"]),
    ],
    ids=["local", "slurm"],
)
def test_discovery_lists_this_host_or_the_allocation(environ, lines):
    assert horovod_hosts.hosts(2, environ) == lines


def test_discovery_lists_the_jobs_nodes_the_launcher_gives_it():
    """Snakemake's jobstep drops SLURM_JOB_NODELIST: the launcher passes the job's nodes."""
    assert horovod_hosts.hosts(4, {}, ("gpu01", "gpu02")) == ["gpu01:4", "gpu02:4"]
    assert horovod_hosts.hosts(4, {"SLURM_JOB_NODELIST": "n1"}, ("g1",)) == ["g1:4"]


def test_discovery_follows_the_hosts_file(tmp_path):
    f = tmp_path / "hosts"
    env = {"TRAINSCALE_HOROVOD_HOSTS": str(f), "SLURM_JOB_NODELIST": "n1"}
    assert horovod_hosts.hosts(2, env) == []  # no file yet: no host available
    f.write_text("localhost:1\n\n")
    assert horovod_hosts.hosts(2, env) == ["localhost:1"]


# --- real runs ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def study(horovod_study) -> dict:
    """`.test/horovod.yaml` through Snakemake (conftest.horovod_study, shared with
    tests/test_torch_loop.py and test_keras_loop.py): records by strategy; every rank's final
    weights."""
    return horovod_study


@pytest.mark.slow
def test_study_runs_every_horovod_strategy(study):
    recs = study["recs"]
    assert sorted(recs) == sorted(STRATEGIES)
    for s in STRATEGIES[1:]:
        rec, path = recs[s]
        assert rec["status"] == "ok", rec["error"]
        assert rec["throughput"] > 0 and rec["device"]["count"] == 2
        assert rec["test"]["accuracy"] > 0.8  # chance is 0.1
        assert rec["model"]["params"] == 33_802
        assert rec["env"]["frameworks"]["horovod"] == "0.28.1"
        assert "horovod.runner.launch --gloo -np 2" in rec["launch"]["command"]
        assert "OMP_NUM_THREADS=1" in rec["launch"]["command"]
        assert [e["steps"] for e in rec["epochs"]] == [
            e["steps"] for e in recs["torch-ddp"][0]["epochs"]
        ]
        # the study switches Horovod's timeline on: a Chrome trace beside the metrics
        timeline = path.parent / "horovod-timeline.json"
        assert study["workdir"] / rec["horovod"]["timeline"] == timeline
        assert timeline.stat().st_size > 0 and "ALLREDUCE" in timeline.read_text()
        assert rec["horovod"]["final_world_size"] == 2
    membership = recs["horovod-torch-elastic"][0]["horovod"]["membership"]
    assert [(m["after_epoch"], m["world_size"]) for m in membership] == [(0, 2)]
    assert "membership" not in recs["horovod-torch"][0]["horovod"]
    assert "TF_USE_LEGACY_KERAS=1" in recs["horovod-keras"][0]["launch"]["command"]


@pytest.mark.slow
def test_ranks_end_with_identical_weights(study):
    """Horovod averages gradients and broadcast the start: both ranks hold the same model."""
    w = study["weights"]
    torch.manual_seed(0)  # the study's seed, as the runners seed it just before they build
    info = data.info("digits")
    init = models.build("seed-small", info.shape, info.num_classes).state_dict()
    for s in ("horovod-torch", "horovod-torch-elastic"):
        a, b = (tap.final_weights(study["tap"], s, r) for r in (0, 1))
        # equal ranks prove nothing if nothing trained: the weights moved from the start
        tap.assert_moved({k: v.float().numpy() for k, v in init.items()}, a, s)
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{s} {k}")
    a, b = (np.load(w / f"horovod-keras-{r}.npz") for r in (0, 1))
    assert len(a.files) == len(b.files) > 0
    for k in a.files:
        np.testing.assert_array_equal(a[k], b[k], err_msg=f"horovod-keras {k}")


@pytest.mark.slow
def test_horovod_and_ddp_reach_the_same_accuracy(study):
    ddp = study["recs"]["torch-ddp"][0]["test"]["accuracy"]
    for s in STRATEGIES[1:]:
        acc = study["recs"][s][0]["test"]["accuracy"]
        assert abs(acc - ddp) <= ACCURACY_TOLERANCE, (s, acc, ddp)


@pytest.mark.slow
def test_elastic_run_finishes_with_fewer_workers_when_one_is_removed(tmp_path):
    """The discovery script's hosts file drops from 2 slots to 1 after epoch 1: Horovod
    re-forms the ring with one worker, the run completes all its epochs and records the change."""
    m = {"strategy": ["horovod-torch-elastic"], "model": ["seed-small"], "dataset": ["digits"]}
    # epochs long enough (scale 4) and enough of them that Horovod's host discovery (polled
    # about once a second) sees the change before the last epoch even on a loaded machine
    m |= {"workers": [2], "batch_size": [64], "scale": [4]}
    spec = build_runs(validated({"study": "t", "epochs": 6, "matrix": m}))[0][0]
    # horovodrun prefixes each worker's lines
    out, log = launch_losing_a_worker(spec, tmp_path, when="]<stdout>:epoch 1/6")
    rec = metrics.read(out)
    assert rec["status"] == "ok", rec["error"]
    assert len(rec["epochs"]) == 6 and rec["test"]["accuracy"] > 0.8, log[-3000:]
    changes = [(m["after_epoch"], m["world_size"]) for m in rec["horovod"]["membership"]]
    assert changes[0] == (0, 2) and changes[-1][1] == 1, changes
    assert 1 <= changes[-1][0] <= 5, changes
    assert rec["horovod"]["final_world_size"] == 1 and rec["device"]["count"] == 1
    # the global batch stays the spec's: one worker then takes all of it, steps are unchanged
    assert {e["steps"] for e in rec["epochs"]} == {89}  # 4 × 1437 // 64


#: Horovod against one process / one device, SGD without momentum: Horovod averages the two
#: ranks' half-batch gradients (allreduce, op Average) where one process averages 64: equal up
#: to float32 rounding; rtol 1e-4 / atol 1e-5 allow ~300× the largest difference measured
#: (3e-8, horovod-torch) and stay far below a summed gradient's doubled steps, a difference of
#: the order of the training move (checked ≥ tap.MIN_RELATIVE_MOVE). SGD has no optimizer
#: state, so Horovod's state broadcast cannot differ from one process here.
RTOL, ATOL = 1e-4, 1e-5


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, reference", [("horovod-torch", "torch"), ("horovod-keras", "tf")]
)
def test_horovod_with_sgd_trains_one_process_weights(tmp_path, strategy, reference):
    """2 Horovod workers × 32 against one process × 64 of the same framework, from the same
    initial weights, after training that moved them; samples and throughput against the
    batches the ranks really fed."""
    from conftest import launch

    m = {"model": ["seed-small"], "dataset": ["digits"], "batch_size": [64], "exclude": []}
    opt = {"name": "sgd", "lr": 0.05}
    ext = ".npz" if reference == "tf" else ".pt"
    finals, inits = {}, {}
    for s, workers in ((reference, 1), (strategy, 2)):
        cfg = {
            "study": "t",
            "optimizer": opt,
            "matrix": m | {"strategy": [s], "workers": [workers]},
        }
        spec = build_runs(validated(cfg))[0][0]
        out, taps = tmp_path / s / "metrics.json", tmp_path / f"{s}-tap"
        # every Horovod rank saves its own weights; the one process at the path as given
        save = str(tmp_path / (f"{s}-{{rank}}{ext}" if s == strategy else f"{s}{ext}"))
        p = launch(spec, out, timeout=240, TRAINSCALE_SAVE_WEIGHTS=save, **tap.env(taps))
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        rec = metrics.read(out)
        assert rec["status"] == "ok", rec["error"]
        tap.assert_throughput_matches_the_work(rec, taps, feeds_per_step=workers)
        if reference == "torch":  # rank 0's, from the test plug-in
            finals[s] = tap.final_weights(taps, s)
        else:  # Horovod's Keras runner fills in {rank}; one process writes the path as given
            finals[s] = tap.load(Path(save.format(rank=0) if s == strategy else save))
        inits[s] = tap.initial_weights(taps)
    ref, hvd = finals[reference], finals[strategy]
    for k in inits[reference]:
        np.testing.assert_array_equal(inits[strategy][k], inits[reference][k], err_msg=k)
    tap.assert_moved(inits[reference], ref, reference)
    worst = max(float(np.abs(hvd[k] - ref[k]).max()) for k in ref)
    print(f"largest difference {strategy} - {reference}: {worst:.2e}")
    for k in ref:
        np.testing.assert_allclose(hvd[k], ref[k], rtol=RTOL, atol=ATOL, err_msg=k)


def test_hvdrun_stops_a_nodes_workers_once_one_fails():
    """A failed worker ends its node's others at once (a peer would wait in a collective)."""
    import subprocess
    import sys
    import time

    from trainscale.launch import hvdrun

    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]),
             subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])]  # fmt: skip
    assert hvdrun.wait_all(procs, every=0.1) == 3 and time.perf_counter() - t0 < 30
    assert hvdrun.route_interface("127.0.0.1") == "lo"
