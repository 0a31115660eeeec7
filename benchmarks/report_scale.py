"""How long the report takes for a large study: aggregation + all figures + HTML for 10,000 runs.

Generates N metrics files (default 10,000; schema-valid, a few failed, some oversubscribed) for
a 432-cell matrix into a temporary directory (not timed), then times exactly what
`python -m trainscale.report --runs-dir DIR --out DIR` does, step by step, and prints the wall
time and the peak memory (resident set size) of this process and of its worker processes.

    .venv/bin/python benchmarks/report_scale.py [--runs 10000] [--jobs 2] [--keep DIR]
        [--what-if-jsonschema]

`trainscale.metrics.validate` checks each record with a fastjsonschema-compiled validator and
falls back to jsonschema only for the message of an invalid one. `--what-if-jsonschema` times
the in-process part with plain jsonschema validation instead, to show what fastjsonschema saves
(run once with it and once without, and compare the "read + validate" lines).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))

from trainscale import aggregate, matrix, metrics, plots, report  # noqa: E402

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
    """A plausible metrics record for `spec` (built with trainscale.metrics' own constructors)."""
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


def patch_validation() -> None:
    """What-if: every record validated by jsonschema alone (what metrics.validate did before it
    compiled the schema with fastjsonschema), in this process and its forked workers."""
    validator = metrics._validator()

    def validate(record: dict) -> None:
        errors = list(validator.iter_errors(record))
        if errors:
            raise metrics.MetricsError("; ".join(e.message for e in errors))

    metrics.validate = validate
    print("what-if: trainscale.metrics.validate replaced by plain jsonschema (in-process part)")


def peak_mib(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--jobs", type=int, default=aggregate.default_jobs())
    p.add_argument("--keep", type=Path, help="write here and keep (default: a temporary dir)")
    p.add_argument(
        "--what-if-jsonschema",
        action="store_true",
        help="what-if only: validate with plain jsonschema instead of metrics.validate's "
        "fastjsonschema-compiled check for the in-process part, to see what it saves",
    )
    a = p.parse_args()
    if a.what_if_jsonschema:
        patch_validation()
    tmp = Path(a.keep or tempfile.mkdtemp(prefix="trainscale-bench-"))
    runs_dir, out = tmp / "runs", tmp / "out"
    t = time.perf_counter()
    cells = generate(runs_dir, a.runs)
    print(
        f"generated {a.runs} metrics files for {cells} cells in {time.perf_counter() - t:.1f} s "
        f"(not timed) under {runs_dir}"
    )

    # 1. in this process, step by step (imports done, as in a long-lived session)
    steps, t0 = [], time.perf_counter()

    def lap(name: str) -> None:
        steps.append((name, time.perf_counter()))

    paths = aggregate.find_metrics(runs_dir)
    records, invalid = aggregate.load(paths, jobs=a.jobs)
    lap(f"read + validate {len(paths)} files ({a.jobs} processes)")
    runs = aggregate.runs_frame(records)
    study = aggregate.Study(
        "bench", runs, aggregate.epochs_frame(records), aggregate.scaling_frame(runs), invalid
    )
    del records
    study.convergence  # noqa: B018
    lap(f"tables ({len(study.runs)} runs, {len(study.scaling)} cells)")
    notes = plots.render_all(
        study, out / "figures", jobs=a.jobs, meanwhile=lambda: study.write(out)
    )
    lap(f"{len(notes)} figures, SVG + PNG ({a.jobs} processes), CSV files written meanwhile")
    report.write_html(study, out / "report.html", out / "figures", notes=notes)
    lap(f"report.html ({(out / 'report.html').stat().st_size / 2**20:.1f} MiB)")
    total = time.perf_counter() - t0
    print("in-process, step by step:")
    prev = t0
    for name, when in steps:
        print(f"  {when - prev:6.1f} s  {name}")
        prev = when
    print(
        f"  {total:6.1f} s  total; peak RSS: this process "
        f"{peak_mib(resource.RUSAGE_SELF):.0f} MiB, largest worker "
        f"{peak_mib(resource.RUSAGE_CHILDREN):.0f} MiB"
    )
    drawn = [n for n, note in notes.items() if note is None]
    print(
        f"  figures drawn: {len(drawn)}/{len(notes)}; skipped: "
        + (", ".join(f"{n} ({note})" for n, note in notes.items() if note) or "none")
    )

    # 2. the command line, end to end (Python start-up and imports included)
    cmd = [
        sys.executable,
        "-m",
        "trainscale.report",
        "--runs-dir",
        str(runs_dir),
        "--out",
        str(tmp / "cli"),
        "--jobs",
        str(a.jobs),
    ]
    # wait4 gives this one child's usage, with its own waited-for workers, and nothing of the
    # pool workers of part 1 (RUSAGE_CHILDREN's ru_maxrss would be the largest of all of them)
    t = time.perf_counter()
    with open(tmp / "cli.log", "w+") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            log.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed:\n{log.read()[-2000:]}")
    cpu = usage.ru_utime + usage.ru_stime
    print(
        f"python -m trainscale.report, end to end: wall time {wall:.1f} s (target ≤ 15 s), "
        f"CPU {cpu:.1f} s, peak RSS of its largest process {usage.ru_maxrss / 1024:.0f} MiB"
    )
    load1, load5, _ = os.getloadavg()
    print(f"(machine: {os.cpu_count()} CPUs, load average {load1:.1f} / {load5:.1f})")
    if not a.keep:
        shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
