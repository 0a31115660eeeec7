"""Snakemake script: results/<study>/report.html, self-contained, from the tables and figures."""

import contextlib
from pathlib import Path

from trainscale.analysis.study import Study
from trainscale.compare import card
from trainscale.compare import output as compare_output
from trainscale.compare import verdicts as compare
from trainscale.report import html as report
from trainscale.report import predict_plot

with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
    study = Study.read(snakemake.input, snakemake.config["study"], snakemake.config)
    compared = None
    base = snakemake.params.compare_with
    if base:  # config compare_with: this study (NEW) against that folder or card (BASE)
        try:
            result = compare.compare(
                compare.load(base, "compare_with:"),
                card.read(snakemake.input.card),
                prices=study.prices,  # config cost: a dearer cell is reported like a slower one
            )
            compared = compare_output.section(result)
        except compare.CompareError as e:
            compared = compare_output.section(None, error=str(e))
            print(f"trainscale: compare_with: {e}", file=log)
    predictions = list(snakemake.input.predictions)  # empty: predictions off
    predicted = predict_plot.section(*predictions) if predictions else None
    report.write_html(
        study,
        snakemake.output.html,
        Path(snakemake.input.figures[0]).parent,
        config=dict(snakemake.config),
        compared=compared,
        predicted=predicted,
    )
