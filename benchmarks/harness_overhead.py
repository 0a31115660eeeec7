"""How much does trainscale's runner cost over a minimal hand-written loop?

Runs the `torch-ddp` runner (through the real launcher, torchrun + gloo) and the minimal DDP
loop in benchmarks/minimal_ddp.py on the same model, data, batch, worker and thread counts,
alternating A/B for several rounds in one process so drift hits both alike, and prints the
steady-throughput ratio runner / minimal (1.0 = no overhead; the bar is >= 0.95).

    .venv/bin/python benchmarks/harness_overhead.py [--rounds 3] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))

from trainscale import metrics  # noqa: E402
from trainscale.launch import detect, supervise, worker_env  # noqa: E402
from trainscale.matrix import RunSpec  # noqa: E402


def spec(a: argparse.Namespace) -> RunSpec:
    return RunSpec(
        study="bench", strategy="torch-ddp", model=a.model, dataset=a.dataset, scale=a.scale,
        batch_size=a.batch, batch_mode="global", workers=a.workers, nodes=1, precision="fp32",
        repeat=0, seed=0, epochs=a.epochs, optimizer="adam", lr=1e-3, base_lr=1e-3,
        lr_scaling="none", betas=(0.9, 0.999), eps=1e-7, weight_decay=0.0, momentum=0.0,
        global_batch_size=a.batch, per_worker_batch_size=a.batch // a.workers,
        world_size=a.workers, threads_per_worker=1, timeout_minutes=30, target_accuracy=None,
        data_dir="data",
    )  # fmt: skip


def runner(s: RunSpec, tmp: Path) -> float:
    out = tmp / "metrics.json"
    out.unlink(missing_ok=True)
    with open(tmp / "runner.log", "w") as log:
        stdout, sys.stdout = sys.stdout, log
        try:
            status = supervise(s, out, detect())
        finally:
            sys.stdout = stdout
    assert status == "ok", (tmp / "runner.log").read_text()[-2000:]
    return metrics.read(out)["throughput"]


def minimal(s: RunSpec) -> float:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
        f"--nproc-per-node={s.workers}", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0",
        str(ROOT / "benchmarks" / "minimal_ddp.py"), f"--model={s.model}",
        f"--dataset={s.dataset}", f"--scale={s.scale}", f"--batch={s.batch_size}",
        f"--epochs={s.epochs}",
    ]  # fmt: skip
    env = {**os.environ, **worker_env(s), "PYTHONPATH": str(ROOT / "workflow")}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])["throughput"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="seed-small")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--scale", type=int, default=16)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    s = spec(a)
    print(
        f"torch-ddp, {a.workers} workers × 1 thread, {a.model} on {a.dataset} ×{a.scale}, "
        f"global batch {a.batch}, {a.epochs} epochs (steady = epochs 2..{a.epochs})"
    )
    print(f"{'round':>5} {'runner samples/s':>17} {'minimal samples/s':>18} {'ratio':>7}")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            x_runner = runner(s, Path(tmp))
            x_min = minimal(s)
            ratios.append(x_runner / x_min)
            print(f"{i + 1:>5} {x_runner:>17,.0f} {x_min:>18,.0f} {ratios[-1]:>7.3f}", flush=True)
    print(
        f"torch-ddp runner / minimal DDP loop: median ratio {statistics.median(ratios):.3f} "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {a.rounds} rounds)"
    )


if __name__ == "__main__":
    main()
