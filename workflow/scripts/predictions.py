"""Snakemake script: predictions.csv, prediction_check.csv and the predicted-scaling figure
(trainscale.pipeline.predictions)."""

import sys
from pathlib import Path

from trainscale import aggregate, pipeline

with open(snakemake.log[0], "w") as log:  # noqa: F821 (injected by Snakemake)
    sys.stderr = log
    notes = pipeline.predictions(
        aggregate.read_runs(snakemake.input.runs),  # noqa: F821
        aggregate.read_collectives(snakemake.input.collectives),  # noqa: F821
        {"predict": dict(snakemake.params.predict), "report": dict(snakemake.params.report)},  # noqa: F821
        snakemake.output.predictions,  # noqa: F821
        snakemake.output.check,  # noqa: F821
        Path(snakemake.output.png).parent,  # noqa: F821
    )
    for note in notes:
        print(f"trainscale: {note}", file=log)
