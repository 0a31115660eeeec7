"""Snakemake script: collectives.csv (all-reduce bandwidth by message size) and
communication.csv (the communication model of every DDP-family cell)."""

import contextlib

from trainscale.analysis.study import Study

with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
    study = Study.read(snakemake.input, snakemake.config["study"], snakemake.config)
    study.add_collectives(snakemake.input.benchmarks)
    study.write(snakemake.output)  # collectives and communication
    print(
        f"trainscale: {len(study.collectives)} message sizes, "
        f"{len(study.communication)} DDP-family cells",
        file=log,
    )
