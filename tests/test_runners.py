"""Real training runs through the real launcher (torchrun, gloo) on CPU."""

import dataclasses

import numpy as np
import pytest

from trainscale.measure import metrics
from trainscale.plan.matrix import build_runs

import tap
from conftest import launch, validated

pytestmark = pytest.mark.slow


def make(strategy, workers=1, **kw):
    m = {
        "strategy": [strategy],
        "model": ["seed-small"],
        "dataset": ["digits"],
        "workers": [workers],
        "batch_size": [64],
    }
    runs, _ = build_runs(validated({"study": "t", "matrix": m, **kw}))
    return runs[0]


#: DDP against one process: each step sums two half-batch mean gradients and halves the sum
#: (gloo all-reduce, then DDP's division) where one process takes the mean of 64: the same
#: number up to float32 rounding. Over 44 steps the largest difference measured is 3e-8 (SGD)
#: and 6e-8 (Adam); rtol 1e-4 / atol 1e-5 allow ~200× that and stay far below a wrong update:
#: with SGD (no momentum) a summed gradient doubles every step (planted once: largest
#: difference 0.088; Adam, nearly blind to the scale: 1.6e-4), a difference of the order of the
#: training move itself (relative move ≥ tap.MIN_RELATIVE_MOVE, checked; measured 0.24 / 0.58).
RTOL, ATOL = 1e-4, 1e-5


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_ddp_with_two_workers_matches_one_process_on_the_same_data_order(tmp_path, optimizer):
    """Data parallelism is real: 2 ranks × 32 samples give the same weights as 1 × 64, from the
    same initial weights, after training that moved them. SGD without momentum would expose
    a summed instead of averaged gradient (Adam is almost blind to a constant gradient scale).
    Both runs' samples and throughput are checked against the batches the ranks really fed."""
    opt = {"name": optimizer, "lr": 0.05 if optimizer == "sgd" else 0.001}
    single = make("torch", optimizer=opt)
    ddp = make("torch-ddp", workers=2, optimizer=opt)
    assert (single.global_batch_size, ddp.global_batch_size, ddp.per_worker_batch_size) == (
        64,
        64,
        32,
    )
    weights, inits = {}, {}
    for s, feeds_per_step in ((single, 1), (ddp, 2)):
        out = tmp_path / s.strategy / "metrics.json"
        taps = tmp_path / f"{s.strategy}-tap"
        p = launch(s, out, **tap.env(taps))
        assert p.returncode == 0, p.stdout + p.stderr
        rec = metrics.read(out)
        assert rec["status"] == "ok", rec["error"]
        assert [e["steps"] for e in rec["epochs"]] == [22, 22]  # 1437 // 64, both runs
        tap.assert_throughput_matches_the_work(rec, taps, feeds_per_step)
        weights[s.strategy] = tap.final_weights(taps, s.strategy)
        inits[s.strategy] = tap.initial_weights(taps)
    for k, v in inits["torch"].items():  # the same start (seeded), so the end must match too
        np.testing.assert_array_equal(inits["torch-ddp"][k], v, err_msg=k)
    a, b = weights["torch"], weights["torch-ddp"]
    tap.assert_moved(inits["torch"], a, "torch")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=RTOL, atol=ATOL, err_msg=k)


def test_ddp_metrics_are_complete_and_sane(tmp_path):
    s = make("torch-ddp", workers=2)
    out = tmp_path / "metrics.json"
    p = launch(s, out)
    assert p.returncode == 0, p.stdout + p.stderr
    rec = metrics.read(out)
    assert rec["status"] == "ok"
    assert rec["spec"] == s.to_dict()
    assert rec["model"]["params"] > 0 and rec["data"]["train_samples"] == 1437
    assert len(rec["epochs"]) == 2 and rec["throughput"] > 0
    assert rec["throughput_per_worker"] == pytest.approx(rec["throughput"] / 2)
    # chance is 0.1; measured for seeds 0-4 (Adam, 2 epochs, scale 1): 0.847-0.911, 0.911 at
    # seed 0 (DDP equals one process here): 0.8 leaves a margin of ~1.5 seed-to-seed ranges
    assert rec["test"]["accuracy"] > 0.8
    assert rec["memory"]["peak_host_rss_bytes"] > 50 * 2**20
    assert rec["memory"]["peak_device_bytes"] is None and rec["device"]["kind"] == "cpu"
    # CPU busy share of each worker's thread budget over the timed epochs (device_usage): a
    # worker that trains is busy part of its epochs, how much depends on what else wants the 2
    # cores (13% beside the suite's other tests and the SLURM tests); no RAPL counter here, so
    # no energy
    assert 0 < rec["device"]["utilization_mean"] <= 100
    assert rec["device"]["energy_joules"] is None or rec["device"]["energy_joules"] > 0
    assert len(rec["memory"]["per_rank_host_rss_bytes"]) == 2
    assert rec["launch"]["command"].count("torch.distributed.run") == 1
    assert rec["env"]["frameworks"]["torch"].startswith("2.13.0")
    assert rec["oversubscribed"] is False


