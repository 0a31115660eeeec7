"""How close trainscale's dry-run of a large study comes to Snakemake's own floor.

Times `snakemake -n` of an 8,000-run matrix (8 strategies × 5 models × 4 scales × 5 batch sizes
× 2 worker counts × 5 repeats, on synthetic ImageNet-sized data so that no cell is dropped)
against `snakemake -n` of a trivial Snakefile with the same number of jobs (one rule, plain
string input and output, no functions): what parsing the config, building the run specs, the
per-job input, params and resource functions and the report registrations cost on top of
Snakemake scheduling that many jobs. The two are alternated, each `--rounds` times, and the
minimum of each is taken (the least disturbed by other work on the machine); printed: both
times and their ratio (target: 1.5 or less).

Both run without the SLURM start-up wait: SLURM_CONF points at scripts/slurm-offline.conf, a
controller that refuses at once, so that the SLURM plugin's `scontrol show config` at every
Snakemake start costs milliseconds, not ~9 s, where a configured controller is down
(docs/slurm.md).

    .venv/bin/python benchmarks/dryrun_scale.py [--rounds 3] [--repeats 5] [--keep DIR]

Measured on the 2-core development machine, shared (load average 2-4 throughout, so every
figure is slower than on a quiet machine and varies by 10-20% from run to run). Before
(9d106bd): 15.67 s against 9.70 s on a quiet machine, a ratio of 1.62; alternated with the
trivial Snakefile and with the change below, CPU time min 21.0 s / median 22.4 s against
13.1 / 13.7 s (1.61 / 1.64). After: CPU time min 19.1 s / median 20.8 s (1.46 / 1.52), and
this script printed a ratio of 1.50 (CPU 1.53). Counted Python function calls (cProfile, the
same whatever the load): 47.6 M before, 40.9 M after, 27.4 M for the trivial Snakefile (a
ratio of 1.74, now 1.49). What was cut: the scaling card's second input list of every run
(now runs.csv plus the paths as params), the config's second validation (Snakemake's
validate re-reading the schema with the pure-Python YAML reader), the launcher's modules
imported at start, run paths built six times per run, two of the five fields of each train
job's command (formatted three times per job in a dry-run). What is left is Snakemake's
per-job handling of what a train job has and the floor's job lacks: five functions (input,
conda env, threads, cpus_per_task, the spec), a log, three params, five resources, paths of
ten segments, and the DeepSpeed ops edge of 3 in 8 runs.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
OFFLINE_SLURM_CONF = ROOT / "scripts" / "slurm-offline.conf"

MATRIX = {
    "strategy": [
        "torch-ddp",
        "torch-fsdp",
        "tf-multiworker",
        "deepspeed-zero0",
        "deepspeed-zero1",
        "deepspeed-zero2",
        "horovod-torch",
        "horovod-keras",
    ],
    "model": ["seed-small", "seed-large", "mnist-convnet", "alexnet", "vgg19"],
    "dataset": ["synthetic-imagenet"],
    "scale": [1, 2, 4, 8],
    "batch_size": [32, 64, 128, 256, 512],
    "workers": [1, 2],
}

#: One rule, as little as Snakemake can be given per job: the floor for this many jobs.
TRIVIAL = """\
N = int(config["jobs"])


rule all:
    input:
        expand("out/{i}.txt", i=range(N - 1)),


rule one:
    output:
        "out/{i}.txt",
    shell:
        "touch {output}"
"""


def dry_run(args: list[str], workdir: Path) -> tuple[float, float, str]:
    """Wall time and CPU time (user + system) of one `snakemake -n ...` in `workdir` (a fresh
    .snakemake each time), and its standard output. The CPU time is what other work on a
    shared machine disturbs least."""
    shutil.rmtree(workdir / ".snakemake", ignore_errors=True)
    env = {**os.environ, "SLURM_CONF": str(OFFLINE_SLURM_CONF)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(
        [SNAKEMAKE, "-n", "--directory", str(workdir), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode:
        sys.exit(f"snakemake -n {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return seconds, cpu, p.stdout


def job_count(stdout: str) -> int:
    """The `total` of Snakemake's job stats table."""
    match = re.search(r"^total\s+(\d+)\s*$", stdout, re.M)
    if not match:
        sys.exit("no job count in the dry-run's output")
    return int(match.group(1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=(
            "How close trainscale's dry-run of a large study comes to Snakemake's own floor."
        )
    )
    ap.add_argument("--rounds", type=int, default=3, help="runs of each, alternated (min taken)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats of each cell (5: 8,000 runs)")
    ap.add_argument("--keep", type=Path, help="write the study and the trivial workflow here")
    a = ap.parse_args(argv)

    where = a.keep or Path(tempfile.mkdtemp(prefix="dryrun-scale-"))
    study_dir, trivial_dir = where / "study", where / "trivial"
    for d in (study_dir, trivial_dir):
        d.mkdir(parents=True, exist_ok=True)
    cfg = study_dir / "study.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"study": "dryrun-scale", "accelerator": "cpu", "repeats": a.repeats, "matrix": MATRIX}
        )
    )
    (trivial_dir / "Snakefile").write_text(TRIVIAL)
    study = ["-s", str(ROOT / "Snakefile"), "--configfile", str(cfg)]
    try:
        # a first study dry-run (untimed: it warms the file cache) gives the job count
        _, _, out = dry_run(study, study_dir)
        jobs = job_count(out)
        trivial = ["-s", str(trivial_dir / "Snakefile"), "--config", f"jobs={jobs}"]
        times: dict[str, list[float]] = {"study": [], "trivial": []}
        cpus: dict[str, list[float]] = {"study": [], "trivial": []}
        for i in range(a.rounds):
            for name, args, workdir in (
                ("study", study, study_dir),
                ("trivial", trivial, trivial_dir),
            ):
                seconds, cpu, out = dry_run(args, workdir)
                if job_count(out) != jobs:
                    sys.exit(f"{name}: {job_count(out)} jobs, expected {jobs}")
                times[name].append(seconds)
                cpus[name].append(cpu)
                print(f"round {i + 1}: {name:7s} {seconds:6.2f} s ({cpu:.2f} s CPU)", flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(where, ignore_errors=True)
    best = {k: min(v) for k, v in times.items()}
    cpu = {k: min(v) for k, v in cpus.items()}
    print(f"jobs: {jobs} in each dry-run")
    print(
        f"trainscale study (snakemake -n): {best['study']:.2f} s "
        f"(min of {a.rounds}; CPU {cpu['study']:.2f} s)"
    )
    print(
        f"trivial Snakefile, same jobs:    {best['trivial']:.2f} s "
        f"(min of {a.rounds}; CPU {cpu['trivial']:.2f} s)"
    )
    print(f"ratio: {best['study'] / best['trivial']:.2f} (target <= 1.5)")
    print(f"CPU-time ratio: {cpu['study'] / cpu['trivial']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
