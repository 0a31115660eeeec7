"""The all-reduce benchmark (trainscale.measure.collectives) and the communication model
(aggregate.communication_frame), checked against hand computations."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from test_aggregate import ok_record, spec_for, write

from trainscale.analysis import aggregate
from trainscale.analysis.study import Study
from trainscale.measure import collectives
from trainscale.runners import collectives as benchmark


def fake_collectives(path: Path, seconds: dict[int, list[float]], workers: int = 2) -> Path:
    """A benchmark file as the `collectives` rule writes it, with given raw timings."""
    n = workers
    rows = []
    for size, ts in sorted(seconds.items()):
        med = sorted(ts)[len(ts) // 2]  # odd counts: the median is the middle value
        rows.append(
            {
                "bytes": size,
                "seconds": ts,
                "p50_seconds": med,
                "p95_seconds": max(ts),
                "algbw_bytes_per_second": size / med,
                "busbw_bytes_per_second": size / med * 2 * (n - 1) / n,
                "algbw_p95_bytes_per_second": size / max(ts),
                "busbw_p95_bytes_per_second": size / max(ts) * 2 * (n - 1) / n,
            }
        )
    rec = {
        "schema": "trainscale.collectives/1",
        "collective": "all_reduce",
        "backend": "gloo",
        "workers": workers,
        "nodes": 1,
        "world_size": n,
        "sizes": rows,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))
    return path


def test_sizes_and_bus_factor():
    assert collectives.sizes(5000) == [1024, 2048, 4096, 8192]
    assert collectives.sizes(4096) == [1024, 2048, 4096]
    assert collectives.sizes(10) == [1024]
    assert [collectives.bus_factor(n) for n in (1, 2, 4, 8)] == [0.0, 1.0, 1.5, 1.75]


def test_summary_follows_the_nccl_tests_definitions():
    ts = [0.004, 0.001, 0.002, 0.003, 0.010]
    r = collectives.summarise(8192, ts, 4)
    assert r["seconds"] == ts
    assert r["p50_seconds"] == 0.003
    assert r["p95_seconds"] == pytest.approx(0.003 * 0 + 0.004 + (0.010 - 0.004) * 0.8)
    assert r["algbw_bytes_per_second"] == pytest.approx(8192 / 0.003)
    assert r["busbw_bytes_per_second"] == pytest.approx(8192 / 0.003 * 1.5)
    assert r["busbw_p95_bytes_per_second"] == pytest.approx(8192 / r["p95_seconds"] * 1.5)


def test_communication_model_by_hand(tmp_path):
    """torch-ddp N=1 and N=2 and torch-fsdp N=2, 1000 parameters (S = 4000 bytes), 1000
    samples per epoch, batch 64 global (32 per worker at N=2 → 15 steps per epoch)."""
    runs = tmp_path / "runs"
    paths = []
    for strategy, workers, t in (
        ("torch-ddp", 1, 1.0),
        ("torch-ddp", 2, 0.8),
        ("torch-fsdp", 2, 1.2),
    ):
        s = spec_for(strategy, workers)
        paths.append(write(runs, s, ok_record(s, [t, t])))
    study = Study.build(paths)
    bench = fake_collectives(
        tmp_path / "c.json", {1024: [1e-3] * 3, 2048: [1e-3, 2e-3, 3e-3], 4096: [2e-3] * 3}
    )
    coll = aggregate.collectives_frame([bench])
    comm = aggregate.communication_frame(study.scaling, study.runs, coll)
    assert sorted(comm["strategy"]) == ["torch-ddp", "torch-fsdp"]  # N > 1 only

    b2048, b4096 = 2048 / 2e-3, 4096 / 2e-3  # busbw = S / t_p50 · 2(2 − 1)/2
    bw = b2048 + (b4096 - b2048) * (math.log2(4000) - 11)  # linear in log2(size)
    t_ddp = 1.0 * 1.0 * 4000 / bw
    steps = (1000 // 2) // 32
    ddp = comm[comm["strategy"] == "torch-ddp"].iloc[0]
    assert ddp["backend"] == "gloo" and ddp["gradient_bytes"] == 4000
    assert ddp["busbw_bytes_per_second"] == pytest.approx(bw)
    assert ddp["predicted_comm_seconds"] == pytest.approx(t_ddp)
    assert ddp["steps_per_epoch"] == steps == 15
    assert ddp["measured_step_seconds"] == pytest.approx(0.8 / steps)
    assert ddp["comm_share"] == pytest.approx(t_ddp / (0.8 / steps))
    assert ddp["network_bound_efficiency"] == pytest.approx(0.5 / (0.5 + steps * t_ddp))
    assert ddp["efficiency"] == pytest.approx(1.0 / (2 * 0.8))
    assert ddp["note"] == ""

    fsdp = comm[comm["strategy"] == "torch-fsdp"].iloc[0]
    assert fsdp["allreduce_volume"] == 1.5
    assert fsdp["predicted_comm_seconds"] == pytest.approx(1.5 * t_ddp)
    assert math.isnan(fsdp["network_bound_efficiency"])  # no torch-fsdp N = 1 run
    assert "no N=1 run of torch-fsdp" in fsdp["note"]

    # without a benchmark the cells are listed with the reason, not dropped
    none = aggregate.communication_frame(study.scaling, study.runs, aggregate.collectives_frame([]))
    assert len(none) == 2 and none["predicted_comm_seconds"].isna().all()
    assert none["note"].str.contains("no all-reduce benchmark for gloo").all()
    assert aggregate.gradient_bytes("deepspeed-zero2", "bf16", 10) == 20
    assert aggregate.gradient_bytes("torch-fsdp", "bf16", 10) == 40  # reduced in fp32


def test_a_file_that_is_not_a_benchmark_is_refused(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ValueError, match="not a trainscale.collectives/1 file"):
        collectives.read(p)


def check_busbw_from_raw_timings(path: Path) -> dict:
    """Recompute every size's busbw from the raw timings in a real benchmark file, without the
    module's code: median by sorting, busbw = S / t · 2(n − 1)/n."""
    rec = json.loads(path.read_text())
    n = rec["world_size"]
    assert rec["collective"] == "all_reduce" and n == rec["workers"] * rec["nodes"]
    sizes = [r["bytes"] for r in rec["sizes"]]
    assert sizes[0] == 1024 and all(b == 2 * a for a, b in itertools.pairwise(sizes))
    assert sizes[-1] >= rec["max_bytes"]
    if len(sizes) > 1:
        assert rec["max_bytes"] > sizes[-2]
    for r in rec["sizes"]:
        ts = sorted(r["seconds"])
        assert len(ts) == rec["iters"] and all(t > 0 for t in ts)
        mid = len(ts) // 2
        median = ts[mid] if len(ts) % 2 else (ts[mid - 1] + ts[mid]) / 2
        busbw = r["bytes"] / median * 2 * (n - 1) / n
        assert r["busbw_bytes_per_second"] == pytest.approx(busbw, rel=1e-12)
        assert r["algbw_bytes_per_second"] == pytest.approx(r["bytes"] / median, rel=1e-12)
        assert ts[0] <= r["p95_seconds"] <= ts[-1]
    return rec


