"""How much does trainscale's runner cost over a minimal hand-written loop?

Each row runs one trainscale strategy through the real launcher
(`trainscale.launch.supervise.supervise`: torchrun, horovodrun or one process, the env prefix, the
metrics record) and a minimal loop written as its framework's tutorial would, on the same work, and
prints the ratio of their steady throughputs, runner / minimal (1.0 = no overhead; the bar is a
median >= 0.98):

- torch-ddp: the DDP runner vs benchmarks/minimal_ddp.py (DDP + Adam, torchrun, gloo).
- deepspeed-zero2: the DeepSpeed runner (ZeRO-2, with DeepSpeed's wall_clock_breakdown on, as
  the runner always runs) vs benchmarks/minimal_deepspeed.py (deepspeed.initialize, ZeRO-2).
- horovod-torch: the Horovod runner vs benchmarks/minimal_horovod.py, launched by the very
  horovodrun command (gloo) the runner gets.
- tf-mirrored: the TensorFlow runner (MirroredStrategy; on CPU over `--workers` logical
  devices) vs benchmarks/minimal_keras.py (model.fit over a from_tensor_slices pipeline).
- lightning-ddp: Lightning's Trainer(strategy="ddp") runner vs the minimal DDP loop: its ratio
  is Lightning's own overhead (reported, no bar).

Same work on both sides: the same model (`--model`), data arrays and normalisation
(`--dataset`, repeated `--scale` times an epoch), global batch split over `--workers`
processes of 1 thread each (OMP/MKL threads from the launcher's `worker_env` on both sides),
Adam(1e-3, 0.9/0.999, 1e-7), fp32, the same steps per epoch (drop_last), epoch 1 warm-up and
epochs 2.. timed between barriers. What the runner does on top (the sampler's order, per-step
timing, the loss kept per step, evaluation after the last epoch, memory peaks, the record) is
the overhead measured; evaluation and the record are outside the timed epochs on both sides.

Noise: the default work (seed-small on digits ×64: 718 steps of 64 per rank an epoch, about
2 s on a quiet 2-core machine) makes a steady epoch long enough that a round's number is not
one scheduler hiccup. Rounds are round-major (every row in round 1, then round 2, ...), and
within a round the two sides alternate (runner first in odd rounds, minimal first in even
ones; the `first` column), so drift and load bursts fall on both sides and every row alike.
The summary prints, per row, the ratio's min/median/max over the rounds and each side's
spread (max/min of its throughput over the rounds): a spread above 1.05 means the rounds
disagree by more than the 2% this measures, which on a shared machine is other load (the
load average is printed with every line).

    .venv/bin/python benchmarks/harness_overhead.py [--rounds 5] [--workers 2]
        [--rows torch-ddp,deepspeed-zero2,horovod-torch,tf-mirrored,lightning-ddp]
        [--model seed-small] [--dataset digits] [--scale 64] [--epochs 3]
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

from trainscale.launch.supervise import LAUNCHERS, detect, supervise, worker_env  # noqa: E402
from trainscale.measure import metrics  # noqa: E402
from trainscale.plan.matrix import RunSpec  # noqa: E402

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
    "deepspeed-zero2": (minimal_deepspeed, "minimal DeepSpeed loop"),
    "horovod-torch": (minimal_horovod, "minimal Horovod loop"),
    "tf-mirrored": (lambda s: minimal_keras(s)["throughput"], "minimal Keras model.fit"),
    "lightning-ddp": (minimal, "minimal DDP loop"),
}
#: the rows with a bar (median ratio over the rounds); lightning-ddp reports Lightning's own
#: overhead and has none
TARGET = {"torch-ddp": 0.98, "deepspeed-zero2": 0.98, "horovod-torch": 0.98, "tf-mirrored": 0.98}


def spread(xs: list[float]) -> float:
    """max/min of one side's throughput over the rounds: 1.00 = every round alike."""
    return max(xs) / min(xs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="seed-small")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--scale", type=int, default=64, help="copies of the training set an epoch")
    p.add_argument("--batch", type=int, default=128, help="global batch")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3, help="epoch 1 is warm-up, the rest steady")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--rows", default=",".join(BASELINES),
        help=f"comma-separated strategies (default: all of {', '.join(BASELINES)})",
    )  # fmt: skip
    p.add_argument("--strategy", choices=sorted(BASELINES), help="one row (same as --rows X)")
    a = p.parse_args()
    rows = [a.strategy] if a.strategy else [r for r in a.rows.split(",") if r]
    unknown = sorted(set(rows) - set(BASELINES))
    if unknown:
        p.error(f"--rows: unknown {unknown}; choose from {', '.join(BASELINES)}")
    print(
        f"{a.workers} workers × 1 thread, {a.model} on {a.dataset} ×{a.scale}, global batch "
        f"{a.batch}, {a.epochs} epochs (steady = epochs 2..{a.epochs}), {a.rounds} rounds; "
        f"load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    print(
        f"{'round':>5} {'row':<16} {'first':>7} {'runner /s':>10} {'minimal /s':>11} {'ratio':>7}"
    )
    runner_x: dict[str, list[float]] = {r: [] for r in rows}
    minimal_x: dict[str, list[float]] = {r: [] for r in rows}
    with tempfile.TemporaryDirectory() as tmp:
        # round-major: a stretch of load from other processes spreads over every row
        for i in range(a.rounds):
            for strategy in rows:
                s = spec(a, strategy)
                x_r, x_m = in_order(
                    i,
                    lambda s=s: runner(s, Path(tmp)),
                    lambda s=s: BASELINES[s.strategy][0](s),
                )
                runner_x[strategy].append(x_r)
                minimal_x[strategy].append(x_m)
                print(
                    f"{i + 1:>5} {strategy:<16} {FIRST[i % 2]:>7} {x_r:>10,.0f} {x_m:>11,.0f} "
                    f"{x_r / x_m:>7.3f}  (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
    print()
    print(
        f"{'row':<16} {'vs':<24} {'ratio min':>9} {'median':>7} {'max':>6} "
        f"{'spread runner':>13} {'spread minimal':>14} {'bar':>9}"
    )
    for strategy in rows:
        ratios = [r / m for r, m in zip(runner_x[strategy], minimal_x[strategy], strict=True)]
        med = statistics.median(ratios)
        bar = TARGET.get(strategy)
        verdict = "-" if bar is None else f">={bar} {'ok' if med >= bar else 'NO'}"
        print(
            f"{strategy:<16} {BASELINES[strategy][1]:<24} {min(ratios):>9.3f} {med:>7.3f} "
            f"{max(ratios):>6.3f} {spread(runner_x[strategy]):>13.3f} "
            f"{spread(minimal_x[strategy]):>14.3f} {verdict:>9}"
        )
    print(f"load average at end {os.getloadavg()[0]:.1f} (spread under 1.05 needs a quiet machine)")


if __name__ == "__main__":
    main()
