"""Snakemake script: predictions.csv, prediction_check.csv and the predicted-scaling figure."""

import sys
from pathlib import Path

from trainscale import aggregate, predict, predict_plot

with open(snakemake.log[0], "w") as log:  # noqa: F821 (injected by Snakemake)
    sys.stderr = log
    runs = aggregate.read_runs(snakemake.input.runs)  # noqa: F821
    coll = aggregate.read_collectives(snakemake.input.collectives)  # noqa: F821
    pred, check, notes = predict.predict_study(runs, coll, dict(snakemake.params.predict))  # noqa: F821
    pred.to_csv(snakemake.output.predictions, index=False)  # noqa: F821
    check.to_csv(snakemake.output.check, index=False)  # noqa: F821
    predict_plot.draw(pred, Path(snakemake.output.png).parent)  # noqa: F821
    for note in notes:
        print(f"trainscale: {note}", file=log)
    print(f"trainscale: {len(pred)} prediction rows, {len(check)} checks", file=log)
