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
from dataclasses import dataclass
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


@dataclass
class Found:
    """A group's answer: the largest fitting run and its predicted need (None: none fits),
    and the error of the first probe that could not be predicted."""

    run: RunSpec | None = None
    need: int | None = None
    error: str | None = None


def largest_fitting(tried: dict[tuple, list[RunSpec]], allowed: float, target: str) -> dict:
    """{group: Found}, by bisection in rounds. A probe whose prediction fails ends its
    group's search with the error: what cannot be predicted is neither promised nor called
    too big."""
    lo = {g: -1 for g in tried}  # index of the largest size known to fit
    hi = {g: len(runs) for g, runs in tried.items()}  # index of the smallest known not to
    need: dict[tuple, dict[int, int]] = {g: {} for g in tried}
    errors: dict[tuple, str] = {}
    while True:
        probes = {g: (lo[g] + hi[g]) // 2 for g in tried if hi[g] - lo[g] > 1 and g not in errors}
        if not probes:
            break
        answers = memory.predict([tried[g][i] for g, i in probes.items()], target)
        for g, i in probes.items():
            a = answers[tried[g][i].path]
            if "error" in a:
                errors[g] = f"batch {tried[g][i].batch_size}: {a['error']}"
                continue
            need[g][i] = memory.need(a)
            if need[g][i] <= allowed:
                lo[g] = i
            else:
                hi[g] = i
    return {g: Found(tried[g][lo[g]] if lo[g] >= 0 else None, need[g].get(lo[g]),
                     errors.get(g)) for g in tried}  # fmt: skip


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
    failed = False
    for g, found in sorted(best.items(), key=lambda kv: tuple(map(str, kv[0]))):
        r = groups[g]
        cell = f"{r.strategy} {r.model} {r.dataset} at {r.world_size} workers" + (
            f" (tp {r.tp})" if r.tp > 1 else ""
        )  # fmt: skip
        line = f"  {cell}: "
        if found.run is not None:
            line += f"batch {found.run.batch_size} ({r.batch_mode}), "
            line += f"{found.need / memory.GIB:.3g} GiB"
            line += f"; larger not predicted: {found.error}" if found.error else ""
        elif found.error:
            line += f"not predicted: {found.error}"
        else:
            line += "none of the batch sizes tried fits"
        failed |= found.error is not None
        print(line)
    return 1 if failed else 0
