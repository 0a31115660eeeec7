"""Snakemake script: runs.csv, epochs.csv and invalid.csv from the study's metrics files."""

import contextlib

from trainscale.analysis.study import Study

with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
    study = Study.build(snakemake.input.metrics, snakemake.config["study"], snakemake.threads)
    # the tables its outputs name (runs, epochs, invalid); epochs.csv by a second process
    study.write(snakemake.output, jobs=snakemake.threads)
