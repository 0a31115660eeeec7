"""How long `python -m trainscale.report` takes for a large study, and how much memory.

Writes N metrics files (default 10,000; schema-valid, a few failed, some oversubscribed) for a
432-cell matrix under DIR/runs (not timed; with --keep DIR, files already there for the same N
are reused), then runs

    python -m trainscale.report --runs-dir DIR/runs --out DIR/cli --jobs J

end to end (Python start-up and imports included) --repeat times, and prints its wall time
(min / median / max) and the peak resident memory of its largest process. Beside it, the
floor: json.load of every file in a process pool of the same size (the same fork pool and
chunks as the report's reading), with the ratio report / floor.

    .venv/bin/python benchmarks/report_scale.py [--runs 10000] [--jobs 2] [--keep DIR]
        [--repeat 3]

Targets (issue 23, this 2-core machine): 10,000 runs in 5 s or less and 1 GB or less;
100,000 runs in 25 s or less and 2 GB or less. Bars on the ratio report / floor (issue 71,
RATIO_BARS): 8× or less at 10,000 runs, 3× or less at 100,000. Each round prints the load
average beside it: on a shared machine the wall times say as much about the neighbours.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))

from trainscale.analysis import metrics_tables  # noqa: E402
from trainscale.measure import metrics  # noqa: E402
from trainscale.plan import matrix  # noqa: E402

#: (seconds, GiB) targets by number of runs.
TARGETS = {10_000: (5.0, 1.0), 100_000: (25.0, 2.0)}
#: The most the report may take as a multiple of the floor, by number of runs (issue 71).
RATIO_BARS = {10_000: 8.0, 100_000: 3.0}

#: Strategy -> scaling exponent of the made-up throughput model X(N) = X(1) · N^a.
ALPHA = {"torch": 1.0, "torch-ddp": 0.85, "torch-dp": 0.6}
ERRORS = {
    "oom": "CUDA out of memory. Tried to allocate 2.00 GiB\nTraceback (most recent call last): ...",
    "failed": "RuntimeError: connection closed by peer\nTraceback (most recent call last): ...",
    "timeout": "run exceeded timeout_minutes=30; process group killed",
}


def config(repeats: int) -> dict:
    from snakemake.utils import validate

    cfg = {
        "study": "bench",
        "epochs": 5,
        "repeats": repeats,
        "target_accuracy": 0.9,
        "accelerator": "cuda",
        "matrix": {
            "strategy": list(ALPHA),
            "model": ["seed-small", "seed-large"],
            "dataset": ["digits", "mnist"],
            "scale": [1, 4],
            "batch_size": [64, 128, 256],
            "batch_mode": ["global", "per_worker"],
            "workers": [1, 2, 4, 8],
        },
    }
    validate(cfg, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"))
    return cfg


def record(spec: matrix.RunSpec, rng: random.Random) -> dict:
    """A plausible metrics record for `spec` (built with trainscale.measure.metrics' own
    constructors)."""
    s = spec.to_dict()
    roll = rng.random()
    if roll < 0.01:
        status = rng.choice(list(ERRORS))
        rec = metrics.failure_record(
            s,
            status,
            ERRORS[status],
            metrics.utc_now(),
            12.5,
            {"command": "python -m trainscale.runners", "mode": "local", "exit_code": 1},
        )
        rec["oversubscribed"] = spec.workers >= 8
        return rec
    base = 9000.0 * (1.4 if spec.model == "seed-small" else 1.0) * (spec.batch_size / 128) ** 0.3
    x = base * spec.world_size ** ALPHA[spec.strategy] * rng.uniform(0.9, 1.1)
    samples = 1797 * spec.scale
    epochs, loss, acc = [], 2.3, 0.1
    for e in range(1, spec.epochs + 1):
        secs = samples / x * (1.6 if e == 1 else rng.uniform(0.95, 1.05))
        loss *= rng.uniform(0.4, 0.6)
        acc = min(0.99, acc + (1 - acc) * rng.uniform(0.4, 0.7))
        epochs.append(
            {
                "epoch": e,
                "seconds": secs,
                "samples": samples,
                "steps": 28,
                "samples_per_second": samples / secs,
                "train_loss": loss,
                "step_seconds_p50": secs / 28,
                "step_seconds_p95": secs / 20,
                "test_accuracy": acc,
                "test_loss": loss * 1.1,
            }
        )
    rec = metrics.ok_record(s, epochs, spec.target_accuracy)
    rec.update(
        model={"params": 33802},
        data={"train_samples": samples, "test_samples": 360},
        test={"accuracy": acc, "loss": loss * 1.1},
        setup_seconds=3.0,
        wall_seconds=20.0,
        oversubscribed=spec.workers >= 8,
        memory={
            "peak_host_rss_bytes": int(4.4e8 + 2e5 * spec.per_worker_batch_size),
            "peak_device_bytes": None,
        },
        device={
            "kind": "cpu",
            "name": "Xeon",
            "count": spec.workers,
            "utilization_mean": None,
            "energy_joules": None,
        },
    )
    rec["env"]["frameworks"] = {"torch": "2.13.0+cpu"}
    return rec


def generate(runs_dir: Path, n: int, seed: int = 0) -> int:
    cells, _ = matrix.build_runs(config(1), accelerator="cuda")
    repeats = -(-n // len(cells))
    specs, _ = matrix.build_runs(config(repeats), accelerator="cuda")
    specs = sorted(specs, key=lambda r: r.repeat)[
        :n
    ]  # every cell gets n // cells repeats or one more
    rng = random.Random(seed)
    for i, spec in enumerate(specs):
        rec = record(spec, rng)
        if i < 20:
            metrics.validate(rec)  # the generator makes valid files; the report re-checks all
        out = runs_dir / spec.path / "metrics.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rec))
    return len(cells)


def generated(runs_dir: Path, n: int) -> bool:
    """Whether runs_dir already holds the n files `generate` writes (reused with --keep)."""
    stamp = runs_dir.parent / "runs.generated"  # beside runs/, which holds metrics files only
    return stamp.exists() and stamp.read_text().strip() == str(n)


def _load_chunk(paths: list[str]) -> int:
    for p in paths:
        with open(p, "rb") as f:
            json.load(f)
    return len(paths)


def floor_seconds(runs_dir: Path, jobs: int) -> float:
    """Find (as the report does) and json.load every metrics file, `jobs` forked processes,
    chunks as the report's."""
    t = time.perf_counter()
    paths = [str(p) for p in metrics_tables.find_metrics(runs_dir)]
    size = min(metrics_tables.CHUNK, math.ceil(len(paths) / jobs))
    chunks = [paths[i : i + size] for i in range(0, len(paths), size)]
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as ex:
        assert sum(ex.map(_load_chunk, chunks)) == len(paths)
    return time.perf_counter() - t


