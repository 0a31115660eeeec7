"""Which device each framework of a node would train on (`trainscale gpu-check` prints it
first): torch, TensorFlow, Horovod's NCCL and DeepSpeed's ops each find CUDA their own way, and
one of them can miss it while the others see it (TensorFlow without its CUDA libraries, Horovod
built without NCCL). Each is asked in a process of its own, as a run would ask."""

from __future__ import annotations

import subprocess
import sys

#: framework -> a program printing the device it would use
PROBES: dict[str, str] = {
    "torch": (
        "import torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0;"
        "print(f'cuda: {n} × {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})' if n"
        " else f'cpu (torch {torch.__version__}, CUDA build {torch.version.cuda})')"
    ),
    "tensorflow": (
        "import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'; import tensorflow as tf;"
        "g = tf.config.list_physical_devices('GPU'); b = tf.sysconfig.get_build_info();"
        "print(f'cuda: {len(g)} GPU(s) (CUDA {b.get(\"cuda_version\")})' if g else"
        " f'cpu (CUDA build {b.get(\"cuda_version\")}; its CUDA libraries: tensorflow[and-cuda])')"
    ),
    "horovod (NCCL)": (
        "import horovod.torch as hvd;"
        "print('nccl: GPU all-reduce' if hvd.nccl_built() else 'gloo only: built without NCCL')"
    ),
    "deepspeed (ops)": (
        "from deepspeed.accelerator import get_accelerator;"
        "print(get_accelerator().device_name(), 'accelerator')"
    ),
}


def device_of(framework: str, python: str = sys.executable, timeout: float = 120) -> str:
    """The device `framework` would use on this node, or why it cannot say."""
    try:
        done = subprocess.run(
            [python, "-c", PROBES[framework]], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout:.0f} s"
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"not usable: {last}"
    return done.stdout.strip().splitlines()[-1]


def lines() -> list[str]:
    """One line per framework: `device <framework>: <device>`."""
    return [f"device {name}: {device_of(name)}" for name in PROBES]
