"""Does trainscale's `torch` strategy train a GPT as fast as nanoGPT's own benchmark does?

benchmarks/gpt_throughput.py compares the runner with a bare loop of trainscale's own model,
so it cannot see a cost in the model itself. This one runs the peer's code: nanoGPT's
`bench.py` and `model.py` from a checkout given on the command line (benchmarks fetch
nothing), unchanged, through benchmarks/nanogpt_bench.py (which sets the shape and runs it on
CPU), beside trainscale's `torch` runner through the real launcher, at the same shape: one
process, gpt-micro's 6 layers, 6 heads, width 384, context 256, batch 8, vocabulary 50,304
(bench.py's random ids; synthetic-tokens here), fp32, no compile, AdamW, `--threads` threads
each. Both time 20 steps after 10 of warm-up (the runner: 3 epochs of 10 steps, epoch 1 its
warm-up).

trainscale's side runs two ways (`--paths`): `launcher`, the RunSpec below through the real
supervisor (`python -m trainscale.launch`'s `supervise`, in this process), and `workflow`,
the same run as a user runs it: a study file (STUDY) through `snakemake --cores THREADS` in
a scratch directory, the tokens/s of the record it writes. After the first workflow round it
prints every field where the study's run differs from the launcher's RunSpec (none
expected). Each round runs every side once, the order rotated from round to round; it prints
each side's tokens/s min/median/max and each path's ratio to nanoGPT (the bar: a median of
at least 1.0).

    git clone https://github.com/karpathy/nanoGPT /somewhere/nanoGPT   # once, anywhere
    .venv/bin/python benchmarks/peer_nanogpt.py /somewhere/nanoGPT [--rounds 3] [--threads 2]
        [--paths launcher,workflow]
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
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(ROOT / "workflow"), os.environ.get("PYTHONPATH")])
)

import yaml  # noqa: E402
from harness_overhead import run_study, runner_record, spread  # noqa: E402

from trainscale.measure import metrics  # noqa: E402
from trainscale.plan.catalog import MODELS  # noqa: E402
from trainscale.plan.matrix import RunSpec  # noqa: E402

MODEL, SEQ_LEN, BATCH, STEPS = "gpt-micro", 256, 8, 10


def spec(threads: int) -> RunSpec:
    """trainscale's side: bench.py's optimizer settings (AdamW, lr 1e-4, betas 0.9/0.95,
    weight decay 0.01), its batch and context, on synthetic-tokens (50,304 ids, as bench.py's
    random ones)."""
    return RunSpec(
        study="bench", strategy="torch", model=MODEL, dataset="synthetic-tokens", scale=1,
        batch_size=BATCH, batch_mode="global", workers=1, nodes=1, precision="fp32", repeat=0,
        seed=0, epochs=3, optimizer="adamw", lr=1e-4, base_lr=1e-4, lr_scaling="none",
        betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, momentum=0.0, global_batch_size=BATCH,
        per_worker_batch_size=BATCH, world_size=1, threads_per_worker=threads,
        timeout_minutes=60, target_accuracy=None, data_dir="data", steps_per_epoch=STEPS,
        seq_len=SEQ_LEN,
    )  # fmt: skip


def study(threads: int) -> dict:
    """The workflow path's study file: `spec`'s run, as a user writes it."""
    return {
        "study": "peer-nanogpt", "epochs": 3, "steps_per_epoch": STEPS, "repeats": 1, "seed": 0,
        "threads_per_worker": threads, "timeout_minutes": 60, "target_accuracy": None,
        "optimizer": {"name": "adamw", "lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                      "weight_decay": 0.01},
        "matrix": {"strategy": ["torch"], "model": [MODEL], "dataset": ["synthetic-tokens"],
                   "seq_len": [SEQ_LEN], "batch_size": [BATCH], "workers": [1],
                   "precision": ["fp32"]},
    }  # fmt: skip


def workflow(tmp: Path, threads: int, i: int) -> dict:
    """STUDY through `snakemake --cores THREADS` in a new directory: the run's record."""
    work = tmp / f"workflow-{i}"
    work.mkdir()
    (work / "study.yaml").write_text(yaml.safe_dump(study(threads), sort_keys=False))
    run_study(work, work / "study.yaml", threads)
    (record,) = work.glob("results/peer-nanogpt/runs/**/metrics.json")
    return metrics.read(record)


def differences(ours: dict, theirs: dict) -> list[str]:
    """The fields where the workflow's run spec differs from the launcher's (study aside)."""
    keys = sorted((set(ours) | set(theirs)) - {"study"})
    return [
        f"{k}: {theirs.get(k)!r} -> {ours.get(k)!r}" for k in keys if ours.get(k) != theirs.get(k)
    ]


def nanogpt(checkout: str, threads: int) -> dict:
    layers, heads, width = MODELS[MODEL].gpt
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "nanogpt_bench.py"), checkout,
        f"--layers={layers}", f"--heads={heads}", f"--width={width}", "--",
        f"--batch_size={BATCH}", f"--block_size={SEQ_LEN}",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def trio(xs: list[float]) -> str:
    return f"{min(xs):>9.1f} {statistics.median(xs):>9.1f} {max(xs):>9.1f}"


def main() -> None:
    p = argparse.ArgumentParser(
        description=(
            "Does trainscale's `torch` strategy train a GPT as fast as "
            "nanoGPT's own benchmark does?"
        )
    )
    p.add_argument("nanogpt", help="a checkout of github.com/karpathy/nanoGPT")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="CPU threads of each side")
    p.add_argument("--paths", default="launcher,workflow", help="trainscale's sides")
    a = p.parse_args()
    paths = [x for x in a.paths.split(",") if x]
    if not paths or not set(paths) <= {"launcher", "workflow"}:
        p.error("--paths: launcher, workflow or both (comma-separated)")
    s = spec(a.threads)
    print(
        f"{MODEL} shape {MODELS[MODEL].gpt}, context {SEQ_LEN}, batch {BATCH}, fp32, "
        f"{a.threads} threads; load average at start {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    sides = [*paths, "nanoGPT"]
    rates: dict[str, list[float]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        run = {
            "launcher": lambda i: runner_record(s, Path(tmp)),
            "workflow": lambda i: workflow(Path(tmp), a.threads, i),
            "nanoGPT": lambda i: nanogpt(a.nanogpt, a.threads),
        }
        for i in range(a.rounds):
            order = sides[i % len(sides) :] + sides[: i % len(sides)]  # who goes first rotates
            got = {side: run[side](i) for side in order}
            if i == 0 and "workflow" in got:
                diff = differences(got["workflow"]["spec"], s.to_dict())
                print("workflow's run spec vs the launcher's: " + ("; ".join(diff) or "the same"))
            for side in sides:
                rates[side].append(got[side]["tokens_per_second"])
            print(
                f"round {i + 1} ({', '.join(order)}): "
                + ", ".join(f"{side} {rates[side][-1]:.1f}" for side in sides)
                + f" tokens/s (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    print(f"\n{'side':<12}{'min':>9} {'median':>9} {'max':>9} {'spread':>8}")
    for side in sides:
        print(f"{side:<12}{trio(rates[side])} {spread(rates[side]):>8.3f}")
    for path in paths:
        ratios = [x / y for x, y in zip(rates[path], rates["nanoGPT"], strict=True)]
        med = statistics.median(ratios)
        print(
            f"ratio trainscale ({path}) / nanoGPT: min {min(ratios):.3f}, median {med:.3f}, max "
            f"{max(ratios):.3f} ({'meets' if med >= 1.0 else 'below'} the 1.0 bar)"
        )
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
