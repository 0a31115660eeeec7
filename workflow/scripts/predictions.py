"""Snakemake script: predictions.csv, prediction_check.csv and the predicted-scaling figure
(trainscale.report.pipeline.predictions)."""

import contextlib
from pathlib import Path

from trainscale.analysis.study import Study
from trainscale.report import pipeline

with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
    study = Study.read(snakemake.input, snakemake.config["study"], snakemake.config)
    notes = pipeline.predictions(
        study.runs,
        study.collectives,
        {"predict": dict(snakemake.params.predict), "report": dict(snakemake.params.report)},
        snakemake.output.predictions,
        snakemake.output.check,
        Path(snakemake.output.png).parent,
    )
    for note in notes:
        print(f"trainscale: {note}", file=log)
