"""Snakemake script: results/<study>/runs.csv and summary.txt from the study's metrics files."""

import sys

from trainscale import aggregate

with open(snakemake.log[0], "w") as log:  # noqa: F821 (injected by Snakemake)
    sys.stderr = log
    aggregate.write_runs_table(
        snakemake.input.metrics,  # noqa: F821
        snakemake.output.csv,  # noqa: F821
        snakemake.output.summary,  # noqa: F821
        snakemake.config["study"],  # noqa: F821
    )
