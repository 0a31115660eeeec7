"""Snakemake script: one look of a study's racing step (config `repeats: {min, max}`;
trainscale.analysis.repeats): from every record so far, which cells get one more repeat."""

import contextlib
import json
from pathlib import Path

from trainscale.analysis import repeats
from trainscale.analysis.metrics_tables import run_id
from trainscale.analysis.study import Study

with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
    paths = list(snakemake.input.metrics)
    study = Study.build(paths, snakemake.config["study"], config=snakemake.config)
    span = repeats.Repeats(snakemake.params.low, snakemake.params.high)
    asked = [run_id(p) for p in paths]
    decided = repeats.decide_study(study.scaling, study.runs, asked, span, study.equivalence)
    look = int(snakemake.wildcards.look)
    nxt = [r for r in decided["next_run"] if r]
    result = {"look": look, "level": span.look_level(), "next": nxt,
              "cells": decided.drop(columns="next_run").to_dict("records")}  # fmt: skip
    Path(snakemake.output[0]).write_text(json.dumps(result, indent=1) + "\n")
    print(f"look {look}: {len(nxt)} cells get one more repeat", file=log)
