"""Snakemake script: results/<study>/scaling-card.json from the study's metrics files
(params.metrics: the rule's input is runs.csv, written from the same files; params.raced: the
repeats a study with repeats {min, max} may have bought, those in runs.csv) and its all-reduce
benchmark (trainscale.compare.card), validated against its schema."""

import contextlib
from pathlib import Path

import pandas as pd

from trainscale.analysis.metrics_tables import run_id
from trainscale.compare import card

with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
    metrics = list(snakemake.params.metrics)
    if snakemake.params.raced:
        made = set(pd.read_csv(snakemake.input.runs, usecols=["run"])["run"].astype(str))
        metrics += [p for p in snakemake.params.raced if run_id(p) in made]
    built = card.from_files(
        metrics,
        list(snakemake.input.collectives),
        str(Path(snakemake.output.card).parent),  # results/<study>
        snakemake.config["study"],
    )
    card.write(built, snakemake.output.card)
    print(f"trainscale.compare.card: wrote {snakemake.output.card}", file=log)
