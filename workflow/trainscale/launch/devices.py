"""What one task of a job really sees: host, SLURM task, visible GPUs (as SLURM exported them,
as `nvidia-smi -L` lists them, as torch counts them). The `check` target runs it in every task
of each allocation shape, because some sites expose fewer GPUs to a task than were allocated.

    python -m trainscale.launch.devices        # one line, for this process
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess


def nvidia_smi() -> str:
    """`nvidia-smi -L` as one line, or why there is none."""
    if not shutil.which("nvidia-smi"):
        return "no nvidia-smi"
    p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    lines = (p.stdout or p.stderr).strip().splitlines()
    return "; ".join(lines) or f"nvidia-smi exited {p.returncode}"


def torch_devices() -> str:
    try:
        import torch
    except ImportError:
        return "torch not importable"
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = [torch.cuda.get_device_name(i) for i in range(n)]
    cpus = len(os.sched_getaffinity(0))
    return f"{n} cuda device(s)" + (f" {names}" if names else f", {cpus} cpus")


def describe(environ: dict[str, str] | None = None) -> str:
    """One line: which task, on which node, seeing which devices."""
    env = os.environ if environ is None else environ
    task = f"task {env.get('SLURM_PROCID', '0')}/{env.get('SLURM_NTASKS', '1')}"
    host = env.get("SLURMD_NODENAME") or socket.gethostname()
    keys = ("SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
    seen = " ".join(f"{k}={env.get(k, '-')}" for k in keys)
    return f"{task} on {host}: {seen} | nvidia-smi -L: {nvidia_smi()} | torch: {torch_devices()}"


if __name__ == "__main__":
    print(describe(), flush=True)
