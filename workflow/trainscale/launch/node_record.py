"""What the supervisor adds to a run's record about the node it ran on: NCCL's transport,
read from every rank's output as it streams past (measure.nccl_log), the node's GPUs where the
run could not say (a failure record: measure.node_state), and `nvidia-smi topo -m` saved beside
the job's log (how the node's GPUs, NICs and CPUs connect: NVLink or PCIe, which NIC is near
which GPU), where nvidia-smi exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from trainscale.measure import metrics, node_state

#: NCCL's INFO lines of its set-up only (INIT: the channels and the transport each uses, once
#: at the first collective), which the supervisor reads for env.nccl.transport
NCCL_DEBUG = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"}


def nccl_debug(accelerator: str, environ: dict[str, str]) -> dict[str, str]:
    """The variables a cuda run's ranks start with so that NCCL names its transport, where
    neither the caller's environment nor config `env` (set on the launch line, which wins)
    sets NCCL_DEBUG."""
    if accelerator != "cuda" or "NCCL_DEBUG" in environ:
        return {}
    return dict(NCCL_DEBUG)


def log_path() -> Path | None:
    """The file this process's stdout goes to (the job's log: Snakemake's `> {log}`), if a
    regular file."""
    try:
        target = Path(os.readlink("/proc/self/fd/1"))
    except OSError:
        return None
    return target if target.is_file() else None


def save_topology(out: Path) -> Path | None:
    """`nvidia-smi topo -m` beside the job's log (`<log>.topo.txt`), else beside the record
    (`topo.txt`); None where there is no nvidia-smi or it fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        found = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if found.returncode:
        return None
    log = log_path()
    where = log.with_name(log.name + ".topo.txt") if log else out.parent / "topo.txt"
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(found.stdout)
    return where


def stamp(rec: dict, transport: str | None) -> dict:
    """`env.nccl.transport` from the ranks' output, and `env.gpus` of this node where the run
    wrote none (a record written in the run's place)."""
    nccl = rec["env"].get("nccl")
    version = nccl.get("version") if isinstance(nccl, dict) else nccl
    rec["env"]["nccl"] = {"version": version, "transport": transport}
    if not rec["env"].get("gpus"):
        rec["env"]["gpus"] = node_state.block([], node_state.read(), metrics.hostname())
    return rec
