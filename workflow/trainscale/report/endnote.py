"""The message a successful workflow ends with: where the study's results are, naming only
files that exist and are up to date.

A run of part of the workflow (`--until train`, or one target) builds only some outputs; a
message naming `summary.txt` that was never built, or one left from an earlier run that no
longer covers every run, sends the reader to a file that is not the answer. A study output
counts as built when it exists and is no older than the newest run's metrics.json. A tune's
page is named where it exists (and a study that only tuned is not told to build the rest).
"""

from __future__ import annotations

import re
from pathlib import Path

#: The study's outputs (rule `all`), in the order the message names them.
STUDY_OUTPUTS: tuple[tuple[str, str], ...] = (
    ("summary", "summary.txt"),
    ("report", "report.html"),
    ("per run", "runs.csv"),
    ("per cell", "scaling.csv"),
)


#: the header of summary.txt's table of every cell (trainscale.analysis.summary)
TABLE_HEADER = re.compile(r"strategy +model +dataset ")


def without_table(summary: str, path: Path) -> str:
    """summary.txt's text with its table of every cell (from its header to the next blank
    line) left to the file: a line per cell would bury the answers above it and the failures
    below it at the end of a run of many cells."""
    lines = summary.splitlines()
    start = next((i for i, ln in enumerate(lines) if TABLE_HEADER.match(ln)), None)
    if start is None:
        return summary
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    kept = [*lines[:start], f"every cell's figures, a line each: {path}", *lines[end:]]
    return "\n".join(kept) + "\n"


def built(results: str | Path) -> tuple[list[tuple[str, Path]], list[Path], int]:
    """(label, path) of every study output that is up to date, the ones that are missing or
    older than a run's metrics, and how many runs have metrics."""
    results = Path(results)
    runs = list((results / "runs").rglob("metrics.json"))
    newest = max((p.stat().st_mtime for p in runs), default=0.0)
    fresh, stale = [], []
    for label, name in STUDY_OUTPUTS:
        path = results / name
        if path.exists() and path.stat().st_mtime >= newest:
            fresh.append((label, path))
        else:
            stale.append(path)
    return fresh, stale, len(runs)


def message(study: str, results: str | Path) -> str:
    """The end-of-run message: the summary's text when the summary is up to date (but its
    table of every cell), then where the results are, last, where a terminal's reader looks."""
    fresh, stale, n_runs = built(results)
    lines = [f"\ntrainscale: results of study {study!r} are in {results}/"]
    if n_runs:
        lines.append(f"  runs:     {n_runs} × {results}/runs/**/metrics.json")
    lines += [f"  {label + ':':<9} {path}" for label, path in fresh]
    tune = Path(results) / "tune" / "report.html"  # `snakemake tune` (trainscale tune)
    if tune.exists():
        lines.append(f"  {'tune:':<9} {tune} (tune.csv, best.yaml beside it)")
    if stale and (n_runs or not tune.exists()):
        names = ", ".join(p.name for p in stale)
        lines.append(
            f"  not built, or older than the runs: {names} (`snakemake` with no target builds them)"
        )
    lines.append(
        f"  {'logs:':<9} logs/{study}/ (each job's), .snakemake/log/ (Snakemake's, every job's "
        "block; the terminal shows them with `--quiet host`)"
    )
    where = "\n".join(lines) + "\n"
    summary = Path(results) / "summary.txt"
    if ("summary", summary) in fresh:
        return "\n" + without_table(summary.read_text(), summary) + where
    return where