def test_oversubscribed_run_is_flagged(tmp_path):
    s = make("torch-ddp", workers=2, threads_per_worker=2)
    out = tmp_path / "metrics.json"
    p = launch(s, out)
    rec = metrics.read(out)
    # the failure record sets the same flag: only a run that trained proves the runner's check
    assert p.returncode == 0 and rec["status"] == "ok", (rec["error"], p.stderr[-2000:])
    assert rec["epochs"] and rec["oversubscribed"] is (metrics.cpu_count() < 4)


def test_a_run_that_raises_is_recorded_as_failed_with_its_traceback(tmp_path):
    s = dataclasses.replace(
        make("torch-ddp", workers=2), dataset="mnist", data_dir=str(tmp_path / "nodata")
    )
    out = tmp_path / "metrics.json"
    p = launch(s, out)
    assert p.returncode == 0  # the job itself succeeds: the failure is a result
    rec = metrics.read(out)
    assert rec["status"] == "failed"
    assert "before writing metrics" in rec["error"]
    assert "DataError" in rec["error"] and "train-images-idx3-ubyte.gz" in rec["error"]
    assert rec["spec"] == s.to_dict()


def test_a_run_past_its_timeout_is_killed_and_recorded(tmp_path):
    s = dataclasses.replace(make("torch-ddp", workers=2), timeout_minutes=0.02)
    out = tmp_path / "metrics.json"
    p = launch(s, out)
    assert p.returncode == 0
    rec = metrics.read(out)
    assert rec["status"] == "timeout" and "timeout_minutes=0.02" in rec["error"]
    assert rec["wall_seconds"] < 30


def test_on_failure_stop_fails_the_job_but_keeps_the_record(tmp_path):
    import subprocess

    from conftest import PYTHON, ROOT, run_env

    s = dataclasses.replace(make("torch"), dataset="mnist", data_dir=str(tmp_path / "none"))
    out = tmp_path / "metrics.json"
    p = subprocess.run(
        [
            PYTHON,
            "-m",
            "trainscale.launch",
            "--spec",
            s.to_json(),
            "--out",
            str(out),
            "--on-failure",
            "stop",
        ],
        cwd=ROOT,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1
    assert metrics.read(out)["status"] == "failed"


def test_ranks_take_the_gpus_in_turn_and_share_one_over_gloo(monkeypatch):
    """Two ranks on one GPU (as `make gpu-check` runs them) both use cuda:0, not cuda:1, and
    their process group is gloo, since NCCL refuses two ranks on one device (seen on an H100:
    "invalid device ordinal" before this)."""
    import torch

    from trainscale.runners.torch.torch_parts import group_backend, rank_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert rank_device(1, 2) == (torch.device("cuda:0"), True)
    assert group_backend(*rank_device(1, 2)) == "gloo"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert rank_device(3, 4) == (torch.device("cuda:3"), False)
    assert group_backend(*rank_device(3, 4)) == "nccl"
    assert rank_device(5, 8) == (torch.device("cuda:1"), True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert rank_device(1, 2) == (torch.device("cpu"), False)
    assert group_backend(*rank_device(1, 2)) == "gloo"


def test_energy_counts_each_gpus_counter_once():
    """Two ranks on one GPU read one NVML counter: the run's energy is that GPU's, not twice
    it; ranks on GPUs of their own add up; ranks without a reading (RAPL is read by one
    process per host) add nothing; no reading at all is None, never 0."""
    from trainscale.measure.device_usage import energy_once_per_device as once

    assert once([100.0, 100.5], [("n1", "GPU-a"), ("n1", "GPU-a")]) == 100.0
    assert once([100.0, 80.0], [("n1", "GPU-a"), ("n1", "GPU-b")]) == 180.0
    assert once([100.0, 80.0], [("n1", "GPU-a"), ("n2", "GPU-a")]) == 180.0  # other host
    assert once([50.0, None, 40.0, None], [("n1", None)] * 2 + [("n2", None)] * 2) == 90.0
    assert once([None, None], [("n1", "GPU-a"), ("n1", "GPU-b")]) is None
