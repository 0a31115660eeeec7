"""Snakemake script: scaling.csv (one row per cell) and summary.txt from runs.csv."""

import sys
from pathlib import Path

from trainscale import aggregate

with open(snakemake.log[0], "w") as log:  # noqa: F821 (injected by Snakemake)
    sys.stderr = log
    study = aggregate.read_study(
        snakemake.input.runs,  # noqa: F821
        invalid_csv=snakemake.input.invalid,  # noqa: F821
        name=snakemake.config["study"],  # noqa: F821
    )
    study.scaling.to_csv(snakemake.output.csv, index=False)  # noqa: F821
    Path(snakemake.output.summary).write_text(  # noqa: F821
        aggregate.summary_text(study.runs, study.invalid, study.name, study.scaling)
    )
