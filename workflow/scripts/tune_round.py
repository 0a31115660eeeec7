"""Snakemake script: one round of a tune (trainscale.tune.rule.round_result) from its runs'
records and the round before."""

import contextlib

from trainscale.measure import metrics
from trainscale.tune import records, results, rule

with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
    space = records.read_round_zero(snakemake.input.space)
    before = snakemake.input.previous
    previous = records.read_round(before[0]) if before else None
    runs, invalid = [], []
    for path in snakemake.input.runs:
        try:
            runs.append((results.round_number(path), path, metrics.read(path)))
        except metrics.MetricsError as e:  # reported among the failed runs; no evidence
            invalid.append((results.round_number(path), path, str(e)))
    result = rule.round_result(space, int(snakemake.wildcards.round), runs, previous, invalid)
    records.write_json(snakemake.output[0], result)
    decisions = [c.decision for c in result.cells]
    print(
        f"round {result.round}: "
        + ", ".join(f"{decisions.count(d)} {d}" for d in ("go on", "stopped", "best")),
        f"; {len(result.failed)} failed runs; {result.done or 'the tune goes on'}",
        file=log,
    )
