"""`trainscale report`: a study's tables, figures and report.html from its metrics files alone,
without Snakemake and without re-running any training (`python -m trainscale.report` too)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import yaml

from trainscale.analysis import aggregate, metrics_tables
from trainscale.report import pipeline


def main(argv: list[str] | None = None, prog: str = "trainscale report") -> int:
    """`trainscale report` (and `python -m trainscale.report`): the report from metrics files."""
    p = argparse.ArgumentParser(
        prog=prog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.dedent(
            """\
            Make a study's tables, figures and HTML report from its metrics files alone
            (e.g. results/<study>/runs copied back from a cluster); nothing is re-run.

            Every **/metrics.json under --runs-dir is validated against the metrics schema
            (workflow/schemas/metrics.schema.yaml); files that fail are listed in
            summary.txt, invalid.csv and the report, and not counted.

            Writes into --out:
              runs.csv      one row per run (failed runs included, with status and error)
              epochs.csv    one row per run and epoch
              scaling.csv   one row per cell: mean/std/95% CI, speedup, efficiency, and
                            whether it could be the fastest or is slower (all cells at once)
              invalid.csv   metrics files that failed validation, and why
              summary.txt   fastest strategy per model and worker count, its efficiency,
                            the cells that could be the fastest and what each panel resolves
              predictions.csv, prediction_check.csv   predicted scaling (config `predict`)
              figures/      <figure>.png (and .svg with config `report.svg: true`)
              report.html   one self-contained file (PNG figures embedded) to open or mail
            """
        ),
        epilog="Exit status: 0 when the report was written (1 with --strict and invalid "
        "files), 2 when --runs-dir holds no metrics.json at all.",
    )
    p.add_argument(
        "--runs-dir",
        required=True,
        type=Path,
        help="directory searched recursively for metrics.json files",
    )
    p.add_argument("--out", required=True, type=Path, help="directory to write into")
    p.add_argument("--study", help="study name for titles (default: spec.study of the runs)")
    p.add_argument(
        "--config",
        type=Path,
        help="the study's config YAML, shown in the report, and its `report` and `predict` "
        "keys used (default: the values seen in the runs' specs)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=aggregate.default_jobs(),
        help="processes for reading files and drawing figures (default: %(default)s)",
    )
    p.add_argument(
        "--strict", action="store_true", help="exit with status 1 when any metrics file is invalid"
    )
    a = p.parse_args(argv)
    if not metrics_tables.has_metrics(a.runs_dir):
        print(f"{prog}: no metrics.json under {a.runs_dir}", file=sys.stderr)
        return 2
    config = yaml.safe_load(a.config.read_text()) if a.config else None
    study = pipeline.build(a.runs_dir, a.out, name=a.study, config=config, jobs=max(1, a.jobs))
    print(
        f"{prog}: {len(study.runs)} runs, {len(study.scaling)} cells, "
        f"{len(study.invalid)} invalid files -> {a.out / 'report.html'}",
        file=sys.stderr,
    )
    return 1 if a.strict and study.invalid else 0
