"""Snakemake script: predictions.csv, prediction_check.csv and the predicted-scaling figure."""

import sys
from pathlib import Path

from trainscale import predict, predict_plot
from trainscale.study import Study

with open(snakemake.log[0], "w") as log:
    sys.stderr = log
    study = Study.read(snakemake.input, snakemake.config["study"])
    pred, check, notes = predict.predict_study(
        study.runs, study.collectives, dict(snakemake.params.predict)
    )
    pred.to_csv(snakemake.output.predictions, index=False)
    check.to_csv(snakemake.output.check, index=False)
    predict_plot.draw(pred, Path(snakemake.output.png).parent)
    for note in notes:
        print(f"trainscale: {note}", file=log)
    print(f"trainscale: {len(pred)} prediction rows, {len(check)} checks", file=log)
