"""Snakemake script: results/<study>/report.html, self-contained, from the tables and figures."""

import sys
from pathlib import Path

from trainscale import aggregate, card, compare, compare_output, predict_plot, report

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
    compared = None
    base = snakemake.params.compare_with  # noqa: F821
    if base:  # config compare_with: this study (NEW) against that folder or card (BASE)
        try:
            result = compare.compare(
                compare.load(base, "compare_with:"),
                card.read(snakemake.input.card),  # noqa: F821
            )
            compared = compare_output.section(result)
        except compare.CompareError as e:
            compared = compare_output.section(None, error=str(e))
            print(f"trainscale: compare_with: {e}", file=log)
    predictions = list(snakemake.input.predictions)  # noqa: F821 (empty: predictions off)
    predicted = predict_plot.section(*predictions) if predictions else None
    report.write_html(
        study,
        snakemake.output.html,  # noqa: F821
        Path(snakemake.input.figures[0]).parent,  # noqa: F821
        config=dict(snakemake.config),  # noqa: F821
        compared=compared,
        predicted=predicted,
    )
