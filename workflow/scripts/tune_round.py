"""Snakemake script: one round of a tune (trainscale.tune.rule.round_result) from its runs'
records and the round before."""

import contextlib
import json
from pathlib import Path

from trainscale.measure import metrics
from trainscale.tune import results, rule

with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
    space = json.loads(Path(snakemake.input.space).read_text())
    before = snakemake.input.previous
    previous = json.loads(Path(before[0]).read_text()) if before else None
    records, invalid = [], []
    for path in snakemake.input.runs:
        try:
            records.append((results.round_number(path), path, metrics.read(path)))
        except metrics.MetricsError as e:  # reported among the failed runs; no evidence
            invalid.append((results.round_number(path), path, str(e)))
    result = rule.round_result(space, int(snakemake.wildcards.round), records, previous, invalid)
    Path(snakemake.output[0]).write_text(json.dumps(result, indent=1) + "\n")
    decisions = [c["decision"] for c in result["cells"]]
    print(
        f"round {result['round']}: "
        + ", ".join(f"{decisions.count(d)} {d}" for d in ("go on", "stopped", "best")),
        f"; {len(result['failed'])} failed runs; {result['done'] or 'the tune goes on'}",
        file=log,
    )
