"""Config `container`, `env` and `slurm`: where a study runs, checked before any job.

They stay outside the run spec (the launcher reads them from the job's environment,
trainscale.launch.container; the SLURM request from config `slurm`), so changing them re-runs
nothing. This module says which values cannot work (`problems`), which cells they rule out
(`why_not`), and what a study run on this machine lacks (`local_problems`). Imports no
framework.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import Any

from trainscale.plan import catalog
from trainscale.plan.studyconfig import StudyConfig

#: variables trainscale sets for each run or rank itself: config `env` may not set them
RESERVED = frozenset(
    ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
     "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
     "TF_CONFIG", "PYTHONPATH", "TORCH_EXTENSIONS_DIR", "HOROVOD_TIMELINE")
)  # fmt: skip
_WHY_RESERVED = {
    "OMP_NUM_THREADS": "threads_per_worker",
    "MKL_NUM_THREADS": "threads_per_worker",
    "OPENBLAS_NUM_THREADS": "threads_per_worker",
    "HOROVOD_TIMELINE": "horovod_timeline",
}


def problems(env: Mapping[str, str]) -> list[str]:
    """Config `env`'s names that trainscale sets itself, each with the key that sets it."""
    out = []
    for name in env:
        if name in RESERVED or name.startswith("TRAINSCALE_"):
            key = _WHY_RESERVED.get(name)
            fix = f"set {key} instead" if key else "remove it from env"
            out.append(
                f"env.{name}: trainscale sets {name} for each run or rank itself (the launcher "
                f"and the run's rendezvous depend on it); {fix}"
            )
    return out


def why_not(values: dict, study: StudyConfig, accelerator: str) -> str | None:
    """The reason config `slurm` or `container` rules this cell out, or None."""
    gpus = study.slurm.get("gpus_per_node")
    if accelerator == "cuda" and gpus and values["workers"] > gpus:
        return (
            f"workers {values['workers']} per node: slurm.gpus_per_node is {gpus}, and a "
            "worker needs a GPU of its own"
        )
    image = study.container
    launcher = catalog.STRATEGIES[values["strategy"]].launcher
    if image and launcher == "horovodrun" and values["nodes"] > 1:
        return (
            f"{values['strategy']}: across nodes Horovod's workers start outside the "
            f"{image.get('runtime', 'apptainer')} container (horovodrun's over ssh, "
            "hvdrun's srun tasks not wrapped in the image in this version): across nodes run "
            "Horovod without `container`, or on one node"
        )
    return None


def local_problems(image: Mapping[str, Any] | None, which=shutil.which) -> list[str]:
    """What a study run on this machine (not through a SLURM profile) needs of it for its
    container (config `container`, `image`): pyxis is a SLURM plugin, and apptainer must be
    installed."""
    if not image:
        return []
    runtime = image.get("runtime", "apptainer")
    if runtime == "pyxis":
        return [
            "container.runtime pyxis: srun --container-image needs a SLURM cluster with the "
            "pyxis plugin; run with --profile profiles/slurm there, or use runtime apptainer"
        ]
    if which("apptainer") is None:
        return [
            "container.runtime apptainer: no `apptainer` on PATH here; install Apptainer "
            "(docs/gpu-cluster.md), or remove `container` to run in this venv"
        ]
    return []
