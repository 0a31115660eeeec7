"""Snakemake script: scaling.csv (one row per cell) and summary.txt from runs.csv; with config
`repeats: {min, max}`, each cell's repeats taken and why (trainscale.analysis.repeats)."""

import contextlib

from trainscale.analysis import repeats
from trainscale.analysis.metrics_tables import run_id
from trainscale.analysis.study import Study

with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
    study = Study.read(snakemake.input, snakemake.config["study"], snakemake.config)
    if snakemake.params.repeats:
        asked = [*study.runs["run"].astype(str), *(run_id(p) for p, _ in study.invalid)]
        span = repeats.Repeats(*snakemake.params.repeats)
        study.scaling = repeats.with_repeats(
            study.scaling, study.runs, asked, span, study.equivalence
        )
    study.write(snakemake.output)
