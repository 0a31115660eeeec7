"""Snakemake script: one figure (wildcard `figure`) as SVG and PNG from the study's tables."""

import sys

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
    name = snakemake.wildcards.figure  # noqa: F821
    note = plots.render(name, study, snakemake.output.svg, snakemake.output.png)  # noqa: F821
    print(f"trainscale: figure {name}: {note or 'drawn'}", file=log)
