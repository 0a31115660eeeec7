"""How long reading a study takes: metrics files -> validated runs, epochs and cell tables.

Times `Study.build` (find, read, validate with the compiled fastjsonschema check, tabulate, in
a process pool; then the cell statistics and the convergence table) on the metrics files under
DIR (e.g. what `benchmarks/report_scale.py --runs N --keep DIR` wrote under DIR/runs), beside
its floor: `json.load` of every file in the same process pool, discarding the result. Each is
measured in a fresh process, so peak memory (resident set size) is its own.

    .venv/bin/python benchmarks/read_scale.py DIR/runs [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))

from trainscale.analysis import metrics_tables  # noqa: E402


def _json_load(paths: list[str]) -> int:
    for p in paths:
        with open(p) as f:
            json.load(f)
    return len(paths)


def measure(what: str, runs_dir: str, jobs: int) -> str:
    t0 = time.perf_counter()
    paths = metrics_tables.find_metrics(runs_dir)
    t1 = time.perf_counter()
    if what == "floor":
        names = [str(p) for p in paths]
        size = min(metrics_tables.CHUNK, math.ceil(len(names) / jobs))
        with ProcessPoolExecutor(jobs, mp_context=metrics_tables.mp_context()) as ex:
            chunks = [names[i : i + size] for i in range(0, len(names), size)]
            n = sum(ex.map(_json_load, chunks))
        done = f"floor: json.load of {n} files"
    else:
        from trainscale.analysis.study import Study

        study = Study.build(paths, jobs=jobs)
        study.convergence  # noqa: B018 (computed on first use, as the figures use it)
        done = (
            f"Study.build: {len(study.runs)} runs, {len(study.epochs)} epochs, "
            f"{len(study.scaling)} cells, {len(study.invalid)} invalid"
        )
    t2 = time.perf_counter()
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return (
        f"{done}: find {t1 - t0:.2f} s + read {t2 - t1:.2f} s = {t2 - t0:.2f} s; peak RSS "
        f"{me:.0f} MiB (largest worker {kids:.0f} MiB)"
    )


def main() -> int:
    p = argparse.ArgumentParser(
        description=(
            "How long reading a study takes: metrics files -> validated runs, "
            "epochs and cell tables."
        )
    )
    p.add_argument("runs_dir")
    p.add_argument("--jobs", type=int, default=metrics_tables.default_jobs())
    p.add_argument("--only", choices=("floor", "build"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.only:
        print(measure(a.only, a.runs_dir, a.jobs))
        return 0
    for what in ("floor", "build"):
        cmd = [sys.executable, __file__, a.runs_dir, "--jobs", str(a.jobs), "--only", what]
        print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip())
    load1, load5, _ = os.getloadavg()
    print(f"(machine: {os.cpu_count()} CPUs, load average {load1:.1f} / {load5:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
