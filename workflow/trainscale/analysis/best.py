"""Which cells could be the best: simultaneous comparisons with the best (MCB).

A ranking picks its fastest from the data, then sets every other cell beside it; testing each
pair at 5 % calls some cell "slower" in most studies of 14 equal cells. Here every cell i gets
at once a 95 % interval of θ_i = μ_i − max_{j≠i} μ_j, its log throughput minus the best of the
others, so the answer is a set: the cells whose interval reaches 0 or above could be the best;
a cell is slower than the best only where its whole interval lies below 0. The definition,
its assumptions and its simulated error rates are the bullet "comparison with the best" of
`trainscale.analysis.aggregate`'s docstring (the report's Methods).

Why the studentized range's critical value and not Dunnett's: Hsu's constrained MCB with
Dunnett's one-sided value says "not the best" (θ_i ≤ 0), which a cell tied with the best also
is; read as "slower", it calls some cell slower in about 37 % of simulated studies of 14
equal cells (tests/test_interval.py prints it). A strict "slower" (θ_i < 0) that holds for
every cell at once needs every pair's interval to hold at once: Tukey's all-pairs critical
value, as Edwards & Hsu's unconstrained MCB uses.

`compare_with_best` is the public entry: per-cell estimates, variances and degrees of
freedom in, the intervals, the could-be-best set and the slower flags out; it works on any
leading axes (the coverage test runs thousands of simulated studies through it) and on
records of any kind (the ranking, `trainscale tune`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from trainscale.analysis import studentized_range
from trainscale.analysis.interval import t_scalar, welch_df

#: The simultaneous confidence level of the intervals.
LEVEL = 0.95
#: Degrees of freedom at which critical values are computed: a pair's df is floored to the
#: nearest below (errs wide), so a handful of values serve every study.
DF_GRID = (*range(1, 11), 12, 15, 20, 24, 30, 40, 60, 120, 240)


def df_floor(df: np.ndarray | float) -> np.ndarray:
    """Each df floored to DF_GRID (NaN below 1)."""
    grid = np.asarray(DF_GRID, dtype=float)
    d = np.asarray(df, dtype=float)
    at = np.searchsorted(grid, np.where(np.isfinite(d), d, 0), side="right") - 1
    return np.where(np.isnan(d) | (at < 0), np.nan, grid[np.clip(at, 0, None)])


@functools.cache
def critical_value(cells: int, df: float, level: float = LEVEL) -> float:
    """The c at which every pair of `cells` cells of equal variance is within c standard
    errors of its difference at once with probability `level`: the studentized range's
    quantile q(level; cells, df) / √2 (Tukey; scipy.stats.studentized_range, read from its
    table in trainscale.analysis.studentized_range where it holds it), Student's two-sided t
    itself for two cells. Cached by the cell count and the df (floored to DF_GRID by
    `critical_values`)."""
    if cells < 2 or not df >= 1:
        return math.nan
    if cells == 2:
        return t_scalar(df, (1 + level) / 2)
    kept = studentized_range.QUANTILES.get(cells) if level == studentized_range.LEVEL else None
    if kept is not None and df in studentized_range.DF:
        return kept[studentized_range.DF.index(df)] / math.sqrt(2)
    from scipy import stats  # seconds to import and to integrate: outside the table only

    return float(stats.studentized_range.ppf(level, cells, df)) / math.sqrt(2)


def critical_values(cells: np.ndarray, df: np.ndarray, level: float = LEVEL) -> np.ndarray:
    """`critical_value` elementwise over broadcast arrays of cell counts and (floored) df."""
    k, d = np.broadcast_arrays(np.asarray(cells), df_floor(df))
    out = np.full(k.shape, np.nan)
    ok = (k >= 2) & np.isfinite(d)
    pairs = np.stack([k[ok], d[ok]], axis=-1)
    if len(pairs):
        unique, where = np.unique(pairs, axis=0, return_inverse=True)
        values = np.array([critical_value(int(a), float(b), level) for a, b in unique])
        out[ok] = values[where.ravel()]
    return out


@dataclass
class Best:
    """The comparison with the best, per cell (arrays over the leading axes, cells last):
    `low` and `high` the simultaneous interval of θ_i = μ_i − max_{j≠i} μ_j (NaN without
    one), `could_be_best` (its interval reaches 0 or above, or the cell has no interval:
    nothing rules it out), `slower` (its interval lies below 0: slower than the best),
    `compared` (the cell has an interval and entered the comparison), and `cells` per study,
    how many did."""

    low: np.ndarray
    high: np.ndarray
    could_be_best: np.ndarray
    slower: np.ndarray
    compared: np.ndarray
    cells: np.ndarray


def compare_with_best(
    y: np.ndarray,
    var: np.ndarray,
    df: np.ndarray,
    pair_df: np.ndarray | None = None,
    level: float = LEVEL,
) -> Best:
    """Simultaneous intervals at `level` of each cell's θ_i = μ_i − max_{j≠i} μ_j from
    per-cell estimates `y` (log throughput, or −log cost: higher is better), their variances
    `var` and degrees of freedom `df`, each shaped (..., cells). `pair_df` (..., cells, cells)
    gives each pair's df (e.g. Satterthwaite's with a shared variance estimate); by default
    Welch–Satterthwaite's of the two cells'. A cell without a finite y, var ≥ 0 and df ≥ 1 is
    left out (could be best, never slower).

    With c_ij the studentized range's critical value for the cells compared at the pair's df
    (`critical_value`, Games–Howell's way with unequal variances) and s_ij = √(V_i + V_j):
    θ_i ∈ [min_{j≠i} (y_i − y_j − c_ij s_ij), min_{j≠i} (y_i − y_j + c_ij s_ij)] for every i
    at once, as every pair's μ_i − μ_j is within c_ij s_ij of y_i − y_j at once."""
    y, var, df = (np.asarray(a, dtype=float) for a in (y, var, df))
    compared = np.isfinite(y) & np.isfinite(var) & (var >= 0) & (df >= 1)
    cells = compared.sum(-1)
    nu = welch_df(var, df) if pair_df is None else np.asarray(pair_df, dtype=float)
    c = critical_values(cells[..., None, None], nu, level)
    others = compared[..., :, None] & compared[..., None, :] & ~np.eye(y.shape[-1], dtype=bool)
    with np.errstate(invalid="ignore"):
        diff = y[..., :, None] - y[..., None, :]
        reach = c * np.sqrt(var[..., :, None] + var[..., None, :])
        high = np.where(others, diff + reach, np.inf).min(-1)
        low = np.where(others, diff - reach, np.inf).min(-1)
    inside = compared & (cells[..., None] >= 2)
    high, low = np.where(inside, high, np.nan), np.where(inside, low, np.nan)
    slower = inside & (high < 0)
    return Best(low, high, ~slower, slower, compared, cells)
