"""Snakemake script: every figure of reports/figures.yaml as SVG and PNG from the study's tables."""

import sys
from pathlib import Path

from trainscale import aggregate, plots

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
    notes = plots.render_all(study, out, jobs=snakemake.threads)  # noqa: F821
    for name, note in notes.items():
        print(f"trainscale: figure {name}: {note or 'drawn'}", file=log)
