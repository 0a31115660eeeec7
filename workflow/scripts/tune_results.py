"""Snakemake script: a tune's tune.csv, best.yaml and report.html from its rounds."""

import contextlib

from trainscale.tune import page, records, results

with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
    space = records.read_round_zero(snakemake.input.space)
    rounds = [records.read_round(p) for p in snakemake.input.rounds]
    results.table(space, rounds).to_csv(snakemake.output.csv, index=False)
    best = results.winners(rounds)
    results.write_best(snakemake.output.best, snakemake.config, best, snakemake.output.csv)
    page.write_html(snakemake.output.html, space, rounds, snakemake.config)
