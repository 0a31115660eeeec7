"""ResNet-50 training on synthetic ImageNet, bf16, one GPU, through trainscale's own launcher:
what does eager PyTorch reach at the largest batch that fits, and what do `memory_format:
channels_last` and `compile: true` buy on top (issue 16 part 4; docs/gpu-validation.md)?

1. Batch sweep, eager (NCHW, no compile): batch 128, 256, 512, ... doubling until a run ends
   with status `oom` (or `--max-batch`); the largest batch that trained is the one used next.
2. At that batch, rounds of four cases, alternated so drift falls on every case alike:
   eager, channels_last, compile, channels_last + compile (the order rotates every round).

Every run is `python -m trainscale.launch` on a RunSpec built by `trainscale.plan.matrix` from a
study config, exactly as the `train` rule starts it (torch strategy, 1 GPU, bf16 autocast,
Adam), and the figure is the record's own `throughput`: steady images/s over epochs 2..E,
timed with device synchronisation (docs/metrics.md). The first epoch carries cuDNN autotuning
and, with `compile: true`, torch.compile's compilation; it is printed apart (`epoch1 s`).
Prints one line per run, then per case min/median/max images/s over the rounds and the ratio
of medians to eager.

    python benchmarks/gpu_resnet50.py [--rounds 2] [--scale 16] [--epochs 3] [--max-batch 1024]
        [--out results/gpu-resnet50]

It needs a CUDA GPU (it says so and exits 2 without one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))

from trainscale.gpu import paths as gpu_paths  # noqa: E402

CASES = {  # name -> the study keys it sets
    "eager": {},
    "channels_last": {"memory_format": "channels_last"},
    "compile": {"compile": True},
    "channels_last+compile": {"memory_format": "channels_last", "compile": True},
}


def train(batch: int, case: str, tag: str, a: argparse.Namespace) -> dict:
    """One run of `case` at `batch` (gpu_paths.train: the launcher, as the train rule starts
    it); its record, or a stand-in saying why there is none."""
    ctx = gpu_paths.Context(out=a.out, timeout_minutes=a.timeout_minutes)
    keys = {"study": "gpu-resnet50", "epochs": a.epochs, "timeout_minutes": a.timeout_minutes}
    t0 = time.perf_counter()
    try:
        rec = gpu_paths.train(
            ctx,
            f"{case}-b{batch}-{tag}",
            keys=keys | CASES[case],
            model="resnet50",
            dataset="synthetic-imagenet",
            scale=a.scale,
            batch_size=batch,
            precision="bf16",
        ).record
    except gpu_paths.CheckFailed as e:  # no record written
        rec = {"status": "no record", "error": str(e)}
    e1 = rec.get("epochs", [{}])[0].get("seconds") if rec.get("epochs") else None
    print(
        f"{case:<22} batch {batch:>5}  {rec['status']:<6} "
        + (f"{rec['throughput']:9.1f} images/s  " if rec.get("throughput") else " " * 21)
        + (f"epoch1 {e1:6.1f} s  " if e1 else "")
        + f"peak {((rec.get('memory') or {}).get('peak_device_bytes') or 0) / 2**30:5.1f} GiB  "
        + f"wall {time.perf_counter() - t0:5.0f} s"
        + ("" if rec["status"] == "ok" else f"  ({(rec.get('error') or '')[:120]!r})"),
        flush=True,
    )
    return rec


def main() -> int:
    p = argparse.ArgumentParser(
        description=(
            "ResNet-50 training on synthetic ImageNet, bf16, one GPU, through trainscale's own "
            "launcher: what does eager PyTorch reach at the largest batch that fits, and what do "
            "`memory_format: channels_last` and `compile: true` buy on top (issue 16 part 4; "
            "docs/gpu-validation.md)?"
        )
    )
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--scale", type=int, default=16, help="synthetic-imagenet × scale an epoch")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--min-batch", type=int, default=128)
    p.add_argument("--max-batch", type=int, default=1024)
    p.add_argument("--timeout-minutes", type=float, default=6.0)
    p.add_argument(
        "--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES)
    )
    p.add_argument("--out", type=Path, default=ROOT / "results" / "gpu-resnet50")
    a = p.parse_args()
    names = [c.strip() for c in a.cases.split(",")]
    if unknown := set(names) - set(CASES):
        p.error(f"--cases: unknown {sorted(unknown)}; the cases are {', '.join(CASES)}")
    import torch

    if not torch.cuda.is_available():
        print("gpu_resnet50: no CUDA device here; run it on a GPU node", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)

    best, batch = None, a.min_batch
    while batch <= a.max_batch:
        rec = train(batch, "eager", "sweep", a)
        if rec["status"] != "ok":
            break
        best, batch = batch, batch * 2
    if best is None:
        print("gpu_resnet50: not even the smallest batch trained", file=sys.stderr)
        return 1
    print(f"largest batch that trained: {best}", flush=True)

    seen: dict[str, list[float]] = {c: [] for c in names}
    for r in range(a.rounds):
        for case in names[r % len(names) :] + names[: r % len(names)]:
            rec = train(best, case, f"r{r}", a)
            if rec["status"] == "ok":
                seen[case].append(rec["throughput"])
    base = statistics.median(seen["eager"]) if seen.get("eager") else None
    print(f"\nbatch {best}, {a.rounds} round(s); images/s min / median / max, ratio of medians")
    for case, xs in seen.items():
        if not xs:
            print(f"{case:<22} no ok run")
            continue
        med = statistics.median(xs)
        ratio = f"{med / base:.3f}" if base else "n/a"
        print(f"{case:<22} {min(xs):9.1f} {med:9.1f} {max(xs):9.1f}   × {ratio}")
    summary = {"batch": best, "rounds": a.rounds, "throughput": seen}
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
