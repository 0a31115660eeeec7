"""Nothing silently on the CPU: a rank of an `accelerator: cuda` run without a usable GPU
stops the run with the host, the rank and why; `slurm.fake_gpus` is the one way a cuda study's
ranks train on the CPU (a test cluster's gres GPUs). And the inner srun asks for each task's
CPUs, and its GPU where a task is one worker."""

import dataclasses
import socket

import pytest
import torch

from trainscale.launch import commands
from trainscale.plan.machine import why_no_gpu
from trainscale.plan.matrix import build_runs
from trainscale.runners import device_check
from trainscale.runners.device_check import NoUsableGpu
from trainscale.runners.torch.torch_parts import rank_device

from conftest import base_config


def test_why_no_gpu_names_the_cause():
    assert why_no_gpu("torch", 1, "13.0", 1, "580.1", None) is None
    assert "built without CUDA" in why_no_gpu("torch 2.13.0+cpu", 0, None, 8, "580.1", None)
    assert "no GPU visible" in why_no_gpu("torch", 0, "13.0", 0, None, None)
    hidden = why_no_gpu("torch", 0, "13.0", 8, "580.1", "")
    assert "CUDA_VISIBLE_DEVICES=''" in hidden and "8" in hidden
    old = why_no_gpu("TensorFlow 2.21.0", 0, "12.5", 8, "535.104", "0,1")
    assert "driver 535.104" in old and "too old for CUDA 12.5" in old


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here")
def test_a_cuda_rank_without_a_gpu_fails_naming_host_rank_and_cuda(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu07")
    with pytest.raises(NoUsableGpu) as e:
        rank_device(1, 2, "cuda")
    message = str(e.value)
    assert "accelerator cuda: rank 3 on host gpu07 has no usable CUDA GPU" in message
    assert "instead of training on the CPU" in message
    assert rank_device(1, 2, "cpu") == (torch.device("cpu"), False)


def test_process_rank_reads_the_launchers_variables(monkeypatch):
    for name in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    assert device_check.process_rank() == 0
    monkeypatch.setenv("SLURM_PROCID", "5")
    assert device_check.process_rank() == 5
    assert socket.gethostname()  # the host the error names outside SLURM


def test_fake_gpus_is_the_only_way_a_cuda_study_trains_on_the_cpu():
    cfg = base_config(strategy=["torch-ddp"], workers=[1])
    assert {r.accelerator for r in build_runs(cfg, "cuda")[0]} == {"cuda"}
    assert {r.accelerator for r in build_runs(cfg, "cpu")[0]} == {"cpu"}
    fake = {**cfg, "slurm": {"fake_gpus": True}}
    assert {r.accelerator for r in build_runs(fake, "cuda")[0]} == {"cpu"}


def test_srun_asks_for_each_tasks_cpus_and_one_gpu_per_worker_task():
    cfg = base_config(strategy=["torch-ddp", "tf-multiworker"], workers=[4], nodes=[2])
    cfg["threads_per_worker"] = 3
    ddp, tf = sorted(build_runs(cfg, "cuda")[0], key=lambda r: r.strategy)
    # torchrun: one task per node holding its 4 workers; its GPUs come with the job's gres
    assert commands.srun(ddp, 1) == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                                     "--cpus-per-task=12", "--kill-on-bad-exit=1"]  # fmt: skip
    # tf-multiworker: a task per worker, each with its threads and a GPU of its own
    per_worker = ["--cpus-per-task=3", "--gpus-per-task=1", "--gpu-bind=per_task:1"]
    assert commands.srun(tf, 4)[4:] == [*per_worker, "--kill-on-bad-exit=1"]
    on_cpu = dataclasses.replace(tf, accelerator="cpu")
    assert "--gpus-per-task=1" not in commands.srun(on_cpu, 4)


def test_a_horovod_cuda_cell_needs_horovod_built_with_nccl():
    device_check.require_nccl("cpu", False, 0)  # gloo is what a CPU cell uses
    device_check.require_nccl("cuda", True, 0)
    with pytest.raises(NoUsableGpu, match=r"Horovod is built without NCCL .*make horovod"):
        device_check.require_nccl("cuda", False, 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here")
def test_tensorflow_finds_no_gpu_for_a_cuda_run():
    """The Keras strategies pick their GPUs through physical_gpus: none on cuda stops the run."""
    pytest.importorskip("tensorflow")
    from trainscale.runners.tensorflow import keras_loop

    spec = build_runs(base_config(strategy=["tf"]), "cpu")[0][0]
    assert keras_loop.physical_gpus(spec) == []
    with pytest.raises(NoUsableGpu, match=r"has no usable CUDA GPU for TensorFlow 2\."):
        keras_loop.physical_gpus(dataclasses.replace(spec, accelerator="cuda"))