def test_a_benchmark_that_cannot_run_is_recorded_with_its_reason_and_hosts(tmp_path):
    """nccl on a machine without GPUs (as on the fake-GPU SLURM nodes): the real benchmark,
    under torchrun, ends with a `failed` record naming why and where every rank ran, exit 0,
    so the study's tables and report are built around it."""
    import subprocess

    from trainscale.measure import metrics

    from conftest import PYTHON, ROOT, run_env

    def benchmark(*argv: str) -> None:
        p = subprocess.run(
            [PYTHON, "-m", "trainscale.runners.collectives", "--workers", "2", *argv],
            cwd=ROOT,
            env=run_env(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert p.returncode == 0, p.stdout + p.stderr

    out = tmp_path / "nccl.json"
    benchmark("--backend", "nccl", "--max-bytes", "4096", "--out", str(out))
    rec = collectives.read(out)
    assert rec["status"] == "failed" and rec["sizes"] == []
    assert "nccl needs a GPU for every rank" in rec["error"]
    assert rec["rank_hosts"] == [metrics.hostname()] * 2

    # gloo with CUDA tensors (--device cuda) needs a GPU too, shared by the ranks if need be
    cuda = tmp_path / "gloo-cuda.json"
    benchmark("--backend", "gloo", "--device", "cuda", "--max-bytes", "4096", "--out", str(cuda))
    rec = collectives.read(cuda)
    assert rec["status"] == "failed" and "gloo needs a GPU for CUDA tensors" in rec["error"]

    # a crash before any result (an unknown backend torchrun cannot start) is recorded too
    bad = tmp_path / "bad.json"
    benchmark("--model", "nope:digits", "--out", str(bad), "--timeout-minutes", "2")
    crash = collectives.read(bad)
    assert crash["status"] == "failed" and "exited with code" in crash["error"]

    # the tables keep it as one row with its error; the communication model says why
    table = aggregate.collectives_frame([out])
    assert list(table["status"]) == ["failed"] and len(aggregate.measured_collectives(table)) == 0
    assert "nccl needs a GPU" in aggregate.failed_collectives(table)["error"].iloc[0]


def test_nccl_with_host_tensors_is_refused_before_anything_starts(capsys):
    with pytest.raises(SystemExit):
        benchmark.main(["--backend", "nccl", "--device", "cpu", "--workers", "1",
                          "--max-bytes", "4096", "--out", "x.json"])  # fmt: skip
    assert "--backend nccl reduces CUDA tensors only: drop --device cpu" in capsys.readouterr().err


def test_the_benchmark_asks_slurm_for_what_a_run_of_its_shape_asks_for():
    """One request function: a collectives job of W workers × N nodes = a torch-ddp run's."""
    from trainscale.launch import supervise as launch
    from trainscale.plan.matrix import build_runs

    from conftest import base_config

    for workers, nodes, acc in [(2, 1, "cpu"), (1, 2, "cpu"), (4, 2, "cuda")]:
        cfg = base_config(strategy=["torch-ddp"], workers=[workers], nodes=[nodes])
        run = build_runs(cfg, acc)[0][0]
        bench = launch.slurm_request(workers, nodes, run.threads_per_worker, acc, 10)
        assert bench == {**launch.slurm_resources(run, acc), "runtime": 15}
        assert set(bench) <= set(launch.SLURM_RESOURCE_KEYS)


def test_the_benchmark_across_slurm_nodes_starts_one_torchrun_per_node_by_srun():
    """The benchmark's shape goes through the same launcher as a training run's."""
    from trainscale.launch.supervise import Environment, torchrun

    env = Environment(mode="slurm", nodes=("n0", "n1"), port=1, job_id="1")
    cmd = torchrun(benchmark.Sweep("s", workers=1, nodes=2), env, ["-m", "x"])
    assert cmd[:6] == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=1",
        "--kill-on-bad-exit=1",
    ]
