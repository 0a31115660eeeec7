"""What a run's ranks saw of their environment, for the record's `env` block: the variables
that decide how NCCL, CUDA, OpenMP and Horovod behave (`env.variables`), and NCCL's version
(`env.nccl`). A multi-node result without them cannot be interpreted: on InfiniBand clusters
NCCL_IB_HCA, NCCL_SOCKET_IFNAME and friends decide whether the runs used the fabric.

Read in rank 0's process (the record's writer): every rank starts from the same launch line,
so rank 0's view is the ranks'.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

#: variables recorded whatever their name's source (set by the user, the cluster, the image)
PREFIXES = ("NCCL_", "CUDA_", "TORCH_NCCL_", "OMP_", "HOROVOD_")
#: the study's config `env`, as the Snakefile handed it to the job (launch.container)
STUDY_ENV = "TRAINSCALE_ENV"


def seen(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every NCCL_*, CUDA_*, TORCH_NCCL_*, OMP_* and HOROVOD_* variable of `environ` and every
    name config `env` set, sorted by name."""
    environ = os.environ if environ is None else environ
    try:
        study = set(json.loads(environ.get(STUDY_ENV) or "{}"))
    except ValueError:
        study = set()
    return {k: v for k, v in sorted(environ.items()) if k.startswith(PREFIXES) or k in study}


_LIBNCCL = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)")


def nccl_version() -> str | None:
    """The NCCL this process uses: PyTorch's (torch.cuda.nccl.version(), where torch is loaded
    and has CUDA), else the version in the file name of a libnccl loaded in this process
    (TensorFlow, Horovod); None without NCCL (a CPU build)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.version.cuda:
        try:
            version = torch.cuda.nccl.version()
            return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception:  # no NCCL in this build, or no driver to load it
            pass
    try:
        found = _LIBNCCL.search(Path("/proc/self/maps").read_text())
    except OSError:
        return None
    return found.group(1) if found else None
