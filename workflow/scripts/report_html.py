"""Snakemake script: results/<study>/report.html, self-contained, from the tables and figures."""

import sys
from pathlib import Path

from trainscale import aggregate, predict_plot, report

with open(snakemake.log[0], "w") as log:  # noqa: F821 (injected by Snakemake)
    sys.stderr = log
    study = aggregate.read_study(
        snakemake.input.runs,  # noqa: F821
        epochs_csv=snakemake.input.epochs,  # noqa: F821
        scaling_csv=snakemake.input.scaling,  # noqa: F821
        invalid_csv=snakemake.input.invalid,  # noqa: F821
        collectives_csv=snakemake.input.collectives,  # noqa: F821
        communication_csv=snakemake.input.communication,  # noqa: F821
        name=snakemake.config["study"],  # noqa: F821
    )
    predictions = list(snakemake.input.predictions)  # noqa: F821 (empty: predictions off)
    predicted = predict_plot.section(*predictions) if predictions else None
    report.write_html(
        study,
        snakemake.output.html,  # noqa: F821
        Path(snakemake.input.figures[0]).parent,  # noqa: F821
        config=dict(snakemake.config),  # noqa: F821
        predicted=predicted,
    )
