"""`make gpu-check` on a node without GPUs, and the judgement it passes on a run's metrics.

The GPU paths themselves run in tests/test_gpu.py (marked `gpu`). Here: on this machine every
path is skipped, quickly, with exit 0; a node with a driver where torch sees no CUDA device
fails every path; and the verdict on a record, taken from a real run on this CPU, names what
is not a GPU run (device, device memory, NVML) and nothing else, and names a failed status, a
loss that is not finite and step times that cannot add up to the epoch."""

from __future__ import annotations

import copy
import subprocess

import pytest

from trainscale.gpu import check as gpu_check
from trainscale.gpu import paths
from trainscale.plan import matrix

from conftest import ROOT, run_env


def cuda_here() -> bool:
    return gpu_check.cuda_state()[0] != "none"


@pytest.mark.skipif(cuda_here(), reason="this node has an NVIDIA driver: tests/test_gpu.py")
def test_gpu_check_skips_every_path_without_cuda_and_exits_0(tmp_path):
    p = subprocess.run(
        ["make", "-s", "-o", ".venv/.installed", "gpu-check", f"GPU_CHECK_ARGS=--out {tmp_path}"],
        cwd=ROOT,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    devices, *lines = p.stdout.splitlines()
    assert devices == "device every framework: cpu (no NVIDIA driver on this node)"
    assert [ln.split()[0] for ln in lines] == gpu_check.names()
    assert all(ln.split(None, 1)[1] == "SKIP no CUDA device" for ln in lines), lines
    assert f"{len(gpu_check.names())} skipped" in p.stderr
    assert (tmp_path / "gpu-check.yaml").exists()


def test_the_paths_cover_what_the_issue_lists():
    names = set(gpu_check.names())
    assert {f"torch-cuda-{p}" for p in ("fp32", "bf16", "fp16")} <= names
    assert {f"deepspeed-zero{s}" for s in range(4)} <= names
    assert {"torch-ddp-nccl", "torch-fsdp-nccl", "torch-ddp-gloo-shared-gpu"} <= names
    assert {"collectives-nccl", "collectives-gloo-cuda", "torch-pipeline-2-stages"} <= names
    assert "lightning-ddp-nccl" in names
    assert {"cuda-oom", "horovod-torch-nccl", "tensorflow-gpu", "torch-tp-shared-gpu"} <= names
    assert names >= gpu_check.OPTIONAL
    with pytest.raises(KeyError, match="no GPU check 'torch-tpu'"):
        gpu_check.by_name("torch-tpu")


def test_every_training_path_is_a_run_the_matrix_builds():
    """Each path's study is valid and gives exactly one run on cuda (none dropped)."""
    cases = {
        "torch-ddp-gloo-shared-gpu": dict(strategy="torch-ddp", workers=2),
        "torch-pipeline-2-stages": dict(strategy="torch-pipeline", workers=2),
        "lightning-ddp-nccl": dict(strategy="lightning-ddp", precision="bf16"),
        "cuda-oom": dict(model="vgg19", dataset="synthetic-imagenet", scale=7, batch_size=8192),
        "torch-tp-shared-gpu": paths.TP_TWO_RANKS,  # launched as planned without the GPU count
        **{f"deepspeed-zero{s}": dict(strategy=f"deepspeed-zero{s}") for s in range(4)},
    }
    for name, values in cases.items():
        runs, dropped = matrix.build_runs(gpu_check.study(**values), "cuda")
        assert len(runs) == 1 and not dropped, (name, dropped)
    (oom,) = matrix.build_runs(gpu_check.study(**cases["cuda-oom"]), "cuda")[0]
    assert oom.per_worker_batch_size == 8192 and 1280 * 7 >= 8192  # one step, no evaluation
    # told the node has 1 GPU, the planner drops the TP cell (its matrix's only one) with its
    # reason: the check's first half, which failed on an H200 when the drop emptied the matrix
    assert paths.tp_kept_on_one_gpu() is None


def test_a_driver_without_cuda_in_torch_fails_every_path(monkeypatch, tmp_path):
    """A GPU node where torch is a CPU build must not pass by finding nothing to check."""
    monkeypatch.setattr(gpu_check.machine, "gpu_count", lambda: 1)  # /proc/driver/nvidia/gpus
    results = gpu_check.check_all(
        list(gpu_check.CHECKS), gpu_check.Context(out=tmp_path), echo=lambda _: None
    )
    assert {r.verdict for r in results} == {gpu_check.FAIL}
    assert "sees no CUDA device" in results[0].detail


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> gpu_check.Run:
    """A real torch run of the check's base study, launched as the check launches it (on CPU:
    the run is the same code; only the device differs). A cuda rank without a GPU fails its
    run, so the study says its GPUs are not real (`slurm.fake_gpus`), as a test cluster's."""
    ctx = gpu_check.Context(out=tmp_path_factory.mktemp("gpu-check"))
    return gpu_check.train(ctx, "torch-cuda-fp32", keys={"slurm": {"fake_gpus": True}})


def test_a_cpu_run_fails_for_being_on_cpu_only(cpu_run):
    assert cpu_run.record["status"] == "ok"
    why = gpu_check.gpu_run_problems(cpu_run)
    parts = why.split("; ")
    assert [p.split()[0] for p in parts] == ["device.kind", "peak_device_bytes", "NVML"], why
    assert gpu_check.gpu_run_problems(cpu_run, nvml=False).count(";") == 1


def as_gpu_run(run: gpu_check.Run) -> gpu_check.Run:
    """The CPU record as a GPU run would write it (device and NVML blocks filled)."""
    rec = copy.deepcopy(run.record)
    rec["device"].update(kind="cuda", utilization_mean=80.0, energy_joules=12.0)
    rec["memory"]["peak_device_bytes"] = 8 * rec["model"]["params"]
    rec["memory"]["peak_reserved_bytes"] = 10 * rec["model"]["params"]
    rec["memory"]["peak_nvml_process_bytes"] = 11 * rec["model"]["params"]
    return gpu_check.Run(rec, run.log, run.spec)


def test_a_real_record_with_gpu_blocks_passes(cpu_run):
    assert gpu_check.gpu_run_problems(as_gpu_run(cpu_run)) is None


def test_what_the_verdict_names(cpu_run):
    run = as_gpu_run(cpu_run)
    epoch2 = run.record["epochs"][1]
    epoch2["step_seconds_p50"] = epoch2["seconds"] / epoch2["steps"] / 20  # unsynchronised
    assert "unsynchronised timing" in gpu_check.gpu_run_problems(run)

    run = as_gpu_run(cpu_run)
    run.record["epochs"][1]["train_loss"] = float("nan")
    assert "train loss nan" in gpu_check.gpu_run_problems(run)

    run = as_gpu_run(cpu_run)
    run.record["memory"]["peak_device_bytes"] = 1000
    assert "below the weights'" in gpu_check.gpu_run_problems(run)

    run = as_gpu_run(cpu_run)  # the allocator's reserved peak, as lightning-ddp lacked it
    run.record["memory"]["peak_reserved_bytes"] = None
    assert "peak_reserved_bytes None missing" in gpu_check.gpu_run_problems(run)

    run = as_gpu_run(cpu_run)  # NVML read after Lightning's teardown emptied the cache
    run.record["memory"]["peak_nvml_process_bytes"] = 2 * run.record["model"]["params"]
    assert "peak_nvml_process_bytes" in gpu_check.gpu_run_problems(run)
    assert gpu_check.gpu_run_problems(run, nvml=False) is None  # no NVML, nothing to compare

    run = as_gpu_run(cpu_run)
    run.record.update(status="oom", error="out of memory\nCUDA out of memory. Tried to allocate")
    assert gpu_check.gpu_run_problems(run).startswith("status oom: out of memory CUDA out of")

    run = as_gpu_run(cpu_run)
    run.record["device"]["energy_joules"] = None
    run.log += "trainscale: no NVML readings for cuda:0: 2 NVML devices have a UUID …\n"
    assert "energy_joules None (trainscale: no NVML readings" in gpu_check.gpu_run_problems(run)


def test_run_check_turns_every_outcome_into_one_line(tmp_path):
    ctx = gpu_check.Context(out=tmp_path)

    def boom(_ctx):
        raise gpu_check.CheckFailed("first line\nsecond line")

    checks = [
        gpu_check.Check("a", "", lambda _: None),
        gpu_check.Check("b", "", boom),
        gpu_check.Check("c", "", lambda _: None, needs=("no_such_module_here",)),
        gpu_check.Check("d", "", lambda _: None, probe=lambda _: "a GPU build"),
        gpu_check.Check("e", "", lambda _: 1 / 0),
    ]
    lines = [gpu_check.run_check(c, ctx).line() for c in checks]
    assert [ln.split(None, 1)[1] for ln in lines] == [
        "PASS",
        "FAIL first line second line",
        "NOT INSTALLED no_such_module_here",
        "NOT INSTALLED a GPU build",
        "FAIL ZeroDivisionError: division by zero",
    ]
