"""`trainscale doctor [--profile slurm] [STUDY]`: is each node fit to run the study, before
any of it runs? One line per node, `<host>: PASS <what it has>` or `<host>: FAIL <reason>`,
and exit 1 when any node fails.

Without --profile it checks this node; with `--profile slurm` one short SLURM job step of one
task per node (the study's most nodes, its GPUs, constraint and exclusivity: config `slurm`)
runs the same check on each. On an `accelerator: cuda` study a node fails where torch sees
no GPU (no device, a CPU build, a driver too old for torch's CUDA: runners.device_check),
sees fewer than a cell needs, or where a GPU reports uncorrected ECC errors or hardware clock
slowdowns (measure.node_state). On a CPU study (or `slurm.fake_gpus`) it reports the CPUs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainscale.measure import metrics, node_state
from trainscale.plan import machine
from trainscale.plan.machine import why_no_gpu
from trainscale.plan.matrix import train_on

#: the oldest Linux driver each CUDA major version runs on (NVIDIA's CUDA toolkit release
#: notes, "minor version compatibility": 12.x needs 525.60.13, 13.x needs 580)
MIN_DRIVER = {12: (525, 60, 13), 13: (580, 0, 0)}
#: clock event reasons that mean the hardware holds a GPU back (not idling or a set clock)
HARDWARE_SLOWDOWNS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def driver_too_old(driver: str | None, cuda: str | None) -> str | None:
    """Why `driver` cannot run a framework built for CUDA `cuda`, naming both; None if it can
    (or either is unknown)."""
    if not driver or not cuda:
        return None
    need = MIN_DRIVER.get(version_tuple(cuda)[0])
    if need is None or version_tuple(driver) >= need:
        return None
    return (
        f"driver {driver} is too old for CUDA {cuda}, which needs driver "
        f"{'.'.join(map(str, need))} or newer"
    )


@dataclass(frozen=True)
class NodeFacts:
    """What one node offers a study's ranks."""

    host: str
    accelerator: str  # what the study's ranks train on here (cpu, cuda)
    cpus: int  # CPUs this process may use
    host_gpus: int  # NVIDIA GPUs the driver lists
    visible: str | None  # CUDA_VISIBLE_DEVICES
    driver: str | None
    torch: str
    torch_cuda: str | None  # the CUDA torch is built for; None for a CPU build
    torch_devices: int  # GPUs torch can use
    needed_gpus: int  # the most a cell's ranks need on one node
    gpus: list = field(default_factory=list)  # node_state.GpuState of each GPU


def gpu_problems(gpus: list[node_state.GpuState]) -> list[str]:
    """GPUs that would skew a timing: uncorrected ECC errors, hardware clock slowdowns."""
    found = []
    for g in gpus:
        if g.ecc_errors and g.ecc_errors.get("uncorrected"):
            found.append(f"GPU {g.index} has {g.ecc_errors['uncorrected']} uncorrected ECC errors")
        if slow := [r for r in g.throttle_reasons if r in HARDWARE_SLOWDOWNS]:
            found.append(f"GPU {g.index} clocks held down by {', '.join(slow)}")
    return found


def verdict(f: NodeFacts) -> str:
    """The node's line: `<host>: PASS <what it has>` or `<host>: FAIL <reason>`."""
    if f.accelerator != "cuda":
        return f"{f.host}: PASS cpu: {f.cpus} CPUs for the ranks, torch {f.torch}"
    why = why_no_gpu(
        f"torch {f.torch}", f.torch_devices, f.torch_cuda, f.host_gpus, f.driver, f.visible
    )
    why = why or driver_too_old(f.driver, f.torch_cuda)
    if why is None and f.torch_devices < f.needed_gpus:
        why = f"torch sees {f.torch_devices} GPU(s), a cell needs {f.needed_gpus} on one node"
    if why is None and (bad := gpu_problems(f.gpus)):
        why = "; ".join(bad)
    if why:
        return f"{f.host}: FAIL {why}"
    name = f.gpus[0].name if f.gpus else "GPU"
    return (
        f"{f.host}: PASS {f.torch_devices} × {name}, driver {f.driver}, torch {f.torch} "
        f"(CUDA {f.torch_cuda}), {f.cpus} CPUs"
    )


