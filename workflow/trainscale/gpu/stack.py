"""`python -m trainscale.gpu.stack`: after `make setup` on a host with an NVIDIA driver, does
the venv's CUDA stack fit it? torch must be its CUDA build, and the driver new enough for the
CUDA torch was built for (torch==2.13.0 from PyPI: CUDA 13, driver 580 or newer); exit 1 with
both versions named otherwise. TensorFlow's CUDA libraries (tensorflow[and-cuda], CUDA 12) are
reported, not required: TensorFlow cells need them, the rest do not."""

from __future__ import annotations

import importlib.metadata
import sys

from trainscale.gpu.doctor import driver_too_old
from trainscale.measure import metrics

#: the CUDA of requirements.txt's torch==2.13.0 as PyPI serves it (PyTorch's stable CUDA since
#: 2.11, pytorch/pytorch#177975; 13.0 for 2.13, pytorch/pytorch#190355): envs/trainscale.def's
#: base image has the same major version, and the nodes need driver 580 or newer
PINNED_TORCH_CUDA = "13.0"


def problems(driver: str | None, torch_cuda: str | None, torch_version: str) -> list[str]:
    """What keeps torch from this host's GPUs: a CPU build, or a driver too old for its CUDA."""
    if torch_cuda is None:
        return [
            f"torch {torch_version} is a CPU build on a host with an NVIDIA driver "
            f"({driver or 'version unknown'}): pip took it from its settings (`pip config "
            "list`: find-links, index-url); install PyPI's torch==2.13.0 (CUDA 13)"
        ]
    old = driver_too_old(driver, torch_cuda)
    return [f"{old}: torch {torch_version} cannot use this host's GPUs"] if old else []


#: the cuDNN wheel of tensorflow[and-cuda] (CUDA 12). Not the module nvidia.cudnn: torch's
#: CUDA 13 wheels install nvidia-cudnn-cu13 there too (nvidia/cudnn/lib/libcudnn.so.9, seen on
#: an H200 with torch 2.11.0+cu130 and no TensorFlow)
TF_CUDNN = "nvidia-cudnn-cu12"


def installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def main() -> int:
    import torch

    found = problems(metrics.driver_version(), torch.version.cuda, torch.__version__)
    tf_cuda = installed(TF_CUDNN)
    print(
        f"gpu stack: driver {metrics.driver_version()}, torch {torch.__version__} "
        f"(CUDA {torch.version.cuda}), TensorFlow's CUDA libraries "
        f"{'installed' if tf_cuda else 'missing'}",
        file=sys.stderr,
    )
    for p in found:
        print(f"gpu stack: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
