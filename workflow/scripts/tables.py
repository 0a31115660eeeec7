"""Snakemake script: runs.csv, epochs.csv and invalid.csv from the study's metrics files."""

import sys

from trainscale import aggregate

with open(snakemake.log[0], "w") as log:  # noqa: F821 (injected by Snakemake)
    sys.stderr = log
    study = aggregate.build(
        snakemake.input.metrics,  # noqa: F821
        name=snakemake.config["study"],  # noqa: F821
        jobs=snakemake.threads,  # noqa: F821
    )
    study.runs.to_csv(snakemake.output.csv, index=False)  # noqa: F821
    study.epochs.to_csv(snakemake.output.epochs, index=False)  # noqa: F821
    aggregate.write_invalid(study.invalid, snakemake.output.invalid)  # noqa: F821
