"""Repeats a study buys (config `repeats: {min, max}`), simulated through the workflow's own
decision (`trainscale.analysis.repeats.decide` on `interval.fit` of each look's runs).

A default-like panel of 14 cells (0, 10, 20, 27, 27, 30, 33, 46, 50, 61, 69, 70, 73, 73 % behind
the fastest; issue 68's), or 14 equal cells with --equal; each run's log throughput is the
cell's plus a run effect N(0, σ_a²) and within-run noise (2 %, 8 batch means). Every cell runs
`min` repeats, then the cells each look leaves open get one more, as the workflow does.
Printed: how often the true fastest (with --equal: any cell) is called slower, the share of
cells ≥ 30 % behind called slower at the end (at the looks' level), how often the panel is
left open at `max`, and the runs spent against the grid at min and at max.

    .venv/bin/python benchmarks/repeats_race.py [--min 2] [--max 4] [--sigma 0.12] [--equal]
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from trainscale.analysis import interval, repeats

BEHIND = np.array([0, 10, 20, 27, 27, 30, 33, 46, 50, 61, 69, 70, 73, 73]) / 100
WITHIN, BLOCKS = 0.02, 8


def table(y: np.ndarray, w: np.ndarray, taken: np.ndarray) -> pd.DataFrame:
    """The scaling rows `decide` reads, fitted from the runs so far (NaN: not run)."""
    fit = interval.fit(y, w, np.where(np.isfinite(y), BLOCKS, np.nan))
    out = pd.DataFrame({k: np.asarray(v, float) for k, v in fit.columns().items()})
    return out.assign(throughput_log_mean=fit.ybar, throughput_mean=np.exp(fit.ybar),
                      interval_method="model", stratum="s", prior_run_var=np.nan, model="m",
                      dataset="d", world_size=2, seq_len=0, logical=False,
                      cell=[f"c{i}" for i in range(len(taken))], repeats_taken=taken)  # fmt: skip


def race(rng, mu: np.ndarray, sigma: float, span: repeats.Repeats):
    """One study's looks: (the last decision, the repeats each cell took)."""
    n = len(mu)
    y, w = np.full((n, span.high), np.nan), np.full((n, span.high), np.nan)
    taken = np.zeros(n, int)

    def run(cells: np.ndarray) -> None:
        for i in cells:
            y[i, taken[i]] = mu[i] + rng.normal(0, sigma) + rng.normal(0, WITHIN)
            w[i, taken[i]] = WITHIN**2 * rng.chisquare(BLOCKS - 1) / (BLOCKS - 1)
            taken[i] += 1

    for _ in range(span.low):
        run(np.arange(n))
    while True:
        decided = repeats.decide(table(y, w, taken.copy()), span, 0.02)
        more = np.flatnonzero(decided["more"].to_numpy())
        if not len(more):
            return decided, taken
        run(more)


def pct(share: float) -> str:
    return f"{100 * share:.1f} %"


def main() -> None:
    p = argparse.ArgumentParser(description="repeats {min, max} simulated on one panel")
    p.add_argument("--min", type=int, default=2)
    p.add_argument("--max", type=int, default=4)
    p.add_argument("--sigma", type=float, default=0.12, help="run-to-run sd of log throughput")
    p.add_argument("--equal", action="store_true", help="14 equal cells")
    p.add_argument("--studies", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    rng, span = np.random.default_rng(a.seed), repeats.Repeats(a.min, a.max)
    behind = np.zeros(14) if a.equal else BEHIND
    far = behind >= 0.30
    wrong = far_slower = left_open = 0
    spent = []
    for _ in range(a.studies):
        decided, taken = race(rng, np.log1p(-behind), a.sigma, span)
        slower = decided["repeats_reason"].str.startswith("slower").to_numpy()
        wrong += slower.any() if a.equal else slower[0]
        far_slower += slower[far].sum()
        left_open += decided["repeats_reason"].str.contains("not resolved").any()
        spent.append(taken.sum())
    far_part = f"{pct(far_slower / max(far.sum() * a.studies, 1))}" if far.any() else "–"
    print(f"repeats {{min: {a.min}, max: {a.max}}}, σ_a {a.sigma}, {a.studies} studies: "
          f"{'some cell' if a.equal else 'the true fastest'} called slower "
          f"{pct(wrong / a.studies)}; cells ≥ 30 % behind called slower {far_part}; left open at "
          f"max {pct(left_open / a.studies)}; runs {np.mean(spent):.1f} a study (grid "
          f"{14 * a.min} at min, {14 * a.max} at max)")  # fmt: skip


if __name__ == "__main__":
    main()
