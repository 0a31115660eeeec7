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

`--breakdown`: where each run's time goes, from Snakemake's job start to its record, per
framework family and strategy. It runs a study through Snakemake as a user does
(`--configfile FILE`, e.g. config.yaml, `make run`'s showcase; default
benchmarks/breakdown.yaml, one cell of each family) in a scratch directory, or reads one
already run (`--existing DIR`, e.g. this checkout after `make run`), and prints from the
records' `timeline` blocks (trainscale/measure/timeline.py) and Snakemake's job metadata the
mean seconds per run of each of PHASES, then the study's elapsed time beside its runs' own
wall (Σ `wall_seconds`), each rule's job time and the time no job ran:

    .venv/bin/python benchmarks/harness_overhead.py --breakdown [--configfile config.yaml]
        [--cores 2] [--existing DIR]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
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
from trainscale.plan.catalog import STRATEGIES  # noqa: E402
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


# --- --breakdown: a study through Snakemake, each run's time by phase -----------------------

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
#: the phases of a run, in order: Snakemake's job start to the supervisor's process; the
#: supervisor's imports to the launcher's start; the launcher to rank 0's process; its imports
#: to the Recorder; the set-up's phases (runners mark them: Timeline.ends); the timed epochs;
#: evaluation and exposed communication (its no-sync steps), then the other measurements after
#: training (memory, flops, framework: runners/guarded.py); what else the loop did inside
#: wall_seconds; the record assembled to on disk; the workers' and launcher's exit; the
#: supervisor's stamp (its rewrite of the record, Snakemake's end of the job)
PHASES = ["job start", "supervisor", "launcher", "imports", "rendezvous", "data", "model",
          "other set-up", "epochs", "evaluation", "communication", "measurements", "loop rest",
          "record", "exit", "stamp"]  # fmt: skip


def run_study(work: Path, study: Path, cores: int, *targets: str) -> float:
    """`snakemake` of `study` in `work` as a user runs it (SLURM's start-up wait off, as
    `make run` has it); its wall seconds."""
    env = {**os.environ, "SLURM_CONF": str(ROOT / "scripts" / "slurm-offline.conf")}
    cmd = [SNAKEMAKE, "-s", str(ROOT / "Snakefile"), "--directory", str(work),
           "--configfile", str(study), "--cores", str(cores), *targets]  # fmt: skip
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return seconds


def job_metadata(work: Path) -> dict[str, dict]:
    """Snakemake's record of each output it made in `work`, by output path: its rule, job
    start (`starttime`) and the output's last write (`endtime`), in Unix seconds."""
    out = {}
    top = work / ".snakemake" / "metadata"
    for path in top.rglob("*") if top.is_dir() else []:
        if path.is_file() and not path.name.startswith("@"):
            parts = path.relative_to(top).parts  # long keys are split into "@"-led folders
            key = "".join(p.removeprefix("@") for p in parts)
            try:
                out[base64.urlsafe_b64decode(key).decode()] = json.loads(path.read_text())
            except ValueError:
                continue
    return out


