"""Snakemake script: results/<study>/scaling-card.json from the study's metrics files
(params.metrics: the rule's input is runs.csv, written from the same files) and its all-reduce
benchmark (trainscale.compare.card), validated against its schema."""

import contextlib
from pathlib import Path

from trainscale.compare import card

with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
    built = card.from_files(
        list(snakemake.params.metrics),
        list(snakemake.input.collectives),
        str(Path(snakemake.output.card).parent),  # results/<study>
        snakemake.config["study"],
    )
    card.write(built, snakemake.output.card)
    print(f"trainscale.compare.card: wrote {snakemake.output.card}", file=log)
