"""`trainscale check CONFIG...`: a study's config checked before anything runs, for people: every
place it breaks the schema, with the key as written in YAML and a likely fix; the user's own models
built in a pre-flight child; the run set with the cells dropped and why; and, where config `memory:`
asks for it, each cell's predicted memory per rank (trainscale.plan.preflight.memory). The workflow
(rules/common.smk) runs the same checks before its first job.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from trainscale.data import imagecheck, names
from trainscale.plan import catalog, cluster, fit, prices
from trainscale.plan.machine import detect_accelerator, gpu_names, visible_gpus
from trainscale.plan.matrix import (
    CONFIG_SCHEMA,
    DEFAULT_SEQ_LEN,
    ConfigError,
    build_runs,
    data_shapes,
    study_summary,
)
from trainscale.plan.preflight import hf_models, memory, own_models

#: the words YAML 1.1 reads as booleans where unquoted (`check: off` is `check: false`)
YAML_WORDS = {False: "off", True: "on"}


def yaml_booleans_as_words(config: dict, schema: dict) -> None:
    """Where a key's values are words (an enum of strings) that list "off" or "on" and not the
    boolean, a boolean written there is put back as the word, in place: YAML reads an unquoted
    `off` (or `no`, `false`) as false, so `memory: {check: off}`, as the docs write it, would
    be refused. Call before `config_problems`."""

    def visit(value, sub: dict) -> None:
        if isinstance(value, dict):
            for key, prop in sub.get("properties", {}).items():
                if isinstance(value.get(key), bool) and YAML_WORDS[value[key]] in prop.get(
                    "enum", ()
                ):
                    value[key] = YAML_WORDS[value[key]]
                elif key in value:
                    visit(value[key], prop)
        elif isinstance(value, list) and isinstance(sub.get("items"), dict):
            for item in value:
                visit(item, sub["items"])

    visit(config, schema)


def config_problems(config: dict, schema: dict) -> list[str]:
    """Every place `config` breaks the config schema, one line each, for people: the key as
    written in YAML (matrix.strategy[0]), the value, what is allowed, and a likely fix for a
    typo ("did you mean ..."). Empty when the config is valid."""
    import difflib

    import jsonschema

    def where(path) -> str:
        out = ""
        for p in path:
            out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
        return out or "<top level>"

    lines = []
    validator = jsonschema.Draft202012Validator(schema)
    for e in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.path))):
        key = where(e.path)
        if e.validator == "enum":
            allowed = [str(v) for v in e.validator_value]
            close = difflib.get_close_matches(str(e.instance), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            if isinstance(e.instance, bool):  # YAML's off/no/on/yes, unquoted
                hint = "; YAML reads an unquoted off/no (on/yes) as a boolean: quote the word"
            lines.append(f"{key}: {e.instance!r} is not one of {', '.join(allowed)}{hint}")
        elif e.validator == "additionalProperties":
            known = sorted(e.schema.get("properties", {}))
            extra = sorted(set(e.instance) - set(known))
            for k in extra:
                close = difflib.get_close_matches(k, known, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
                where_k = f"{key}.{k}" if e.path else k
                lines.append(f"{where_k}: unknown key; {hint}")
        elif e.validator == "pattern":
            lines.append(
                f"{key}: {e.instance!r} has characters not allowed here (the value becomes a "
                f"path or part of a command line); allowed: {e.validator_value}"
            )
        else:
            lines.append(f"{key}: {e.message}")
    lines += imagecheck.problems(config)
    lines += _model_names(config)
    lines += cluster.problems(config)
    if lines:
        return lines
    seq_lens = (config.get("matrix") or {}).get("seq_len") or [DEFAULT_SEQ_LEN]
    filled = copy.deepcopy(config)
    fill_defaults(filled, schema)  # the matrix build_runs meets: the same pre-flight request
    try:
        answer = own_models.check(config, data_shapes(filled, seq_lens))
    except own_models.OwnModelError as e:
        return [str(e)]
    for name, facts in answer.items():
        tokens = config["models"][name].get("input") == "tokens"
        at = "seq_len {}, vocabulary {}" if tokens else "input {}, {} classes"
        counts = "; ".join(
            f"{n:,} parameters at " + at.format(*k.split("/")) for k, n in facts["params"].items()
        )
        print(f"trainscale: models.{name}: {counts or 'not built'}", file=sys.stderr)
    return own_models.problems(answer)


def _model_names(config: dict) -> list[str]:
    """matrix.model names that are neither built-in nor under `models:`, with the likely fix."""
    model_names = names.matrix_names(config, "model")
    hf = [n for n in model_names if hf_models.is_hf(n)]
    out = []
    for name in hf:  # a Hugging Face config: shipped, or the user's file
        where = f"matrix.model[{model_names.index(name)}]"
        try:
            hf_models.read(hf_models.config_path(name, where), name)
        except hf_models.HFConfigError as e:
            out.append(str(e))
    return out + names.unknown(
        config, "model", catalog.MODELS, [*(config.get("models") or {}), *hf], "models",
        lambda name: f"your own model: models.{name}: {{torch: 'pkg.mod:build'}}, "
        "docs/own-model.md; a Hugging Face config: hf:NAME, docs/models.md",
    )  # fmt: skip


def fill_defaults(config: dict, schema: dict) -> None:
    """Fill in the schema's defaults, in place, exactly as snakemake.utils.validate does (its
    default-setting `properties` on the same Draft 2020-12 validator), from the schema already
    read for `config_problems`: Snakemake's own validate reads the schema file again with the
    pure-Python YAML reader and builds a reference registry for it, a tenth of a second of
    every Snakemake start. Call after `config_problems` found none."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    check_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, subschema):
        for name, prop in properties.items():
            if "default" in prop:
                instance.setdefault(name, prop["default"])
        yield from check_properties(validator, properties, instance, subschema)

    jsonschema.validators.extend(base, {"properties": set_defaults})(schema).validate(config)


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
    accelerator = detect_accelerator(config["accelerator"])
    try:
        gpus = visible_gpus() if accelerator == "cuda" else 0  # as the Snakefile plans
        runs, dropped = build_runs(config, accelerator, gpus or None)
        if problem := prices.check(config, accelerator, gpu_names() if gpus else []):
            raise ConfigError(problem)
        if not show_memory:
            config["memory"] = {**config.get("memory", {}), "check": "off"}
        check = memory.resolve(config, accelerator, show=show_memory)
        runs, dropped, predicted = fit.within_limits(check, runs, dropped, accelerator, config)
    except ConfigError as e:
        return [f"{path}: {e}"]
    print(f"{path}: study {config['study']!r}: {study_summary(runs, dropped, config['repeats'])}")
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
        config.setdefault("memory", {})
        check = memory.resolve({"memory": {**config["memory"], "check": "drop"}}, accelerator)
        runs, _ = build_runs(config, accelerator)
        groups = {tuple(getattr(r, k) for k in fit.GROUP): r for r in runs if r.repeat == 0}
        tried = {
            g: fit.candidates(config, r, args.max_batch, accelerator) for g, r in groups.items()
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
