"""How long does the memory pre-flight take, and how close are its predictions?

1. Pre-flight time (trainscale.plan.memory) for a study's cells, cold (an empty cache: one
   child imports torch and traces every cell) and warm (every answer cached), alternating
   cold and warm over `--rounds`, min/median/max each. Targets for .test/gpt.yaml on the
   2-core machine: cold ≤ 60 s, warm ≤ 1 s.
2. Prediction against measurement:
   - on CPU, each cell of the study traced with fake tensors against the same step traced
     with real ones under the same tracker (ratio fake ÷ real; the trackers see the same
     storages, so anything but 1 is a bug in the fake path);
   - the two H200 cells measured on a lent GPU (issue 45: bf16 autocast, seq_len 1024, batch
     16, AdamW; torch.cuda.max_memory_allocated), predicted here for CUDA: gpt2-124m under
     torch, 17,843,420,672 B; gpt2-774m under torch-fsdp at one rank, 43,617,351,680 B. The
     bar is within 10% of each.
   - on a machine with CUDA (`--gpu`), each cell of the study is also run for real and its
     measured peak (the record's memory.peak_device_bytes) is set beside the prediction.

The machine is shared: the load average is printed with each figure.

    .venv/bin/python benchmarks/memory_estimate.py [--study .test/gpt.yaml] [--rounds 3]
        [--skip-h200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))

import yaml  # noqa: E402

from trainscale.plan import check, matrix, memory, overlay  # noqa: E402
from trainscale.plan.runspec import RunSpec  # noqa: E402

#: the H200 cells of issue 45: (strategy, model, measured bytes)
H200 = [("torch", "gpt2-124m", 17_843_420_672), ("torch-fsdp", "gpt2-774m", 43_617_351_680)]


def load() -> str:
    return "load " + " ".join(f"{v:.2f}" for v in os.getloadavg())


def study_runs(path: Path) -> list[RunSpec]:
    base = yaml.safe_load(overlay.BASE_CONFIG.read_text())
    config = overlay.overlay(base, yaml.safe_load(path.read_text()))
    check.fill_defaults(config, yaml.safe_load(matrix.CONFIG_SCHEMA.read_text()))
    runs, _ = matrix.build_runs(config, "cpu")
    return [r for r in runs if r.repeat == 0]


def preflight_seconds(runs: list[RunSpec], cache: Path, cold: bool) -> float:
    if cold:
        shutil.rmtree(cache, ignore_errors=True)
    t0 = time.perf_counter()
    answers = memory.predict(runs, "cpu")
    seconds = time.perf_counter() - t0
    bad = [p for p, a in answers.items() if "error" in a]
    if bad:
        raise SystemExit(f"not predicted: {bad[:3]}")
    return seconds


def h200_cells() -> None:
    from trainscale.runners.torch import memory_steps, memory_trace

    spec0 = study_runs(ROOT / ".test" / "gpt.yaml")[0]
    for strategy, model, measured in H200:
        spec = spec0.__class__.from_dict({
            **spec0.to_dict(), "strategy": strategy, "model": model, "dataset": "synthetic-tokens",
            "seq_len": 1024, "batch_size": 16, "global_batch_size": 16,
            "per_worker_batch_size": 16, "workers": 1, "world_size": 1, "precision": "bf16",
            "optimizer": "adamw", "own_model": None, "token_source": None,
        })  # fmt: skip
        t0 = time.perf_counter()
        a = memory_trace.predict(spec, "cuda")
        err = measured / a["total_bytes"] - 1
        print(f"  {strategy} {model}: predicted {a['total_bytes'] / 2**30:.2f} GiB (traced on "
              f"{a['traced_on']}) against {measured / 2**30:.2f} GiB measured on an H200: "
              f"measured ÷ predicted − 1 = {err:+.1%} ({time.perf_counter() - t0:.0f} s, "
              f"{load()})")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", type=Path, default=ROOT / ".test" / "gpt.yaml")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip-h200", action="store_true")
    args = p.parse_args()
    runs = study_runs(args.study)
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the cache is relative to where Snakemake would run
        cache = Path(tmp) / memory.CACHE
        times: dict[str, list[float]] = {"cold": [], "warm": []}
        for i in range(args.rounds):
            for kind in ("cold", "warm") if i % 2 == 0 else ("warm", "cold"):
                if kind == "warm" and not cache.is_dir():
                    preflight_seconds(runs, cache, cold=True)
                s = preflight_seconds(runs, cache, cold=kind == "cold")
                times[kind].append(s)
                print(f"round {i + 1} {kind}: {s:.2f} s for {len(runs)} cells ({load()})")
        os.chdir(here)
    for kind, ts in times.items():
        print(f"{kind}: min {min(ts):.2f} s, median {statistics.median(ts):.2f} s, "
              f"max {max(ts):.2f} s over {len(ts)} rounds")  # fmt: skip
    from trainscale.runners.torch import memory_steps, memory_trace

    print("fake ÷ real trace of the same step, per cell:")
    for r in runs:
        fake = memory_trace.predict(r, "cpu")["total_bytes"]
        with memory_steps.real_tensors():
            real = memory_trace.predict(r, "cpu")["total_bytes"]
        print(f"  {r.strategy} N={r.world_size} tp={r.tp}: {fake / real:.4f} ({fake:,} B)")
    if not args.skip_h200:
        print("the H200 cells of issue 45, predicted for CUDA:")
        h200_cells()


if __name__ == "__main__":
    main()
