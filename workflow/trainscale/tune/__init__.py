"""`trainscale tune STUDY`: the fastest (or cheapest) cells of a study's matrix without running
the whole grid, by racing (docs/tune.md).

The tune is a Snakemake workflow of rounds (workflow/rules/tune.smk): round 0 plans
(`space`), each round's runs are ordinary train jobs, a checkpoint per round reads every record
so far (`evidence`, `rule`) and asks the race (`race.decide`) which cells go on and which runs
to make next, and the last writes tune.csv, best.yaml and report.html (`results`, `page`). The
method, as the report's Methods states it:

- search space: the cells the study's matrix, its rules and the memory model keep (round 0,
  no jobs); a cell the memory model predicts over memory.limit_gib × headroom is never tried,
  even where memory.check: warn keeps it in the study. The dropped cells are listed with
  their reasons in tune.csv's round 0.
- tune run: an ordinary run of a cell (same runners, launchers, records, SLURM profile) under
  results/<study>/tune/round~R/runs/, with `evaluate: false` (no test scoring), one warm-up
  epoch left out of the throughput as in every record, then tune.epochs steady epochs of
  tune.steps_per_epoch steps. Every run of every round has this length: the run-to-run
  variance limits a comparison, and only more runs shrink it.
- rounds: round 1 runs every cell twice (more in a panel of fewer than 4 cells, so that the
  run-to-run variance pooled over its cells has at least 4 degrees of freedom); each later
  round runs every cell still going on three more times, all cells in the same round (drift
  falls on all alike), except that the best estimate and a rival whose shortfall from it, as
  observed, the next look could resolve with at most 3 times its runs (80 % power at the look's
  level) get more where that takes more: runs raised only where the look is promising, which keeps
  each look's level (Chen, DeMets & Lan 2004; Mehta & Pocock 2011). A cell's repeats are
  numbered across the rounds; every run of every round is evidence, and a failed or invalid
  run is counted as spent.
- estimate: a cell's mean log throughput over its ok runs, with the study's two-level model of
  steps and repeats (`trainscale.analysis.interval`); shown as exp(mean) in samples/s
  (tokens/s on token data) with its 95 % interval, or for cost as the cost per million units
  (device-hours per million where no price is given; a panel that mixes priced and unpriced
  devices is stopped, never compared).
- panel: the cells compared with each other: per model, dataset and world size N for
  throughput; per model and dataset over every N for cost.
- race: racing (Maron & Moore 1994; F-Race, Birattari et al. 2002; irace). At each look, the
  comparison with the best (`trainscale.analysis.best`: simultaneous intervals of each cell's log
  objective minus the best of the others) stops the cells it calls slower; the others go on.
  A race makes at most 10 looks, and each look's intervals hold at 1 − 0.05/10 (Bonferroni's
  split): the cells never stopped are a 95 % confidence set of the panel's best over the whole
  race. Each look blocks by round, as F-Race blocks by instance: the cell + round model fitted
  by least squares takes the drift a round's runs share out of the comparison
  (`trainscale.analysis.blocks`; its rounds' effects cost their degrees of freedom, and a
  round with unequal runs per cell widens the contrasts it affects). A cell without an ok run,
  or on logical devices (never ranked), is stopped.
- end: a panel ends when one cell is left, when the cells left are equivalent within
  tune.equivalence (TOST, each pair at the look's level: an intersection-union test), or when
  the budget runs out (the race's 10th look; tune.max_runs, which keeps room for the winners'
  confirmation runs; tune.max_worker_hours, predicted from each cell's measured set-up,
  warm-up and steady epoch seconds, and before round 1 from each run's set-up and its steps
  at its FLOPs, erring low). Its cells left are the winning set (decision `best`).
- confirmation: each winner then runs tune.confirm (2) more times; its estimate and interval
  come from those runs alone (the run-to-run variance pooled with every run of the race),
  because the runs that picked a winner overstate it. A winner without them (confirm 0, or no
  budget left) is labelled "selected: biased up".
- cap (tune.cap: true): successive halving on top of the race: at most max(2, ⌈n/3⌉) of a
  panel's cells left go on, the best estimates; the others are "cut by the cap; could still
  be the best", and the set left is not a confidence set.
- worker-seconds: the sum over runs of world_size × wall_seconds (process start to record
  written), measured for the tune's runs, failed ones included.
- grid cost: what the study's own runs (every kept cell, its repeats, epochs and steps per
  epoch) would take, predicted per cell from its tune runs: set-up and warm-up seconds as
  measured, every further step at the cell's steady seconds per step; evaluation left out.
  A prediction, labelled as such, never mixed with the measured figures.
"""
