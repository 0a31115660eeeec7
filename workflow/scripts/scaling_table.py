"""Snakemake script: scaling.csv (one row per cell) and summary.txt from runs.csv."""

import sys

from trainscale.analysis.study import Study

with open(snakemake.log[0], "w") as log:
    sys.stderr = log
    Study.read(snakemake.input, snakemake.config["study"]).write(snakemake.output)