def report_once(runs_dir: Path, out: Path, jobs: int, log: Path) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS MiB of its largest process) of the command line."""
    cmd = [sys.executable, "-m", "trainscale.report", "--runs-dir", str(runs_dir)]
    cmd += ["--out", str(out), "--jobs", str(jobs)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "workflow")}
    # wait4 gives this one child's usage, with its own waited-for workers
    t = time.perf_counter()
    with open(log, "w+") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        if os.waitstatus_to_exitcode(status) != 0:
            f.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed:\n{f.read()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return " / ".join(fmt.format(v) for v in (lo, mid, hi)) + " (min / median / max)"


def main() -> int:
    p = argparse.ArgumentParser(
        description=(
            "How long `python -m trainscale.report` takes for a large study, and how much memory."
        )
    )
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--jobs", type=int, default=min(len(os.sched_getaffinity(0)), 8))
    p.add_argument("--keep", type=Path, help="write here and keep (default: a temporary dir)")
    p.add_argument("--repeat", type=int, default=3, help="report runs to time (default 3)")
    a = p.parse_args()
    tmp = Path(a.keep or tempfile.mkdtemp(prefix="trainscale-bench-"))
    runs_dir = tmp / "runs"
    if generated(runs_dir, a.runs):
        print(f"reusing the {a.runs} metrics files under {runs_dir}")
    else:
        shutil.rmtree(runs_dir, ignore_errors=True)
        t = time.perf_counter()
        cells = generate(runs_dir, a.runs)
        (runs_dir.parent / "runs.generated").write_text(f"{a.runs}\n")
        print(
            f"generated {a.runs} metrics files for {cells} cells in "
            f"{time.perf_counter() - t:.1f} s (not timed) under {runs_dir}"
        )
    walls, cpus, peaks, floors = [], [], [], []
    for i in range(a.repeat):  # alternate, so both see the same machine
        floors.append(floor_seconds(runs_dir, a.jobs))
        wall, cpu, peak = report_once(runs_dir, tmp / "cli", a.jobs, tmp / "cli.log")
        walls.append(wall)
        cpus.append(cpu)
        peaks.append(peak)
        load1 = os.getloadavg()[0]
        print(f"  round {i + 1}: report {wall:.1f} s (CPU {cpu:.1f} s, {peak:.0f} MiB), "
              f"floor {floors[-1]:.2f} s, {wall / floors[-1]:.1f}×; load {load1:.1f}")  # fmt: skip
    target = TARGETS.get(a.runs)
    want = f" (target ≤ {target[0]:g} s, ≤ {target[1]:g} GiB)" if target else ""
    print(f"python -m trainscale.report, {a.runs} runs, --jobs {a.jobs}, end to end{want}:")
    print(f"  wall time     {spread(walls)} s")
    print(f"  CPU time      {spread(cpus)} s (all its processes)")
    print(f"  peak RSS      {spread(peaks, '{:.0f}')} MiB (its largest process)")
    print(f"  floor         {spread(floors, '{:.2f}')} s (json.load of every file, same pool)")
    bar = RATIO_BARS.get(a.runs)
    ratios = [w / f for w, f in zip(walls, floors, strict=True)]
    best = f"{min(walls) / min(floors):.1f}× best of each" + (f" (bar ≤ {bar:g}×)" if bar else "")
    print(f"  report/floor  {spread(ratios)}× side by side, {best}")
    html = tmp / "cli" / "report.html"
    print(f"  report.html   {html.stat().st_size / 2**20:.1f} MiB")
    load1, load5, _ = os.getloadavg()
    print(f"(machine: {os.cpu_count()} CPUs, load average {load1:.1f} / {load5:.1f})")
    if not a.keep:
        shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
