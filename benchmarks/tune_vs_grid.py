"""Does `trainscale tune` find the grid's fastest cell for a third of the grid's cost?

The space: the default study's strategies (config.yaml) at two batch sizes on N = 2 CPU
workers (26 cells where three strategies cannot run two workers on CPU), seed-small on
digits at `--scale` (large enough that every grid run trains for 30 s or more, as runs on a
cluster do; the bench prints the grid runs' training seconds and says where one is shorter).
It runs, through the workflow as a user would (Snakemake, the default profile, `--cores`):

- the full grid, `--repeats` (3) repeats of every cell, one repeat per pass;
- the tune of the same study (`snakemake tune`), once per seed (`--seeds`, 3; the seed is the
  study's `seed`, so each tune's runs start from their own initialisations and data orders);

alternating, grid pass 1, tune seed 1, grid pass 2, tune seed 2, ..., so a drift of the
machine falls on both alike. One grid serves every seed: it is the reference the tunes are
judged against (its fastest cell and its own verdict), measured once over the same hours as the
tunes; no tune reads its records (each tune is its own study, results/<study>-tune-sN/tune/).

It prints, per seed: the worker-seconds of the tune and of the grid (the sum over runs of
world_size × wall_seconds, from the records), their ratio, the tune's winning set, and whether
it passes (issue 68): the set holds the grid's fastest cell, and no member of the set is
BEHIND (10 %) or more behind it by the grid's own estimates, at BAR (35 %) of the grid's
worker-seconds or less. Beside each, how often a random set of the same size passes the same
rule (cost aside) over RANDOM_DRAWS draws: a rule a random set passes more than 20 % of the
time cannot tell a good tune from a bad one, and the bench says so. The load average is
printed with every phase: run it alone.

    .venv/bin/python benchmarks/tune_vs_grid.py [--scale 500] [--seeds 3] [--repeats 3]
        [--cores N] [--work DIR]
    # a smoke check at tiny settings (two strategies, minutes):
    .venv/bin/python benchmarks/tune_vs_grid.py --strategies torch-ddp,torch-fsdp \\
        --batch-sizes 64,128 --scale 1 --epochs 2 --steps 8 --seeds 1 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))

from trainscale.analysis.ranking import ranking  # noqa: E402
from trainscale.measure import metrics  # noqa: E402
from trainscale.plan.check import load_config  # noqa: E402
from trainscale.plan.matrix import build_runs  # noqa: E402
from trainscale.plan.runspec import MATRIX_KEYS  # noqa: E402

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
BAR = 0.35
#: A winner this far behind the grid's fastest, by the grid, fails the tune.
BEHIND = 0.10
#: Random sets drawn per seed for the rule's own check; the most of them that may pass.
RANDOM_DRAWS, RANDOM_MOST = 10_000, 0.20


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def study_file(a: argparse.Namespace, work: Path, name: str, seed: int) -> Path:
    """A study file of the bench's space, laid over config.yaml as the user's would be."""
    study = {
        "study": name,
        "epochs": a.epochs,
        "repeats": a.repeats,
        "seed": seed,
        "target_accuracy": None,
        "timeout_minutes": 60,  # the slowest strategies' grid runs take many minutes
        "tune": {"steps_per_epoch": a.steps},
        "matrix": {
            "strategy": a.strategies,
            "model": ["seed-small"],
            "dataset": ["digits"],
            "scale": [a.scale],
            "batch_size": a.batch_sizes,
            "workers": [a.workers],
            "nodes": [1],
        },  # fmt: skip
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def snakemake(a: argparse.Namespace, work: Path, study: Path, *targets: str) -> float:
    """Snakemake on `targets` in `work`; its wall seconds. Stops the bench where it fails."""
    cmd = [SNAKEMAKE, *targets, "-s", str(ROOT / "Snakefile"), "--directory", str(work),
           "--cores", str(a.cores), "--configfile", str(study), "--quiet", "rules"]  # fmt: skip
    env = {**os.environ, "SLURM_CONF": str(ROOT / "scripts" / "slurm-offline.conf")}
    start = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode:
        sys.exit(f"snakemake failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return time.perf_counter() - start


def records(folder: Path) -> list[dict]:
    return [metrics.read(p) for p in sorted(folder.glob("**/metrics.json"))]


def worker_seconds(recs: list[dict]) -> float:
    """The sum over runs of world_size × wall_seconds (a run without wall_seconds: 0)."""
    return sum(r["spec"]["world_size"] * (r["wall_seconds"] or 0.0) for r in recs)


def cell(values: dict) -> tuple:
    return tuple(str(values[k]) for k in MATRIX_KEYS)


def name(values: dict) -> str:
    return f"{values['strategy']} batch {values['batch_size']}"


def grid_truth(scaling: pd.DataFrame) -> tuple[dict, dict[tuple, float]]:
    """The grid's fastest cell, and every cell's throughput as a share of the fastest's (the
    grid's geometric means), over the bench's one panel."""
    r = ranking(scaling)
    fastest = r[r["fastest"]].iloc[0]
    share = {cell(row): row["rate_mean"] / fastest["rate_mean"] for _, row in r.iterrows()}
    return fastest.to_dict(), share


def passes(chosen: set[tuple], fastest: tuple, share: dict[tuple, float]) -> bool:
    """The rule (cost aside): the grid's fastest is in the set, and no member is BEHIND or
    more behind it by the grid."""
    return fastest in chosen and all(share.get(c, 0.0) > 1 - BEHIND for c in chosen)


def behind(share: float | None) -> str:
    return "no runs" if share is None else f"{100 * (1 - share):.1f} %"


def random_pass_rate(size: int, fastest: tuple, share: dict[tuple, float], seed: int) -> float:
    """How often a random set of `size` of the grid's cells passes the rule."""
    rng = random.Random(seed)
    cells = sorted(share)
    size = min(max(size, 1), len(cells))
    hits = sum(passes(set(rng.sample(cells, size)), fastest, share) for _ in range(RANDOM_DRAWS))
    return hits / RANDOM_DRAWS


