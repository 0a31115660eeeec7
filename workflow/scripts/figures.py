"""Snakemake script: every figure of reports/figures.yaml as PNG (and SVG with config
`report.svg`) from the study's tables (trainscale.pipeline.figures)."""

import sys
from pathlib import Path

from trainscale import aggregate, pipeline

with open(snakemake.log[0], "w") as log:  # noqa: F821 (injected by Snakemake)
    sys.stderr = log
    study = aggregate.read_study(
        snakemake.input.runs,  # noqa: F821
        epochs_csv=snakemake.input.epochs,  # noqa: F821
        scaling_csv=snakemake.input.scaling,  # noqa: F821
        collectives_csv=snakemake.input.collectives,  # noqa: F821
        name=snakemake.config["study"],  # noqa: F821
    )
    out = Path(snakemake.output[0]).parent  # noqa: F821
    drawn = pipeline.figures(study, out, dict(snakemake.config), jobs=snakemake.threads)  # noqa: F821
    for name, d in drawn.items():
        print(f"trainscale: figure {name}: {d.note or 'drawn'}", file=log)
        for stem, selection in d.images if d.note is None else ():
            print(f"trainscale:   {stem}.png{': ' + selection if selection else ''}", file=log)
