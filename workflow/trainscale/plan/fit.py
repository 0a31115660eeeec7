"""`trainscale fit CONFIG`: for each strategy × model × world size of a study, the largest batch
size whose predicted memory per rank fits config `memory:` (its limit × headroom).

The batch sizes tried are those the study could run: powers of two and three times them, and
the study's own `matrix.batch_size`, up to `--max-batch`, each kept only where the matrix's
rules keep the cell (it splits over the workers, micro-batches and tensor-parallel groups, and
an epoch holds a global batch). The need grows with the batch, so each cell is bisected over
them with the estimator (trainscale.plan.memory), every cell's probe of a round in one child.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

from trainscale.plan import memory
from trainscale.plan.check import load_config
from trainscale.plan.matrix import ConfigError, build_runs, detect_accelerator
from trainscale.plan.runspec import RunSpec

#: the keys that name a cell apart from its batch size
GROUP = ("strategy", "model", "dataset", "seq_len", "batch_mode", "workers", "nodes", "tp",
         "precision", "activation_checkpointing", "offload")  # fmt: skip


def candidates(config: dict, template: RunSpec, max_batch: int, accelerator: str) -> list:
    """`template`'s cell at every batch size the study's rules accept, smallest first."""
    sizes = {b for k in range(20) for b in (2**k, 3 * 2**k) if b <= max_batch}
    sizes |= {b for b in config["matrix"]["batch_size"] if b <= max_batch}
    one = copy.deepcopy(config)
    one["matrix"] = {k: [getattr(template, k)] for k in (*GROUP, "scale")}
    if not template.seq_len:
        del one["matrix"]["seq_len"]  # an image data set
    one["faults"] = []
    out = []
    for size in sorted(sizes):
        one["matrix"]["batch_size"] = [size]
        try:
            runs, _ = build_runs(one, accelerator)
        except ConfigError:  # the size does not split over the cell's workers
            continue
        out += [r for r in runs if r.repeat == 0]
    return out


def largest_fitting(
    tried: dict[tuple, list[RunSpec]], allowed: float, target: str
) -> dict[tuple, tuple[RunSpec | None, int | None]]:
    """{group: (the largest fitting run, its predicted bytes)}, by bisection in rounds."""
    lo = {g: -1 for g in tried}  # index of the largest size known to fit
    hi = {g: len(runs) for g, runs in tried.items()}  # index of the smallest known not to
    need: dict[tuple, dict[int, int]] = {g: {} for g in tried}
    while True:
        probes = {g: (lo[g] + hi[g]) // 2 for g in tried if hi[g] - lo[g] > 1}
        if not probes:
            break
        answers = memory.predict([tried[g][i] for g, i in probes.items()], target)
        for g, i in probes.items():
            a = answers[tried[g][i].path]
            if "error" in a:
                hi[g] = i  # what cannot be traced is not promised
                continue
            need[g][i] = a["total_bytes"]
            if a["total_bytes"] <= allowed:
                lo[g] = i
            else:
                hi[g] = i
    return {g: (tried[g][lo[g]], need[g][lo[g]]) if lo[g] >= 0 else (None, None) for g in tried}


def main(argv: list[str] | None = None, prog: str = "trainscale fit") -> int:
    """`trainscale fit CONFIG`: the largest batch size that fits, per strategy × model × world."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("config", type=Path, metavar="CONFIG", help="a study config file")
    p.add_argument("--base", type=Path, default=None, help="the config laid under it")
    p.add_argument("--max-batch", type=int, default=4096, help="largest batch size tried")
    args = p.parse_args(argv)
    config, problems = load_config(args.config, args.base)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    config.pop("_inherited")
    accelerator = detect_accelerator(config["accelerator"])
    try:
        config.setdefault("memory", {})
        check = memory.resolve({"memory": {**config["memory"], "check": "drop"}}, accelerator)
        runs, _ = build_runs(config, accelerator)
        groups = {tuple(getattr(r, k) for k in GROUP): r for r in runs if r.repeat == 0}
        tried = {g: candidates(config, r, args.max_batch, accelerator) for g, r in groups.items()}
        best = largest_fitting(tried, check.allowed_bytes, accelerator)
    except ConfigError as e:
        print(f"{args.config}: {e}", file=sys.stderr)
        return 1
    print(f"largest batch size per rank's memory, limit {check.describe()} ({check.source}):")
    for g, (run, need) in sorted(best.items(), key=lambda kv: tuple(map(str, kv[0]))):
        r = groups[g]
        cell = f"{r.strategy} {r.model} {r.dataset} at {r.world_size} workers" + (
            f" (tp {r.tp})" if r.tp > 1 else ""
        )  # fmt: skip
        if run is None:
            print(f"  {cell}: none of the batch sizes tried fits")
        else:
            print(f"  {cell}: batch {run.batch_size} ({r.batch_mode}), {need / memory.GIB:.3g} GiB")
    return 0