def own_shares(recs: list[dict]) -> dict[tuple, float]:
    """Every cell's throughput as a share of the fastest's by the tune's own runs (geometric
    means over its ok runs, confirmation runs included): where these put a cell nearer the
    fastest than the grid does, no number of such runs resolves the grid's gap."""
    logs: dict[tuple, list[float]] = {}
    for r in recs:
        if r["status"] == "ok" and r["throughput"]:
            logs.setdefault(cell(r["spec"]), []).append(math.log(r["throughput"]))
    means = {c: statistics.fmean(v) for c, v in logs.items()}
    top = max(means.values(), default=0.0)
    return {c: math.exp(m - top) for c, m in means.items()}


def tune_outcome(work: Path, study: str) -> dict:
    out = work / "results" / study / "tune"
    csv = pd.read_csv(out / "tune.csv", keep_default_na=False)
    csv = csv[csv["round"] > 0]
    last = csv.drop_duplicates("cell", keep="last")
    best = last[last["decision"] == "best"]
    recs = records(out)
    return {
        "winners": [row.to_dict() for _, row in best.iterrows()],
        "worker_seconds": worker_seconds(recs),
        "own_share": own_shares(recs),
        "runs": len(recs),
        "failed": sum(r["status"] != "ok" for r in recs),
        "rounds": int(csv["round"].max()),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=(
            "Does `trainscale tune` find the grid's fastest cell for a third of the grid's cost?"
        )
    )
    base = yaml.safe_load((ROOT / "config.yaml").read_text())
    p.add_argument("--strategies", default=",".join(base["matrix"]["strategy"]))
    p.add_argument("--batch-sizes", default="64,256")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--scale", type=int, default=500, help="digits replicated this many times")
    p.add_argument("--epochs", type=int, default=3, help="the grid's epochs (1 warm-up)")
    p.add_argument("--repeats", type=int, default=3, help="the grid's repeats")
    p.add_argument("--seeds", type=int, default=3, help="tunes, one per seed")
    p.add_argument("--steps", type=int, default=40, help="tune.steps_per_epoch")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    p.add_argument("--work", type=Path, default=None, help="default: a new temporary folder")
    p.add_argument("--name", default="tvg")
    a = p.parse_args()
    a.strategies = a.strategies.split(",")
    a.batch_sizes = [int(b) for b in a.batch_sizes.split(",")]
    work = a.work or Path(tempfile.mkdtemp(prefix="tune-vs-grid-"))
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "config.yaml").exists():  # study files are laid over the workflow's own
        (work / "config.yaml").symlink_to(ROOT / "config.yaml")
    grid = study_file(a, work, f"{a.name}-grid", 0)
    config, problems = load_config(grid)
    if problems:
        sys.exit("\n".join(problems))
    runs, _ = build_runs({k: v for k, v in config.items() if k != "_inherited"}, "cpu")
    cells = {cell(r.to_dict()) for r in runs}
    print(f"{len(cells)} cells (seed-small, digits × {a.scale}, N={a.workers}, batch "
          f"{a.batch_sizes}); grid {a.repeats} repeats × {a.epochs} epochs; tune seeds "
          f"{a.seeds}, {a.steps} steps an epoch; {a.cores} cores; work {work}")  # fmt: skip
    if any(r.framework == "deepspeed" for r in runs):  # built once, before anything is timed
        snakemake(a, work, grid, ".cache/torch_extensions/deepspeed-ops.done")
    tunes, grid_seconds = {}, []
    for i in range(max(a.repeats, a.seeds)):
        if i < a.repeats:
            targets = [f"results/{config['study']}/runs/{r.path}/metrics.json"
                       for r in runs if r.repeat == i]  # fmt: skip
            s = snakemake(a, work, grid, *targets)
            grid_seconds.append(s)
            print(f"grid pass {i + 1}: {len(targets)} runs, {s:.0f} s; {load()}", flush=True)
        if i < a.seeds:
            study = f"{a.name}-tune-s{i + 1}"
            s = snakemake(a, work, study_file(a, work, study, 100 * (i + 1)), "tune")
            tunes[i + 1] = {**tune_outcome(work, study), "seconds": s}
            print(f"tune seed {i + 1}: {tunes[i + 1]['runs']} runs in {tunes[i + 1]['rounds']}"
                  f" rounds, {s:.0f} s; {load()}", flush=True)  # fmt: skip
    snakemake(a, work, grid, f"results/{config['study']}/scaling.csv")
    grid_recs = records(work / "results" / config["study"] / "runs")
    grid_ws = worker_seconds(grid_recs)
    trained = [sum(e["seconds"] for e in r["epochs"]) for r in grid_recs if r["status"] == "ok"]
    scaling = pd.read_csv(work / "results" / config["study"] / "scaling.csv")
    fastest, share = grid_truth(scaling)
    close = [c for c, v in share.items() if v > 1 - BEHIND and c != cell(fastest)]
    print(f"\ngrid: {len(grid_recs)} runs, {grid_ws:,.0f} worker-seconds; training seconds a "
          f"run min {min(trained):.1f} / median {statistics.median(trained):.1f} / max "
          f"{max(trained):.1f}" + ("" if min(trained) >= 30 else
                                   "  (SHORTER THAN 30 s: raise --scale)"))  # fmt: skip
    print(f"grid's fastest: {name(fastest)} ({fastest['rate_mean']:,.0f} samples/s); within "
          f"{100 * BEHIND:.0f} % of it by the grid: {len(close)} other cells")  # fmt: skip
    print(
        f"wall-clock (Snakemake's, every start-up included): grid {sum(grid_seconds):,.0f} s; "
        + ", ".join(f"tune seed {k} {t['seconds']:,.0f} s" for k, t in tunes.items())
    )
    passed, rates = 0, {}
    for seed, t in tunes.items():
        ratio = t["worker_seconds"] / grid_ws
        won = {cell(w): w for w in t["winners"]}
        ok = passes(set(won), cell(fastest), share) and ratio <= BAR
        passed += ok
        rates[seed] = random_pass_rate(len(won), cell(fastest), share, seed)
        far = [name(w) for c, w in won.items() if share.get(c, 0.0) <= 1 - BEHIND]
        print(f"seed {seed}: tune {t['worker_seconds']:,.0f} worker-seconds = {ratio:.1%} of the "
              f"grid's ({t['runs']} runs, {t['failed']} failed, {t['rounds']} rounds, "
              f"{t['seconds']:.0f} s wall); winning set: "
              f"{', '.join(name(w) for w in won.values()) or 'none'}; grid's fastest "
              + ("in it" if cell(fastest) in won else "not in it")
              + f"; {100 * BEHIND:.0f} % or more behind: {', '.join(far) or 'none'}"
              + f" -> {'PASS' if ok else 'FAIL'}; a random set of {len(won)} passes the rule "
              f"{rates[seed]:.1%}"
              + ("" if rates[seed] <= RANDOM_MOST else f" (MORE THAN {100 * RANDOM_MOST:.0f} %: "
                 "the rule cannot tell this tune from chance)"))  # fmt: skip
        shown = sorted(set(won) | {cell(fastest)} | set(close), key=lambda c: -share.get(c, 0.0))
        gaps = [
            f"{name(dict(zip(MATRIX_KEYS, c, strict=True)))} "
            f"{behind(t['own_share'].get(c))} / {behind(share.get(c))}"
            for c in shown
        ]
        print("  behind the fastest, by the tune's own runs / by the grid: " + "; ".join(gaps))
    print(f"\n{passed} of {len(tunes)} seeds meet the bar (the grid's fastest in the set, none "
          f"{100 * BEHIND:.0f} % behind, at <= {100 * BAR:.0f} % of the grid's worker-seconds); "
          f"issue 68 asks "
          f"for 2 of 3; a random set of the same size passes at most "
          f"{max(rates.values(), default=float('nan')):.1%} (issue 68: at most "
          f"{100 * RANDOM_MOST:.0f} %)")  # fmt: skip
    (work / "tune_vs_grid.json").write_text(json.dumps(
        {"grid_worker_seconds": grid_ws, "passed": passed,
         "tunes": {k: {**t, "own_share": {"/".join(c): v for c, v in t["own_share"].items()}}
                   for k, t in tunes.items()},
         "random_pass_rate": rates}, indent=1,
        default=str))  # fmt: skip


if __name__ == "__main__":
    main()
