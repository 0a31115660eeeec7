"""`python -m trainscale.gpu.stack`: after `make setup` on a host with an NVIDIA driver, does
the venv's CUDA stack fit it? torch must be its CUDA build, and the driver new enough for the
CUDA torch was built for (torch==2.13.0 from PyPI: CUDA 13, driver 580 or newer); exit 1 with
both versions named otherwise, and where a CUDA 12 wheel replaced one of torch's library files.
TensorFlow's CUDA libraries (tensorflow[and-cuda], CUDA 12) are reported, not required:
TensorFlow cells need them, the rest do not.

`--tensorflow-cuda` prints the wheels `make setup` installs for TensorFlow: tensorflow[and-cuda]'s
but its cuDNN and NCCL, whose CUDA 12 wheels write the same files as torch's CUDA 13 ones
(nvidia/cudnn/lib/libcudnn*.so.9, nvidia/nccl/lib/libnccl.so.2, by both wheels' file lists):
installed beside torch, the one installed last replaces the other's libraries."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re
import sys
from pathlib import Path

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


#: a wheel of tensorflow[and-cuda] whose files only TensorFlow's CUDA 12 libraries bring: they
#: are installed where it is. Not the module nvidia.cudnn: torch's CUDA 13 wheels install
#: nvidia-cudnn-cu13 there too (nvidia/cudnn/lib/libcudnn.so.9, seen on an H200 with torch
#: 2.11.0+cu130 and no TensorFlow), and setup leaves nvidia-cudnn-cu12 out
TF_CUDA = "nvidia-cublas-cu12"
#: TensorFlow's CUDA 12 wheel -> torch's CUDA 13 wheel that installs the same files
SHARED_FILES = {"nvidia-cudnn-cu12": "nvidia-cudnn-cu13", "nvidia-nccl-cu12": "nvidia-nccl-cu13"}


def installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def tensorflow_cuda(requires: list[str]) -> list[str]:
    """tensorflow[and-cuda]'s own requirements (from TensorFlow's metadata) but the wheels
    whose files are torch's too: what `make setup` installs for TensorFlow on a GPU host."""
    extra = re.compile(r";\s*extra\s*==\s*[\"']and-cuda[\"']\s*$")
    wanted = [r.split(";")[0].strip() for r in requires if extra.search(r)]
    return [r for r in wanted if re.split(r"[<>=!~ ]", r)[0] not in SHARED_FILES]


def replaced(path: list[str] | None = None) -> list[str]:
    """torch's CUDA 13 library files that hold a CUDA 12 wheel's bytes now (that wheel was
    installed after torch's): one line per file, by the hashes in both wheels' RECORD."""
    dists = {canonical(d.metadata["Name"]): d for d in importlib.metadata.distributions(path=path)}
    lines = []
    for tf_name, torch_name in SHARED_FILES.items():
        theirs, ours = dists.get(tf_name), dists.get(torch_name)
        if theirs is None or ours is None:
            continue
        their_files = {str(f) for f in theirs.files or ()}
        for f in ours.files or ():
            if f.hash is None or str(f) not in their_files:
                continue
            if sha256(Path(f.locate())) != f.hash.value:
                lines.append(f"{f} is {tf_name}'s, not {torch_name} {ours.version}'s")
    return lines


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str | None:
    """The file's hash as RECORD writes it (urlsafe base64, no padding); None: no file."""
    try:
        digest = hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def replaced_problem(lines: list[str]) -> list[str]:
    if not lines:
        return []
    pins = " ".join(f"{n}=={importlib.metadata.version(n)}" for n in SHARED_FILES.values()
                    if installed(n))  # fmt: skip
    return [
        f"{len(lines)} of torch's CUDA 13 library files hold TensorFlow's CUDA 12 build "
        f"({lines[0]}{', …' if len(lines) > 1 else ''}): torch would load libraries it was "
        f"not built with; put torch's back: pip install --force-reinstall --no-deps {pins}"
    ]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--tensorflow-cuda"]:
        print("\n".join(tensorflow_cuda(importlib.metadata.requires("tensorflow") or [])))
        return 0
    import torch

    found = problems(metrics.driver_version(), torch.version.cuda, torch.__version__)
    found += replaced_problem(replaced())
    tf_cuda = installed(TF_CUDA)
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