def this_node(accelerator: str, needed_gpus: int) -> NodeFacts:
    """This node's facts (imports torch)."""
    import torch

    cuda = accelerator == "cuda"
    return NodeFacts(
        host=metrics.hostname(),
        accelerator=accelerator,
        cpus=metrics.cpu_count(),
        host_gpus=machine.gpu_count(),
        visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
        driver=metrics.driver_version(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        torch_devices=torch.cuda.device_count() if cuda and torch.cuda.is_available() else 0,
        needed_gpus=needed_gpus,
        gpus=node_state.read() if cuda else [],
    )


@dataclass(frozen=True)
class Asked:
    """What a study asks of its nodes."""

    accelerator: str  # what its ranks train on (cpu, cuda)
    nodes: int  # the most nodes a cell spans
    gpus: int  # GPUs a job asks of each node
    options: Mapping = field(default_factory=dict)  # config `slurm`


def asked_by(config: dict | None) -> Asked:
    """A study's ask (its accelerator resolved as the planner resolves it); without a study,
    this node's own accelerator on one node."""
    if config is None:
        return Asked(machine.detect_accelerator("auto"), 1, 1)
    accelerator = train_on(machine.detect_accelerator(config["accelerator"]), config.get("slurm"))
    slurm = config.get("slurm") or {}
    workers = max(config["matrix"]["workers"])
    return Asked(accelerator, max(config["matrix"]["nodes"]), slurm.get("gpus_per_node") or workers,
                 slurm)  # fmt: skip


def srun_line(asked: Asked, python: str) -> list[str]:
    """One task on each of the study's nodes, asking for a job's GPUs, constraint and
    exclusivity, running this check there."""
    line = ["srun", f"--nodes={asked.nodes}", "--ntasks-per-node=1", "--time=10"]
    gres_asked = asked.accelerator == "cuda" or asked.options.get("fake_gpus")
    if gres_asked:
        line.append(f"--gres=gpu:{asked.gpus}")
    if asked.options.get("constraint"):
        line.append(f"--constraint={asked.options['constraint']}")
    if asked.options.get("exclusive"):
        line.append("--exclusive")
    check = ["-m", "trainscale", "doctor", "--node", "--accelerator", asked.accelerator]
    return [*line, python, *check, "--gpus", str(asked.gpus if asked.accelerator == "cuda" else 0)]


def on_slurm(asked: Asked) -> int:
    """Run the check on each node through srun; print each node's line."""
    try:
        done = subprocess.run(srun_line(asked, sys.executable), capture_output=True, text=True)
    except OSError as e:
        print(f"slurm: FAIL srun cannot start ({e.strerror}): is this a SLURM login node?")
        return 1
    lines = sorted(ln for ln in done.stdout.splitlines() if ": PASS" in ln or ": FAIL" in ln)
    print("\n".join(lines) if lines else f"slurm: FAIL srun: {done.stderr.strip()[-500:]}")
    return 1 if done.returncode or not lines or any(": FAIL" in ln for ln in lines) else 0


DESCRIPTION = (
    "Check that each node can run a study before it runs: one PASS or FAIL line per node, "
    "exit 1 when any fails. Without --profile this node; with --profile slurm each of the "
    "study's nodes through srun."
)


def main(argv: list[str] | None = None, prog: str = "trainscale doctor") -> int:
    from trainscale.plan.check import load_config

    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    p.add_argument("study", nargs="?", help="the study's config file (default: this node alone)")
    p.add_argument("--profile", help="slurm (or a path ending in it): check the study's nodes")
    p.add_argument("--base", type=Path, default=None, help="the config laid under STUDY")
    p.add_argument("--node", action="store_true", help=argparse.SUPPRESS)  # srun's task
    p.add_argument("--accelerator", default="cpu", help=argparse.SUPPRESS)
    p.add_argument("--gpus", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.node:
        line = verdict(this_node(args.accelerator, args.gpus))
        print(line, flush=True)
        return 1 if ": FAIL" in line else 0
    config = None
    if args.study:
        config, problems = load_config(args.study, args.base)
        if problems:
            p.error("; ".join(problems))
    asked = asked_by(config)
    if args.profile:
        if Path(args.profile).name != "slurm":
            p.error(f"--profile {args.profile}: only the slurm profile is known (docs/slurm.md)")
        return on_slurm(asked)
    line = verdict(this_node(asked.accelerator, asked.gpus if asked.accelerator == "cuda" else 0))
    print(line)
    return 1 if ": FAIL" in line else 0
