"""Snakemake script: every figure of reports/figures.yaml as PNG (and SVG with config
`report.svg`) from the study's tables (trainscale.report.pipeline.figures)."""

import contextlib
from pathlib import Path

from trainscale.analysis.study import Study
from trainscale.report import pipeline

with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
    study = Study.read(snakemake.input, snakemake.config["study"], snakemake.config)
    out = Path(snakemake.output[0]).parent
    drawn = pipeline.figures(study, out, dict(snakemake.config), jobs=snakemake.threads)
    for name, d in drawn.items():
        print(f"trainscale: figure {name}: {d.note or 'drawn'}", file=log)
        for stem, selection in d.images if d.note is None else ():
            print(f"trainscale:   {stem}.png{': ' + selection if selection else ''}", file=log)
