"""`trainscale tune STUDY`: the fastest (or cheapest) cells of a study's matrix without running
the whole grid, by successive halving with a statistical stop (docs/tune.md).

The tune is a Snakemake workflow of rounds (workflow/rules/tune.smk): round 0 plans
(`space`), each round's runs are ordinary train jobs, a checkpoint per round reads their
records (`evidence`) and decides which cells go on (`rule`), and the last writes tune.csv,
best.yaml and report.html (`results`, `page`). The method, as the report's Methods states it:

- search space: the cells the study's matrix, its rules and the memory model keep (round 0,
  no jobs); a cell the memory model predicts over memory.limit_gib × headroom is never tried,
  even where memory.check: warn keeps it in the study. The dropped cells are listed with
  their reasons in tune.csv's round 0.
- tune run: an ordinary run of a cell (same runners, launchers, records, SLURM profile) under
  results/<study>/tune/round~R/runs/, with `evaluate: false` (no test scoring) and
  tune.steps_per_epoch steps in each epoch: one warm-up epoch, left out of the throughput as
  in every record, then 1 steady epoch in round 1 and eta^(R-1) in round R.
- rounds: round 1 runs every cell twice (three times where the tune has fewer than 4 cells,
  so that the run-to-run variance pooled over the cells has at least 4 degrees of freedom);
  each later round runs each surviving cell once more with more steady epochs. A cell's
  repeats are numbered across the rounds (0 and 1 in round 1, 2 in round 2, ...), and every
  earlier round's records of a cell count as evidence.
- estimate: a cell's mean log throughput over its ok runs, with the study's two-level
  model of steps and repeats (`trainscale.analysis.interval`: within-run variance from the
  steady epochs' blocks, run-to-run variance pooled over alike strata); shown as
  exp(mean) in samples/s (tokens/s on token data) with its 95 % interval, or for cost as
  the cost per million units (device-hours per million where no price is given).
- panel: the cells compared with each other: per model, dataset and world size N for
  throughput; per model and dataset over every N for cost.
- stop rule: in each panel, the comparison with the best (`trainscale.analysis.best`,
  simultaneous 95 % intervals of each cell's log objective minus the best of the others)
  stops the cells it calls slower; of the rest, at most max(2, ceil(n / eta)) go on, n the
  panel's cells in the round, the best estimates first (successive halving); a cell without
  an ok run, or on logical devices (never ranked), is stopped. A cell of one ok run whose
  pool has too few degrees of freedom has no interval: it could be the best and is never
  called slower.
- end: a panel ends when one cell could be the best, or when a round after the first stops
  none of its cells (the set stopped shrinking); its cells left are the winning set
  (decision `best`). The tune ends when every panel has ended, or when the next round's runs
  would pass the budget (tune.max_runs, tune.max_worker_hours: predicted from each cell's
  measured set-up, warm-up and steady epoch seconds), and then the cells still going on are
  the winning set.
- worker-seconds: the sum over runs of world_size × wall_seconds (process start to record
  written), measured for the tune's runs, failed ones included.
- grid cost: what the study's own runs (every kept cell, its repeats, epochs and steps per
  epoch) would take, predicted per cell from its tune runs: set-up and warm-up seconds as
  measured, every further step at the cell's steady seconds per step; evaluation left out.
  A prediction, labelled as such, never mixed with the measured figures.
"""
