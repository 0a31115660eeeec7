"""`make gpu-check` (`python -m trainscale.gpu.check`): run every GPU path of trainscale on this
node, through the real launcher, and say in one line per path whether it works.

Each path is a small run (digits, seed-small, 2 epochs) built by `trainscale.plan.matrix.build_runs`
from a study config, as the workflow builds its runs, and started by `trainscale.launch` (the
supervisor the `train` rule calls), or the all-reduce benchmark `trainscale.runners.collectives`.
Then its metrics are checked: status ok on a CUDA device, throughput and epoch timings consistent,
NVML utilisation and energy present, peak device memory at least the model's weights. It
takes a few minutes on one GPU. Every line is one of

    <path>  PASS
    <path>  FAIL <reason>
    <path>  NOT INSTALLED <what>      (Horovod with NCCL, TensorFlow's GPU build: optional)
    <path>  SKIP no CUDA device       (no NVIDIA driver on this node)

and the exit code is 1 when any path fails. A node with an NVIDIA driver where torch sees no
CUDA device (a CPU build of torch, a broken driver) fails every path instead of skipping it:
a GPU check must not pass by finding nothing to check. Logs and metrics of every path go to
`--out` (default results/gpu-check/). The paths themselves are `trainscale.gpu.paths`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from trainscale.gpu.paths import (
    BASE_STUDY,
    CHECKS,
    OPTIONAL,
    Check,
    CheckFailed,
    Context,
    Run,
    by_name,
    gpu_run_problems,
    names,
    one_line,
    study,
    train,
)
from trainscale.plan import machine

__all__ = [
    "BASE_STUDY",
    "CHECKS",
    "FAIL",
    "NOT_INSTALLED",
    "OPTIONAL",
    "PASS",
    "SKIP",
    "Check",
    "CheckFailed",
    "Context",
    "Result",
    "Run",
    "by_name",
    "check_all",
    "cuda_state",
    "first_visible_gpu",
    "gpu_run_problems",
    "main",
    "names",
    "run_check",
    "study",
    "train",
]

PASS, FAIL, NOT_INSTALLED, SKIP = "PASS", "FAIL", "NOT INSTALLED", "SKIP"


@dataclass(frozen=True)
class Result:
    """One path's verdict, printed as one line and saved to gpu-check.yaml."""

    name: str
    verdict: str
    detail: str = ""
    seconds: float = 0.0

    def line(self) -> str:
        return f"{self.name:<28} {self.verdict}" + (f" {self.detail}" if self.detail else "")


# --- the node --------------------------------------------------------------------------------


def cuda_state() -> tuple[str, str]:
    """("cuda", versions) where torch sees a CUDA device; ("none", why) on a node without an
    NVIDIA driver; ("broken", why) on a node with a driver where torch sees no CUDA device."""
    gpus = machine.gpu_count()
    if not gpus and not shutil.which("nvidia-smi"):
        return "none", "no CUDA device"
    import torch

    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return "cuda", f"torch {torch.__version__}, CUDA {torch.version.cuda}, {n} device(s)"
    return "broken", (
        f"this node has an NVIDIA driver ({gpus} GPU(s) in /proc/driver/nvidia) but torch "
        f"{torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"
    )


def device_lines() -> list[str]:
    """Which device each framework would use (gpu.frameworks), before the paths that use
    them; one line on a node without an NVIDIA driver."""
    if cuda_state()[0] == "none":
        return ["device every framework: cpu (no NVIDIA driver on this node)"]
    from trainscale.gpu import frameworks

    return frameworks.lines()


def first_visible_gpu() -> str:
    """The CUDA_VISIBLE_DEVICES entry of the first GPU this process may use ("0" if unset)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in visible.split(",")] if visible else ["0"]
    return entries[0]


def run_check(check: Check, ctx: Context) -> Result:
    """One check, never raising: its verdict and why."""
    missing = [m for m in check.needs if importlib.util.find_spec(m) is None]
    if missing:
        return Result(check.name, NOT_INSTALLED, ", ".join(missing))
    t0 = time.perf_counter()
    try:
        lack = check.probe(ctx) if check.probe else None
        if lack:
            return Result(check.name, NOT_INSTALLED, lack)
        why = check.run(ctx)
    except CheckFailed as e:
        why = str(e)
    except subprocess.TimeoutExpired as e:
        why = f"no result within {e.timeout:.0f} s"
    except Exception as e:  # a check's own bug or an unreadable record: still one line
        why = f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - t0
    if why:
        return Result(check.name, FAIL, one_line(why), seconds)
    return Result(check.name, PASS, "", seconds)


def check_all(selected: list[Check], ctx: Context, echo=print) -> list[Result]:
    state, why = cuda_state()
    results = []
    for c in selected:
        if state == "none":
            r = Result(c.name, SKIP, "no CUDA device")
        elif state == "broken":
            r = Result(c.name, FAIL, why)
        else:
            r = run_check(c, ctx)
        echo(r.line())
        results.append(r)
    return results


def main(argv: list[str] | None = None, prog: str = "trainscale gpu-check") -> int:
    """`trainscale gpu-check`: every GPU path on this node, one line each; exit 1 on a FAIL."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__)
    p.add_argument(
        "--out", type=Path, default=Path("results/gpu-check"), help="logs (default: %(default)s)"
    )
    p.add_argument(
        "--only", action="append", default=[], metavar="PATH", help="only this path (repeatable)"
    )
    p.add_argument("--list", action="store_true", help="list the paths and what each runs")
    p.add_argument("--timeout-minutes", type=float, default=10.0, help="per run")
    a = p.parse_args(argv)
    if a.list:
        for c in CHECKS:
            print(f"{c.name:<28} {c.what}")
        return 0
    try:
        selected = [by_name(n) for n in a.only] if a.only else list(CHECKS)
    except KeyError as e:
        p.error(str(e.args[0]))
    ctx = Context(out=a.out.resolve(), timeout_minutes=a.timeout_minutes)
    ctx.first_gpu = first_visible_gpu()
    t0 = time.perf_counter()
    for line in device_lines():
        print(line, flush=True)
    results = check_all(selected, ctx, echo=lambda line: print(line, flush=True))
    counts = {v: sum(r.verdict == v for r in results) for v in (PASS, FAIL, NOT_INSTALLED, SKIP)}
    words = {PASS: "passed", FAIL: "failed", NOT_INSTALLED: "not installed", SKIP: "skipped"}
    summary = ", ".join(f"{n} {words[v]}" for v, n in counts.items() if n)
    print(
        f"gpu-check: {summary} in {time.perf_counter() - t0:.0f} s; logs under {ctx.out}",
        file=sys.stderr,
    )
    ctx.out.mkdir(parents=True, exist_ok=True)
    (ctx.out / "gpu-check.yaml").write_text(
        yaml.safe_dump([r.__dict__ for r in results], sort_keys=False)
    )
    return 1 if counts[FAIL] else 0


if __name__ == "__main__":
    sys.exit(main())