def phases(rec: dict, job: dict | None) -> dict[str, float | None]:
    """A run's seconds in each of PHASES, from its record's timeline and its job's metadata
    (None where either lacks the moment a phase needs)."""
    t = rec.get("timeline") or {}

    def between(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else max(b - a, 0.0)

    set_up, parts = t.get("set_up") or {}, dict(t.get("parts") or {})
    evaluation, communication = parts.pop("evaluation", 0.0), parts.pop("communication", 0.0)
    epochs = sum(e["seconds"] for e in rec["epochs"])
    inside = (rec.get("setup_seconds") or 0) + epochs + evaluation + communication
    wall = rec.get("wall_seconds")
    return {
        "job start": between(job and job.get("starttime"), t.get("supervisor_start_unix")),
        "supervisor": between(t.get("supervisor_start_unix"), t.get("launched_unix")),
        "launcher": between(t.get("launched_unix"), t.get("worker_start_unix")),
        "imports": between(t.get("worker_start_unix"), t.get("recorder_unix")),
        "rendezvous": set_up.get("rendezvous"),
        "data": set_up.get("data"),
        "model": set_up.get("model"),
        "other set-up": set_up.get("other"),
        "epochs": epochs,
        "evaluation": evaluation,
        "communication": communication,
        "measurements": sum(parts.values()),
        "loop rest": None if wall is None else max(wall - inside - sum(parts.values()), 0.0),
        "record": between(t.get("record_unix"), t.get("written_unix")),
        "exit": between(t.get("written_unix"), t.get("exited_unix")),
        "stamp": between(t.get("exited_unix"), job and job.get("endtime")),
    }


def mean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def breakdown(work: Path, elapsed: float | None, since: float = 0.0) -> None:
    """Print each family's and strategy's mean seconds per phase, then the study's totals."""
    jobs = {k: v for k, v in job_metadata(work).items() if (v.get("starttime") or 0) >= since}
    runs = []
    for out, job in jobs.items():
        if job.get("rule") == "train" and (work / out).exists():
            rec = metrics.read(work / out)
            runs.append((rec, phases(rec, job), job))
    if not runs:
        raise SystemExit(f"no train jobs with records in {work}/.snakemake/metadata")
    groups: dict[str, list[dict]] = defaultdict(list)
    for rec, ph, _ in runs:
        strategy = rec["spec"]["strategy"]
        groups[f"{STRATEGIES[strategy].framework} (family)"].append(ph)
        groups[f"  {strategy}"].append(ph)
    names = sorted(groups, key=family_first)
    width = max(len(g) for g in names)
    print(f"mean seconds per run, by phase ({len(runs)} runs); 'own' = wall_seconds / job")
    print(f"{'':<{width}} {'runs':>4} " + " ".join(f"{ph[:9]:>9}" for ph in PHASES)
          + f" {'job':>7} {'own':>5}")  # fmt: skip
    for g in names:
        rows = groups[g]
        cells = [mean([r[ph] for r in rows]) for ph in PHASES]
        total = sum(c for c in cells if c is not None)
        own = sum(c or 0 for c, ph in zip(cells, PHASES, strict=True) if ph in OWN) / total
        print(f"{g:<{width}} {len(rows):>4} "
              + " ".join("        -" if c is None else f"{c:>9.2f}" for c in cells)
              + f" {total:>7.1f} {own:>5.0%}")  # fmt: skip
    own_wall = sum(rec["wall_seconds"] or 0 for rec, _, _ in runs)
    job_seconds = sum(j["endtime"] - j["starttime"] for _, _, j in runs)
    span = max(j["endtime"] for j in jobs.values()) - min(j["starttime"] for j in jobs.values())
    whole = elapsed if elapsed is not None else span
    how = "snakemake's wall" if elapsed is not None else "first job start to last output"
    print()
    print(
        f"study: {whole:.0f} s elapsed ({how}); the runs' own wall (Σ wall_seconds) "
        f"{own_wall:.0f} s = {own_wall / whole:.0%} of it; their jobs Σ {job_seconds:.0f} s"
    )
    # a job has a record per output, each with the job's start and log: one span per job
    spans: dict[tuple, tuple[float, float]] = {}
    for out, j in jobs.items():
        key = (j.get("rule") or "?", *(j.get("log") or [out]))
        start, end = spans.get(key, (j["starttime"], j["endtime"]))
        spans[key] = (min(start, j["starttime"]), max(end, j["endtime"]))
    by_rule: dict[str, list[float]] = defaultdict(list)
    for (rule, *_), (start, end) in spans.items():
        by_rule[rule].append(end - start)
    print("jobs by rule (Σ seconds, count): " + ", ".join(
        f"{rule} {sum(xs):.0f} s ×{len(xs)}" for rule, xs in sorted(
            by_rule.items(), key=lambda kv: -sum(kv[1]))))  # fmt: skip
    busy, last = 0.0, float("-inf")  # the union of the jobs' spans
    for start, end in sorted(spans.values()):
        busy += max(end - max(start, last), 0.0)
        last = max(last, end)
    print(f"no job running for {whole - busy:.0f} s of the {whole:.0f} s (Snakemake's start and "
          "its bookkeeping between jobs; the last job's end to snakemake's exit)")  # fmt: skip


#: the phases inside the run's own wall_seconds (from the Recorder to the record)
OWN = {"rendezvous", "data", "model", "other set-up", "epochs", "evaluation", "communication",
       "measurements", "loop rest"}  # fmt: skip


def family_first(group: str) -> tuple:
    """Each family's row, then its strategies' rows."""
    name = group.strip()
    if name.endswith("(family)"):
        return (name.split()[0], "")
    return (STRATEGIES[name].framework, name)


def breakdown_main(a: argparse.Namespace) -> None:
    if a.existing:
        breakdown(Path(a.existing).resolve(), None)
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.workdir or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        study = Path(a.configfile or ROOT / "benchmarks" / "breakdown.yaml").resolve()
        for shared in ("data", ".cache"):  # the data sets and the built ops, as in the checkout
            if not (work / shared).exists():
                (work / shared).symlink_to(ROOT / shared, target_is_directory=True)
        print(f"{study.name} through snakemake --cores {a.cores} in {work}; load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)  # fmt: skip
        since = time.time()
        elapsed = run_study(work, study, a.cores)
        breakdown(work, elapsed, since)
    print(f"load average at end {os.getloadavg()[0]:.1f}")


def main() -> None:
    p = argparse.ArgumentParser(
        description=("How much does trainscale's runner cost over a minimal hand-written loop?")
    )
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
    p.add_argument("--breakdown", action="store_true", help="each run's time by phase")
    p.add_argument("--configfile", help="--breakdown: the study (default breakdown.yaml)")
    p.add_argument("--cores", type=int, default=2, help="--breakdown: snakemake --cores")
    p.add_argument("--existing", help="--breakdown: read a directory snakemake ran in")
    p.add_argument("--workdir", help="--breakdown: run there and keep it (default: a scratch dir)")
    a = p.parse_args()
    if a.breakdown:
        breakdown_main(a)
        return
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
