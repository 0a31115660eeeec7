"""A rank of an `accelerator: cuda` run that finds no usable GPU stops the run: it never
trains on the CPU instead. A study's answer ranks its cells by speed; one cell silently on the
CPU (a node with an old driver, TensorFlow without its CUDA libraries) would be ranked as if
it had run on GPUs.

`plan.machine.why_no_gpu` says why from what a framework reports (pure: `trainscale doctor`
says the same); `require_gpu` raises with the host, the rank and that reason. The runners
call it where they pick a device (runners.torch.torch_parts.rank_device,
runners.tensorflow.keras_loop.physical_gpus).
"""

from __future__ import annotations

import os

from trainscale.measure import metrics
from trainscale.plan import machine


class NoUsableGpu(RuntimeError):
    """A rank of a cuda run found no GPU it can use; the message names host, rank and why."""


def process_rank() -> int:
    """This process's global rank as its launcher set it (torchrun, srun, Horovod, MPI);
    0 for one process."""
    for name in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        if (value := os.environ.get(name, "")).isdigit():
            return int(value)
    return 0


def require_gpu(
    accelerator: str, framework: str, devices: int, cuda_build: str | None, rank: int
) -> None:
    """Raise NoUsableGpu where a run of `accelerator` cuda finds no GPU (`devices` is 0)."""
    if accelerator != "cuda" or devices > 0:
        return
    why = machine.why_no_gpu(
        framework,
        devices,
        cuda_build,
        machine.gpu_count(),
        metrics.driver_version(),
        os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
    raise NoUsableGpu(
        f"accelerator cuda: rank {rank} on host {metrics.hostname()} has no usable CUDA GPU "
        f"for {framework}: {why}. The run stops instead of training on the CPU."
    )


def require_nccl(accelerator: str, nccl_built: bool, rank: int) -> None:
    """A Horovod CUDA cell whose Horovod was built without NCCL would all-reduce over gloo
    on host copies (scripts/build-horovod.sh builds gloo-only where it finds no nvcc): a
    different measurement under the same name. It stops instead."""
    if accelerator == "cuda" and not nccl_built:
        raise NoUsableGpu(
            f"accelerator cuda: rank {rank} on host {metrics.hostname()}: Horovod is built "
            "without NCCL (hvd.nccl_built() is false), so its all-reduce would run over gloo on "
            "the CPU; rebuild it where nvcc and torch's CUDA are (`make horovod` on a GPU node, "
            "scripts/build-horovod.sh)"
        )
