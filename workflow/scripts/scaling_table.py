"""Snakemake script: scaling.csv (one row per cell) and summary.txt from runs.csv."""

import contextlib

from trainscale.analysis.study import Study

with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
    Study.read(snakemake.input, snakemake.config["study"], snakemake.config).write(snakemake.output)
