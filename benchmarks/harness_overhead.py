"""How much does trainscale's runner cost over a minimal hand-written loop?

Runs the `torch-ddp` runner (through the real launcher, torchrun + gloo) and the minimal DDP
loop in benchmarks/minimal_ddp.py on the same model, data, batch, worker and thread counts,
alternating the order for several rounds in one process (odd rounds runner first, even rounds
the minimal loop first; the `first` column says which), so drift and any first-run advantage
hit both alike, and prints the
steady-throughput ratio runner / minimal (1.0 = no overhead; the bar is >= 0.95).

The `lightning-ddp` row runs PyTorch Lightning's Trainer(strategy="ddp") runner against the
same minimal DDP loop: its ratio is Lightning's own overhead (reported, no bar).
The `deepspeed-zero2` row compares the DeepSpeed runner (ZeRO-2, with DeepSpeed's
wall_clock_breakdown on, as the runner always runs) with benchmarks/minimal_deepspeed.py.
The `horovod-torch` row compares the Horovod runner (through horovodrun, gloo) with the
minimal Horovod loop in benchmarks/minimal_horovod.py, launched by the same horovodrun command.
The `tf-mirrored` row does the same for the TensorFlow runner (MirroredStrategy; on CPU over
`--workers` logical devices) against the minimal model.fit in benchmarks/minimal_keras.py.

    .venv/bin/python benchmarks/harness_overhead.py [--rounds 3] [--workers 2]
        [--strategy torch-ddp|lightning-ddp|horovod-torch|tf-mirrored|deepspeed-zero2]
        (default: every row)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))
# the runners' processes import trainscale from this checkout too, not an installed copy
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(ROOT / "workflow"), os.environ.get("PYTHONPATH")])
)

from trainscale import metrics  # noqa: E402
from trainscale.launch import LAUNCHERS, detect, supervise, worker_env  # noqa: E402
from trainscale.matrix import RunSpec  # noqa: E402

T = TypeVar("T")
U = TypeVar("U")


def spec(a: argparse.Namespace, strategy: str = "torch-ddp") -> RunSpec:
    return RunSpec(
        study="bench", strategy=strategy, model=a.model, dataset=a.dataset, scale=a.scale,
        batch_size=a.batch, batch_mode="global", workers=a.workers, nodes=1, precision="fp32",
        repeat=0, seed=0, epochs=a.epochs, optimizer="adam", lr=1e-3, base_lr=1e-3,
        lr_scaling="none", betas=(0.9, 0.999), eps=1e-7, weight_decay=0.0, momentum=0.0,
        global_batch_size=a.batch, per_worker_batch_size=a.batch // a.workers,
        world_size=a.workers, threads_per_worker=1, timeout_minutes=30, target_accuracy=None,
        data_dir="data",
    )  # fmt: skip


def runner(s: RunSpec, tmp: Path) -> float:
    return runner_record(s, tmp)["throughput"]


def runner_record(s: RunSpec, tmp: Path) -> dict:
    out = tmp / "metrics.json"
    out.unlink(missing_ok=True)
    with open(tmp / "runner.log", "w") as log:
        stdout, sys.stdout = sys.stdout, log
        try:
            status = supervise(s, out, detect())
        finally:
            sys.stdout = stdout
    assert status == "ok", (tmp / "runner.log").read_text()[-2000:]
    return metrics.read(out)


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


def minimal_keras(s: RunSpec) -> dict:
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "minimal_keras.py"), f"--model={s.model}",
        f"--dataset={s.dataset}", f"--scale={s.scale}", f"--batch={s.batch_size}",
        f"--epochs={s.epochs}", f"--workers={s.workers}",
    ]  # fmt: skip
    env = {**os.environ, **worker_env(s), "PYTHONPATH": str(ROOT / "workflow")}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def minimal_deepspeed(s: RunSpec) -> float:
    stage = s.strategy.removeprefix("deepspeed-zero")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
        f"--nproc-per-node={s.workers}", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0",
        str(ROOT / "benchmarks" / "minimal_deepspeed.py"), f"--model={s.model}",
        f"--dataset={s.dataset}", f"--scale={s.scale}", f"--batch={s.batch_size}",
        f"--epochs={s.epochs}", f"--stage={stage}",
    ]  # fmt: skip
    env = {**os.environ, **worker_env(s), "PYTHONPATH": str(ROOT / "workflow")}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])["throughput"]


def minimal_horovod(s: RunSpec) -> float:
    """benchmarks/minimal_horovod.py under the very horovodrun command the runner gets."""
    script = [
        str(ROOT / "benchmarks" / "minimal_horovod.py"), f"--model={s.model}",
        f"--dataset={s.dataset}", f"--scale={s.scale}", f"--batch={s.batch_size}",
        f"--epochs={s.epochs}",
    ]  # fmt: skip
    cmd = LAUNCHERS["horovod-torch"](s, detect(), script)
    env = {**os.environ, **worker_env(s), "PYTHONPATH": str(ROOT / "workflow")}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    line = next(ln for ln in reversed(p.stdout.splitlines()) if '"throughput"' in ln)
    return json.loads(line[line.index("{") :])["throughput"]


#: which side runs first in round i (0-based): FIRST[i % 2]
FIRST = ("runner", "minimal")


def in_order(i: int, run_runner: Callable[[], T], run_minimal: Callable[[], U]) -> tuple[T, U]:
    """Both sides of round `i`, the runner first in even rounds (0, 2, ...) and the minimal loop
    first in odd ones: an A/B then B/A alternation, so an order effect (a warm page cache, a
    burst of load) falls on both sides alike over the rounds. Returns (runner, minimal)."""
    if i % 2 == 0:
        a = run_runner()
        return a, run_minimal()
    b = run_minimal()
    return run_runner(), b


#: strategy -> (the minimal yardstick, how the row is described)
BASELINES = {
    "torch-ddp": (minimal, "minimal DDP loop"),
    "lightning-ddp": (minimal, "minimal DDP loop"),
    "horovod-torch": (minimal_horovod, "minimal Horovod loop"),
    "tf-mirrored": (minimal_keras, "minimal Keras model.fit"),
    "deepspeed-zero2": (minimal_deepspeed, "minimal DeepSpeed loop"),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="seed-small")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--scale", type=int, default=16)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--strategy", choices=sorted(BASELINES), help="one row (default: all)")
    a = p.parse_args()
    for strategy in [a.strategy] if a.strategy else list(BASELINES):
        if strategy == "tf-mirrored":
            tf_row(a)
        else:
            row(a, strategy)


def tf_row(a: argparse.Namespace) -> None:
    """The tf-mirrored row: the same ratio, and the ratio of each side's best steady epoch, which
    a burst of load from other processes on a shared machine disturbs less than the mean."""
    s = spec(a, "tf-mirrored")
    print(
        f"tf-mirrored, {a.workers} devices (logical CPU devices when there is no GPU) × 1 thread, "
        f"{a.model} on {a.dataset} ×{a.scale}, global batch {a.batch}, {a.epochs} epochs "
        f"(steady = epochs 2..{a.epochs})"
    )
    print(
        f"{'round':>5} {'first':>7} {'runner samples/s':>17} {'minimal samples/s':>18}"
        f" {'ratio':>7} {'best-epoch ratio':>17}"
    )
    ratios, best = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            rec, mini = in_order(i, lambda: runner_record(s, Path(tmp)), lambda: minimal_keras(s))
            ratios.append(rec["throughput"] / mini["throughput"])
            fastest = max(e["samples_per_second"] for e in rec["epochs"][1:])
            best.append(fastest / mini["best"])
            print(
                f"{i + 1:>5} {FIRST[i % 2]:>7} {rec['throughput']:>17,.0f} "
                f"{mini['throughput']:>18,.0f} {ratios[-1]:>7.3f} {best[-1]:>17.3f}",
                flush=True,
            )
    print(
        f"tf-mirrored runner / minimal Keras model.fit: median ratio "
        f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); "
        f"best-epoch ratio median {statistics.median(best):.3f}; {a.rounds} rounds"
    )


def row(a: argparse.Namespace, strategy: str) -> None:
    s = spec(a, strategy)
    baseline, what = BASELINES[strategy]
    workers = f"{a.workers} workers × 1 thread"
    print(
        f"{strategy}, {workers}, {a.model} on {a.dataset} ×{a.scale}, "
        f"global batch {a.batch}, {a.epochs} epochs (steady = epochs 2..{a.epochs})"
    )
    print(
        f"{'round':>5} {'first':>7} {'runner samples/s':>17} {'minimal samples/s':>18} {'ratio':>7}"
    )
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            x_runner, x_min = in_order(i, lambda: runner(s, Path(tmp)), lambda: baseline(s))
            ratios.append(x_runner / x_min)
            print(
                f"{i + 1:>5} {FIRST[i % 2]:>7} {x_runner:>17,.0f} {x_min:>18,.0f} "
                f"{ratios[-1]:>7.3f}",
                flush=True,
            )
    print(
        f"{strategy} runner / {what}: median ratio {statistics.median(ratios):.3f} "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {a.rounds} rounds)"
    )


if __name__ == "__main__":
    main()
