"""How a study file given with `snakemake --configfile FILE` becomes the study's config.

Snakemake 9 reads `config.yaml` (the Snakefile's `configfile:`) and lays every `--configfile`
(and `--config key=value`) over it with `snakemake.utils.update_config`: mappings are merged
key by key, recursively; every other value, lists included, is replaced. So a study file
inherits each key it does not set, nested ones too (`optimizer.name` when it sets only
`optimizer.lr`, and `matrix.exclude` when it sets only `matrix.strategy`).

trainscale adds two rules of its own (common.smk applies them, and `python -m
trainscale.plan.matrix FILE` does the same, so the checker sees what the workflow sees):

- `matrix` is replaced as a whole when the study file has one: a study's cells are its own,
  never config.yaml's exclusions or model lists mixed with its own (study files need not
  restate `exclude: []`; keys a study matrix leaves out take the schema's defaults).
- a study file must name its own `study`: inheriting config.yaml's name would write its runs
  into that study's results, among its runs.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

#: Top-level keys a study file replaces as a whole instead of merging into config.yaml's.
WHOLE_KEYS: tuple[str, ...] = ("matrix",)


def overlay(base: dict, study: dict) -> dict:
    """`base` (config.yaml) with `study` laid over it as Snakemake does, then every key of
    WHOLE_KEYS that `study` sets taken from `study` alone. Neither argument is changed."""
    from snakemake.utils import update_config  # the very function Snakemake merges with

    merged = copy.deepcopy(base)
    update_config(merged, copy.deepcopy(study))
    replace_whole_keys(merged, study)
    return merged


def replace_whole_keys(config: dict, study: dict) -> None:
    """In place: every key of WHOLE_KEYS that `study` sets becomes `study`'s value alone."""
    for key in WHOLE_KEYS:
        if key in study:
            config[key] = copy.deepcopy(study[key])


def inherited(base: dict, study: dict, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, value) of every leaf of the merged config that comes from `base` because
    `study` does not set it; a key of WHOLE_KEYS that `study` lacks comes as one entry."""
    out: list[tuple[str, object]] = []
    for key, value in base.items():
        name = f"{prefix}{key}"
        if key not in study:
            out.append((name, value))
        elif (
            isinstance(value, dict)
            and isinstance(study[key], dict)
            and not (prefix == "" and key in WHOLE_KEYS)
        ):
            out += inherited(value, study[key], f"{name}.")
    return out


def unnamed_study(study: dict, files: list, base_study: str | None) -> str | None:
    """The error for study files that do not set `study` (so the study would be config.yaml's,
    and its results would land among that study's), or None when one of them names it."""
    if not files or "study" in study:
        return None
    names = ", ".join(str(f) for f in files)
    return (
        f"{names} does not name its own study: it would inherit config.yaml's study "
        f"{base_study!r} and write into results/{base_study}/, among that study's runs; add "
        "'study: <name>' to the file (results then go to results/<name>/)"
    )


def describe(items: list[tuple[str, object]], width: int = 70) -> list[str]:
    """`key: value` lines for people, each value in JSON and cut at `width` characters."""
    lines = []
    for key, value in items:
        text = json.dumps(value, separators=(", ", ": "))
        if len(text) > width:
            text = text[: width - 1] + "…"
        lines.append(f"{key}: {text}")
    return lines


#: The workflow's own config.yaml, which every --configfile is laid over.
BASE_CONFIG = Path(__file__).resolve().parents[3] / "config.yaml"
