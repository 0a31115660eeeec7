"""How long does the memory pre-flight take, and how close are its predictions?

1. Pre-flight time (trainscale.plan.preflight.memory) for a study's cells, cold (an empty cache: one
   child imports torch and traces every cell) and warm (every answer cached), alternating
   cold and warm over `--rounds`, min/median/max each. Targets for .test/gpt.yaml on the
   2-core machine: cold ≤ 60 s, warm ≤ 1 s.
2. Prediction against measurement:
   - on CPU, each cell of the study traced with fake tensors against the same step traced
     with real ones under the same tracker (ratio fake ÷ real; the trackers see the same
     storages, so anything but 1 is a bug in the fake path);
   - the cells of benchmarks/gpu_memory.py measured on an H200 (bf16, AdamW, one rank;
     torch.cuda.max_memory_allocated), predicted here for CUDA: gpt2-124m under torch (the
     bar: within 5 %) and gpt2-774m under torch-fsdp (within 10 %) among them.
3. `--large` (issue 59): `hf:llama3.1-8b` at seq_len 8192, batch 2 per worker, bf16, planned
   for CUDA: torch-fsdp on 8 ranks with selective checkpointing, and deepspeed-zero3 on 64
   ranks (8 × 8 nodes, full checkpointing: ZeRO-3 refuses selective). Each cell cold (an
   empty cache: the planner's pre-flight of the Hugging Face model, then one child that
   imports torch and traces the cell; target ≤ 3 minutes on the 2-core machine), then where
   the time of its trace goes (cProfile of the same prediction in this process, by stage).
   `--whole` also traces the FSDP cell whole (every block, ~3 minutes) against the scaled one.
4. `--study20` (issue 59): a 20-cell study of it (torch-fsdp; torch-fsdp-tp at tp 2 and 8,
   the matrix keeping tp 8 from 2 nodes; deepspeed-zero3 with and without offload optimizer;
   each at 1-4 nodes of 8; and torch-fsdp with offload params at 1 node) planned cold:
   build_runs with the pre-flight, then every cell predicted (target ≤ 5 minutes).

The machine is shared: the load average is printed with each figure. Measure alone.

    .venv/bin/python benchmarks/memory_estimate.py [--study .test/gpt.yaml] [--rounds 3]
        [--skip-h200] [--skip-study] [--large [--whole]] [--study20]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))

import yaml  # noqa: E402

from trainscale.plan import check, matrix, overlay  # noqa: E402
from trainscale.plan.preflight import memory  # noqa: E402
from trainscale.plan.runspec import RunSpec  # noqa: E402

#: torch.cuda.max_memory_allocated of each cell of benchmarks/gpu_memory.py (bf16, one rank,
#: seq_len 1024, batch 16; ResNet-50 at 256) on an H200, torch 2.11.0+cu130, 2026-11-29
H200 = {
    "torch": 17_855_267_840, "torch-ddp": 18_849_245_696, "torch-fsdp": 16_622_771_200,
    "lightning-ddp": 18_843_949_568, "torch-ckpt-full": 12_209_198_080,
    "torch-ckpt-selective": 15_238_546_432, "torch-fsdp-774m": 45_164_795_904,
    "torch-resnet50": 12_827_652_096, "deepspeed-zero1": 16_594_503_680,
    "deepspeed-zero2": 16_594_503_680, "deepspeed-zero3": 17_843_593_728,
}  # fmt: skip
#: the Llama 3.1 8B cells of issue 59: (strategy, nodes, activation checkpointing)
LARGE = [("torch-fsdp", 1, "selective"), ("deepspeed-zero3", 8, "full")]
LLAMA = {"model": ["hf:llama3.1-8b"], "dataset": ["synthetic-tokens"], "seq_len": [8192],
         "batch_size": [2], "batch_mode": ["per_worker"], "workers": [8],
         "precision": ["bf16"]}  # fmt: skip
#: where a trace's time goes: the functions whose cumulative time is shown, by stage
STAGES = {
    "build on meta (builder, truncation, checkpointing)": "memory/steps.py:.*\\(meta_model\\)",
    "fake tensors for parameters and buffers": "memory/steps.py:.*\\(fake_model\\)",
    "wrapping (FSDP's fully_shard, TP's plan)": "\\((fully_shard|parallelize)\\)",
    "forward and backward under the tracker": "memory/steps.py:.*\\(forward_backward\\)",
    "the whole traced steps (forward, backward, optimizer)": "memory/steps.py:.*\\(tracked\\)",
    "DeepSpeed's states (arithmetic)": "memory_parts.py:.*\\(zero_states\\)",
}


def load() -> str:
    return "load " + " ".join(f"{v:.2f}" for v in os.getloadavg())


def config_of(study: dict) -> dict:
    base = yaml.safe_load(overlay.BASE_CONFIG.read_text())
    config = overlay.overlay(base, study)
    check.fill_defaults(config, yaml.safe_load(matrix.CONFIG_SCHEMA.read_text()))
    return config


def study_runs(path: Path) -> list[RunSpec]:
    runs, _ = matrix.build_runs(config_of(yaml.safe_load(path.read_text())), "cpu")
    return [r for r in runs if r.repeat == 0]


@contextlib.contextmanager
def scratch():
    """A fresh working directory (the planner's caches are relative to it), removed after."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(here)


def preflight_seconds(runs: list[RunSpec], cache: Path, cold: bool, target: str = "cpu") -> float:
    if cold:
        shutil.rmtree(cache, ignore_errors=True)
    t0 = time.perf_counter()
    answers = memory.predict(runs, target)
    seconds = time.perf_counter() - t0
    bad = [(p, a["error"]) for p, a in answers.items() if "error" in a]
    if bad:
        raise SystemExit(f"not predicted: {bad[:3]}")
    return seconds


def study_timing(path: Path, rounds: int) -> list[RunSpec]:
    runs = study_runs(path)
    with scratch() as tmp:
        cache = tmp / memory.CACHE
        times: dict[str, list[float]] = {"cold": [], "warm": []}
        for i in range(rounds):
            for kind in ("cold", "warm") if i % 2 == 0 else ("warm", "cold"):
                if kind == "warm" and not cache.is_dir():
                    preflight_seconds(runs, cache, cold=True)
                s = preflight_seconds(runs, cache, cold=kind == "cold")
                times[kind].append(s)
                print(f"round {i + 1} {kind}: {s:.2f} s for {len(runs)} cells ({load()})")
    for kind, ts in times.items():
        print(f"{kind}: min {min(ts):.2f} s, median {statistics.median(ts):.2f} s, "
              f"max {max(ts):.2f} s over {len(ts)} rounds")  # fmt: skip
    return runs


def fake_against_real(runs: list[RunSpec]) -> None:
    from trainscale.runners.torch.memory import steps as memory_steps
    from trainscale.runners.torch.memory import trace as memory_trace

    print("fake ÷ real trace of the same step, per cell:")
    for r in runs:
        fake = memory_trace.predict(r, "cpu")["total_bytes"]
        with memory_steps.real_tensors():
            real = memory_trace.predict(r, "cpu")["total_bytes"]
        print(f"  {r.strategy} N={r.world_size} tp={r.tp}: {fake / real:.4f} ({fake:,} B)")


def h200_cells() -> None:
    import gpu_memory

    answers = gpu_memory.predicted(list(H200), gpu_memory.study_keys(20))
    print("the cells of benchmarks/gpu_memory.py measured on an H200, predicted for CUDA here "
          "(allocated peak; bar: within 5 % for torch, 10 % for torch-fsdp-774m):")  # fmt: skip
    for name, measured in H200.items():
        got = answers[name]["total_bytes"]
        print(f"  {name:<22} predicted {got / 2**30:6.2f} GiB, measured {measured / 2**30:6.2f} "
              f"GiB: measured ÷ predicted − 1 = {measured / got - 1:+.1%} ({load()})")  # fmt: skip


def llama_runs(cells: list[tuple[str, int, str]], **matrix_extra) -> tuple[dict, list[RunSpec]]:
    """The study config and its runs (repeat 0) for `cells` of LLAMA, planned for CUDA."""
    runs = []
    config = None
    for strategy, nodes, checkpointing in cells:
        study = {
            "study": "llama",
            "memory": {"limit_gib": 80},
            "matrix": {
                **LLAMA,
                "strategy": [strategy],
                "nodes": [nodes],
                "activation_checkpointing": [checkpointing],
                **matrix_extra,
            },
        }
        config = config_of(study)
        found, dropped = matrix.build_runs(config, "cuda")
        if not found:
            raise SystemExit(f"{strategy}: {[d.reason for d in dropped]}")
        runs += [r for r in found if r.repeat == 0]
    return config, runs


def where_the_time_goes(spec: RunSpec, scale: bool = True) -> dict:
    """The prediction of `spec` in this process under cProfile, its seconds by STAGES."""
    import re

    from trainscale.runners.torch.memory import trace as memory_trace

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    answer = memory_trace.predict(spec, "cuda", scale=scale)
    prof.disable()
    total = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats
    print(f"    in this process: {total:.1f} s ({load()}), of which (cumulative, overlapping):")
    for stage, pattern in STAGES.items():
        seconds = sum(st[3] for (f, line, name), st in stats.items()
                      if re.search(pattern, f"{Path(f).name}:{line}({name})"))  # fmt: skip
        if seconds:
            print(f"      {stage}: {seconds:.1f} s")
    return answer


def large_cells(whole: bool) -> None:
    print("hf:llama3.1-8b, seq_len 8192, batch 2 per worker, bf16, planned for CUDA:")
    for cell in LARGE:
        with scratch() as tmp:
            t0 = time.perf_counter()
            config, runs = llama_runs([cell])
            planned = time.perf_counter() - t0
            preflight_seconds(runs, tmp / memory.CACHE, cold=True, target="cuda")
            cold = time.perf_counter() - t0
            (r,) = runs
            a = memory.predict(runs, "cuda")[r.path]
        parts = ", ".join(f"{k} {v / 2**30:.1f}" for k, v in a["parts"].items() if v)
        print(f"  {r.strategy} at {r.world_size} ranks ({r.activation_checkpointing} "
              f"checkpointing): {a['total_bytes'] / 2**30:.1f} GiB allocated, "
              f"{a['reserved_bytes'] / 2**30:.1f} GiB reserved side (GiB: {parts}); cold "
              f"{cold:.1f} s = pre-flight and build_runs {planned:.1f} s + the memory child "
              f"{cold - planned:.1f} s (the trace itself {a['seconds']:.1f} s) ({load()})"
              )  # fmt: skip
        scaled = where_the_time_goes(r)
        if whole and r.strategy == "torch-fsdp":
            got = where_the_time_goes(r, scale=False)
            off = scaled["total_bytes"] / got["total_bytes"] - 1
            print(f"    traced whole: {got['total_bytes']:,} B against scaled "
                  f"{scaled['total_bytes']:,} B ({off:+.3%})")  # fmt: skip


def study20() -> None:
    cells = [("torch-fsdp", n, "selective") for n in (1, 2, 3, 4)]
    cells += [("deepspeed-zero3", n, "full") for n in (1, 2, 3, 4)]
    with scratch() as tmp:
        t0 = time.perf_counter()
        _, runs = llama_runs(cells)
        _, tp = llama_runs([("torch-fsdp-tp", n, "selective") for n in (1, 2, 3, 4)], tp=[2, 8])
        _, off = llama_runs([("deepspeed-zero3", n, "full") for n in (1, 2, 3, 4)],
                            offload=["optimizer"])  # fmt: skip
        _, fsdp_off = llama_runs([("torch-fsdp", 1, "selective")], offload=["params"])
        runs += tp + off + fsdp_off
        planned = time.perf_counter() - t0
        preflight_seconds(runs, tmp / memory.CACHE, cold=True, target="cuda")
        total = time.perf_counter() - t0
    print(f"the 20-cell hf:llama3.1-8b study ({len(runs)} cells: torch-fsdp, torch-fsdp-tp at "
          f"tp 2 and 8 (tp 8 from 2 nodes), deepspeed-zero3 with and without offload, 1-4 "
          f"nodes of 8, and torch-fsdp with offload params at 1 node) planned "
          f"cold: {total:.1f} s = build_runs with the pre-flight {planned:.1f} s + every cell's "
          f"memory {total - planned:.1f} s ({load()})")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(
        description=("How long does the memory pre-flight take, and how close are its predictions?")
    )
    p.add_argument("--study", type=Path, default=ROOT / ".test" / "gpt.yaml")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip-h200", action="store_true")
    p.add_argument("--skip-study", action="store_true", help="no pre-flight timing, fake ÷ real")
    p.add_argument("--large", action="store_true", help="the Llama 3.1 8B cells (issue 59)")
    p.add_argument("--whole", action="store_true", help="with --large: also trace FSDP whole")
    p.add_argument("--study20", action="store_true", help="the 20-cell Llama study, cold")
    args = p.parse_args()
    if not args.skip_study:
        fake_against_real(study_timing(args.study, args.rounds))
    if not args.skip_h200:
        h200_cells()
    if args.large:
        large_cells(args.whole)
    if args.study20:
        study20()


if __name__ == "__main__":
    main()
