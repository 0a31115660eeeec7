"""The machine a study is planned on: its NVIDIA GPUs (how many, their names) read from the
driver's /proc entries without importing CUDA, how many CUDA_VISIBLE_DEVICES lets its
processes use, what config `accelerator: auto` resolves to, and what a study run here (not
through a cluster profile) asks of it that it does not have.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from trainscale.plan.runspec import RunSpec


def gpu_count() -> int:
    """NVIDIA GPUs on this host, from the driver's /proc entries (no CUDA import)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return sum(1 for _ in gpus.iterdir()) if gpus.is_dir() else 0


def visible_gpus(environ: Mapping[str, str] = os.environ) -> int:
    """The GPUs this host's processes may use: its GPUs, fewer where CUDA_VISIBLE_DEVICES lists
    fewer (an empty list: none), as CUDA itself counts them."""
    have = gpu_count()
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return have
    return min(have, len([e for e in listed.split(",") if e.strip()]))


def why_no_gpu(
    framework: str,
    devices: int,
    cuda_build: str | None,
    host_gpus: int,
    driver: str | None,
    visible: str | None,
) -> str | None:
    """Why `framework` (with `cuda_build`, the CUDA it was built for, None for a CPU build)
    sees no GPU: `devices` it counts, `host_gpus` the driver lists, `visible` the
    CUDA_VISIBLE_DEVICES it ran under. None when it has one."""
    if devices > 0:
        return None
    if not cuda_build:
        return (
            f"{framework} is built without CUDA (a CPU build): install its CUDA build "
            "(`make setup` on a host with an NVIDIA driver, docs/gpu-cluster.md)"
        )
    if host_gpus == 0:
        return (
            "no GPU visible: the host has no NVIDIA driver or GPU (/proc/driver/nvidia/gpus "
            "is empty); ask SLURM for GPUs (gres) or set `slurm.fake_gpus: true` for a test "
            "cluster whose GPUs are not real"
        )
    if visible is not None and not [v for v in visible.split(",") if v.strip()]:
        return f"no GPU visible: CUDA_VISIBLE_DEVICES={visible!r} hides the host's {host_gpus}"
    return (
        f"the host has {host_gpus} NVIDIA GPU(s) (driver {driver or 'unknown'}) but "
        f"{framework}, built for CUDA {cuda_build}, can use none: the driver is too old for "
        f"CUDA {cuda_build}, or its libraries are missing (`trainscale gpu-check` on the node)"
    )


def detect_accelerator(setting: str = "auto") -> str:
    """Resolve config `accelerator`: 'auto' means 'cuda' when this host has NVIDIA GPUs."""
    if setting != "auto":
        return setting
    return "cuda" if gpu_count() else "cpu"


def capacity_problems(runs: list[RunSpec], accelerator: str, cpus: int, gpus: int) -> list[str]:
    """What runs ask of this one machine that it does not have (for studies run here, not
    through a cluster profile): several nodes, or more workers than GPUs or CPU cores (on CPU
    a worker stands for a device and needs a core of its own)."""
    problems = []
    nodes = sorted({r.nodes for r in runs if r.nodes > 1})
    if nodes:
        problems.append(
            f"matrix.nodes {nodes}: runs across nodes need a cluster; run with "
            "--profile profiles/slurm (docs/slurm.md), or use nodes: [1] here"
        )
    if accelerator == "cuda" and gpus == 0:  # the runs would fail at once (device_check)
        return [
            *problems,
            "accelerator: cuda, and this machine has no CUDA GPU visible (no NVIDIA driver, "
            "or CUDA_VISIBLE_DEVICES hides them): its runs would train on no GPU; use "
            "accelerator: cpu (or auto) here, or run on a GPU cluster (--profile profiles/slurm)",
        ]
    have, unit = (gpus, "GPUs") if accelerator == "cuda" else (cpus, "CPU cores")
    workers = sorted({r.workers for r in runs if r.workers > have})
    if workers:
        problems.append(
            f"matrix.workers {workers}: this machine has {have} {unit}, and a worker needs one; "
            f"use workers up to {have}, exclude those cells, or run on a cluster "
            "(--profile profiles/slurm)"
        )
    return problems


def gpu_names(root: Path = Path("/proc/driver/nvidia/gpus")) -> list[str]:
    """The model names of this host's NVIDIA GPUs, from the driver's /proc entries (as
    `gpu_count` counts them, without importing CUDA)."""
    names = set()
    for info in sorted(root.glob("*/information")) if root.is_dir() else []:
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                names.add(line.split(":", 1)[1].strip())
    return sorted(names)
