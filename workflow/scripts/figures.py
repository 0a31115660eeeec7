"""Snakemake script: every figure of reports/figures.yaml as SVG and PNG from the study's tables."""

import sys
from pathlib import Path

from trainscale import plots
from trainscale.study import Study

with open(snakemake.log[0], "w") as log:
    sys.stderr = log
    study = Study.read(snakemake.input, snakemake.config["study"])
    out = Path(snakemake.output[0]).parent
    notes = plots.render_all(study, out, jobs=snakemake.threads)
    for name, note in notes.items():
        print(f"trainscale: figure {name}: {note or 'drawn'}", file=log)
