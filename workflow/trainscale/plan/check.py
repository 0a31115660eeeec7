"""`trainscale check CONFIG...`: a study's config checked before anything runs, for people: every
place it breaks the schema, with the key as written in YAML and a likely fix; the user's own models
built in a pre-flight child; the run set with the cells dropped and why; and, where config `memory:`
asks for it, each cell's predicted memory per rank (trainscale.plan.preflight.memory). The schema
check is plan.configcheck's, the run set `study_plan`'s: the workflow (rules/common.smk) runs the
same checks before its first job.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from trainscale.plan import fit
from trainscale.plan.configcheck import (  # also read as check.config_problems, check.fill_defaults
    config_problems,
    fill_defaults,
    yaml_booleans_as_words,
)
from trainscale.plan.machine import detect_accelerator, visible_gpus
from trainscale.plan.matrix import CONFIG_SCHEMA, ConfigError, build_runs
from trainscale.plan.preflight import memory
from trainscale.plan.study import study_plan
from trainscale.plan.studyconfig import Memory, StudyConfig


def load_config(path: str | Path, base: Path | None = None) -> tuple[dict, list[str]]:
    """(the config `snakemake --configfile path` would meet, its problems): laid over `base`
    (the workflow's config.yaml unless it is that file) as trainscale.plan.overlay describes,
    checked against the schema and its defaults filled in; a YAML syntax error names its line
    (Snakemake only says the file is not valid YAML). The config's `_inherited` lists the keys
    it takes from `base`."""
    import yaml

    from trainscale.plan import overlay

    base = overlay.BASE_CONFIG if base is None else base
    try:
        config = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        return {}, [f"{path}: cannot read it ({e.strerror})"]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return {}, [f"{path}:{where}: not valid YAML: {getattr(e, 'problem', e)}"]
    if not isinstance(config, dict):
        return {}, [f"{path}: a config is a mapping of keys (study:, matrix:, ...)"]
    inherited: list = []
    if base.is_file() and Path(path).resolve() != base.resolve():
        base_config = yaml.safe_load(base.read_text()) or {}
        unnamed = overlay.unnamed_study(config, [path], base_config.get("study"))
        if unnamed:
            return {}, [unnamed]
        inherited = overlay.inherited(base_config, config)
        config = overlay.overlay(base_config, config)
    schema = yaml.safe_load(CONFIG_SCHEMA.read_text())
    yaml_booleans_as_words(config, schema)  # as the workflow does
    problems = config_problems(config, schema)
    if problems:
        return {}, [f"{path}: {p}" for p in problems]
    fill_defaults(config, schema)  # as the workflow does
    return {**config, "_inherited": inherited}, []


def check_file(path: str | Path, base: Path | None = None, show_memory: bool = True) -> list[str]:
    """Problems of a config file as `snakemake --configfile` would meet them (load_config),
    then its run set: the cells dropped and why (memory.check's drops among them), each
    cell's predicted memory per rank (`show_memory`, even where memory.check is off), and the
    keys it inherits."""
    import os

    from trainscale.plan import overlay

    config, problems = load_config(path, base)
    if problems:
        return problems
    inherited = config.pop("_inherited")
    base = overlay.BASE_CONFIG if base is None else base
    if not show_memory:
        config["memory"] = {**config.get("memory", {}), "check": "off"}
    accelerator = detect_accelerator(config["accelerator"])
    try:
        study = StudyConfig.from_filled(config)
        gpus = visible_gpus() if accelerator == "cuda" else 0  # as the Snakefile plans
        plan = study_plan(study, accelerator, gpus or None, show_memory=show_memory)
    except ConfigError as e:
        return [f"{path}: {e}"]
    runs, predicted, check = plan.runs, plan.predicted, plan.memory
    print(f"{path}: study {plan.config.study!r}: {plan.summary}")
    if predicted and show_memory:
        print(f"  predicted memory per rank (limit {check.describe()}, {check.source}):")
        print("\n".join(f"    {line}" for line in memory_lines(runs, predicted)))
    if inherited:
        print(f"  inherited from {os.path.relpath(base)}:")
        print("\n".join(f"    {line}" for line in overlay.describe(inherited)))
    return []


def memory_lines(runs: list, predicted: dict[str, dict]) -> list[str]:
    """One line per cell that runs: its predicted GiB per rank on the device (the reserved
    side: what memory.check holds against the limit) and how it was predicted, and its host
    GiB per rank."""
    lines, seen = [], set()
    for r in runs:
        if r.cell in seen:
            continue
        seen.add(r.cell)
        p = predicted[r.path]
        tp = f" tp {r.tp}" if r.tp > 1 else ""
        cell = (
            f"{r.strategy} {r.model} on {r.dataset}, N={r.world_size}{tp}, batch "
            f"{r.batch_size} {r.batch_mode}{tp_batch(r)}, {r.precision}"
        )
        host = f"host {p['host_bytes'] / memory.GIB:.3g} GiB"
        if p.get("error"):
            lines.append(f"{cell}: not predicted ({p['error']}), {host}")
        elif p.get("total_bytes") is None:
            lines.append(f"{cell}: {host} (device not traced: memory.check is off)")
        else:
            lines.append(f"{cell}: {memory.need(p) / memory.GIB:.3g} GiB ({p['method']}), {host}")
    return lines


def tp_batch(r) -> str:
    """What a tensor-parallel cell's batch is on one rank (docs/strategies.md): the ranks of a
    tp group feed one data-parallel replica's samples, so each rank holds all their tokens (at
    1/tp of the width and of the vocabulary); empty at tp 1."""
    if r.tp == 1:
        return ""
    tokens = f" = {r.per_worker_batch_size * r.seq_len:,} tokens" if r.seq_len else ""
    return (
        f" (a dp replica's {r.per_worker_batch_size} samples{tokens} on each of its {r.tp} ranks)"
    )


def main(argv: list[str] | None = None, prog: str = "trainscale check") -> int:
    """`trainscale check CONFIG...`: check study config files without running anything, each
    laid over the workflow's config.yaml as `snakemake --configfile CONFIG` lays it."""
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=main.__doc__.split(": ", 1)[1])
    p.add_argument("configs", nargs="+", type=Path, metavar="CONFIG", help="a study config file")
    p.add_argument(
        "--base", type=Path, default=None, help="the config laid under each (default: config.yaml)"
    )
    p.add_argument(
        "--no-memory", action="store_true",
        help="no memory prediction, nor memory.check's drops (the prediction imports torch)",
    )  # fmt: skip
    args = p.parse_args(argv)
    show = not args.no_memory
    problems = [line for c in args.configs for line in check_file(c, args.base, show)]
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


def fit_main(argv: list[str] | None = None, prog: str = "trainscale fit") -> int:
    """`trainscale fit CONFIG`: the largest batch size whose predicted memory per rank fits config
    `memory:` (its limit × headroom), per strategy × model × world size (trainscale.plan.fit)."""
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=fit_main.__doc__.split(": ", 1)[1])
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
        asked = dataclasses.replace(Memory.of(config.get("memory")), check="drop")
        check = memory.resolve(asked, accelerator)
        study = StudyConfig.from_filled(config)
        runs, _ = build_runs(study, accelerator)
        groups = {tuple(getattr(r, k) for k in fit.GROUP): r for r in runs if r.repeat == 0}
        tried = {
            g: fit.candidates(study, r, args.max_batch, accelerator) for g, r in groups.items()
        }
        best = fit.largest_fitting(tried, check.allowed_bytes, accelerator)
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
