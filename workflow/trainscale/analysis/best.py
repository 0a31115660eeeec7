"""Which cells could be the best: simultaneous comparisons with the best (MCB).

A ranking picks its fastest from the data, then sets every other cell beside it; testing each
pair at 5 % calls some cell "slower" in most studies of 14 equal cells. Here every cell i gets
at once a 95 % interval of θ_i = μ_i − max_{j≠i} μ_j, its log throughput minus the best of the
others, so the answer is a set: the cells whose interval reaches 0 or above could be the best;
a cell is slower than the best only where its whole interval lies below 0. The definition,
its assumptions and its simulated error rates are the bullet "comparison with the best" of
docs/metrics.md (the report's Methods).

Why every pair at once: a cell called slower is in error only where it is tied with the best;
where every cell is tied (the null the tests simulate), that is any pair, so a strict "slower"
that holds needs every pair's interval at once (the MCB intervals deduced from simultaneous
all-pairwise ones, Hsu 1996, Multiple Comparisons, ch. 4; Tukey's construction). Hsu's
constrained MCB (Hsu 1981, 1984) with Dunnett's one-sided value says "not the best", which a
tied cell also is: read as "slower" it calls some cell of 14 equal ones slower in about 37 %
of simulated studies. Edwards & Hsu (1983, "Multiple comparisons with the best treatment")
deduce MCB intervals from comparisons with a control, each cell the control in turn; they do
not use the studentized range. Because the cells' variances and df differ, the critical value
is not the studentized range's but the 95 % quantile of the maximum over the panel's pairs of
|z_i s_i − z_j s_j| / √(u_i² s_i² + u_j² s_j²), z_i standard normal and u_i² a χ² on the
cell's df over its df (Welch's statistic, each s_i² = V_i taken as the truth), by Monte
Carlo as `multcomp` computes its max-t values with `mvtnorm` (Hothorn, Bretz & Westfall 2008):
DRAWS draws at a fixed seed, cached by the panel's shape.

`compare_with_best` is the public entry: per-cell estimates, variances and degrees of
freedom in, the intervals, the could-be-best set and the slower flags out; it works on any
leading axes (the error-rate tests run thousands of simulated studies through it) and on
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
#: The error a race of looks spends in all (the tune's race, a study's repeats {min, max}):
#: the chance that the true best leaves the set over every look.
ALPHA = 0.05
#: Monte-Carlo draws of a critical value: its level is then known to ±0.5 points (1 se).
DRAWS = 2000
#: The fixed seed of those draws: one panel gets one value on every machine.
SEED = 20260
#: Degrees of freedom beyond which a cell's t is drawn as at this many (floored; errs wide).
MAX_DF = 240
#: Panels of studies whose pairs one Monte-Carlo block holds (memory: CHUNK·pairs·DRAWS).
CHUNK = 32
#: Degrees of freedom at which the studentized range's values are computed (`critical="range"`):
#: a pair's df is floored to the nearest below (errs wide), so a handful serve every study.
DF_GRID = (*range(1, 11), 12, 15, 20, 24, 30, 40, 60, 120, 240)


def look_level(looks: int, alpha: float = ALPHA) -> float:
    """Each look's simultaneous level in a race of at most `looks` looks that spends `alpha`
    in all: 1 − alpha / looks (Bonferroni's split of the level over a fixed maximum of looks),
    so the true best is called slower at some look with probability at most `alpha`."""
    return 1 - alpha / max(looks, 1)


def df_floor(df: np.ndarray | float) -> np.ndarray:
    """Each df floored to DF_GRID (NaN below 1)."""
    grid = np.asarray(DF_GRID, dtype=float)
    d = np.asarray(df, dtype=float)
    at = np.searchsorted(grid, np.where(np.isfinite(d), d, 0), side="right") - 1
    return np.where(np.isnan(d) | (at < 0), np.nan, grid[np.clip(at, 0, None)])


@functools.cache
def critical_value(cells: int, df: float, level: float = LEVEL) -> float:
    """`critical="range"`'s value (the method before per-panel values): the c at which every
    pair of `cells` cells of equal variance is within c standard errors of its difference at
    once with probability `level`: the studentized range's quantile q(level; cells, df) / √2
    (Tukey; scipy.stats.studentized_range, read from its table in
    trainscale.analysis.studentized_range where it holds it), Student's two-sided t itself for
    two cells. Cached by the cell count and the df (floored to DF_GRID by
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


@functools.cache
def _normals(cells: int) -> np.ndarray:
    """(cells, DRAWS) standard normals at SEED: the same for every panel of `cells` cells."""
    return np.random.default_rng([SEED, cells]).standard_normal((cells, DRAWS))


@functools.cache
def _scales(df: int, cells: int) -> np.ndarray:
    """(cells, DRAWS) draws of √(χ²_df / df) at SEED and `df`."""
    rng = np.random.default_rng([SEED, cells, df])
    return np.sqrt(rng.gamma(df / 2, 2 / df, (cells, DRAWS)))


def _scale_draws(df: np.ndarray) -> np.ndarray:
    """(..., cells, DRAWS) draws of √(χ²_df / df), each cell's on its df (floored, ≤ MAX_DF):
    how far a cell's estimated standard error falls from its true one."""
    cells = df.shape[-1]
    whole = np.clip(np.floor(np.nan_to_num(df, nan=1.0)), 1, MAX_DF).astype(int)
    out = np.empty((*df.shape, DRAWS))
    for v in np.unique(whole):
        at = whole == v
        scale = np.broadcast_to(_scales(int(v), cells), out.shape)
        out[at] = scale[at]
    return out


def simultaneous(var: np.ndarray, df: np.ndarray, compared: np.ndarray, level: float = LEVEL):
    """Per panel (leading axes; cells last): the c at which, with probability `level`, every
    pair of compared cells has |(y_i − y_j) − (μ_i − μ_j)| ≤ c · √(V_i + V_j) at once, each
    cell's V on its own df: the `level` quantile of max over pairs of |z_i s_i − z_j s_j| /
    √(u_i² s_i² + u_j² s_j²) (s_i² = V_i, z normal, u_i² χ² on the cell's df over its df: how
    far each estimated variance falls from the truth, Welch's statistic), by Monte Carlo
    (DRAWS at SEED). NaN with fewer than two cells. One panel's value is cached by its shape
    (`_panel`)."""
    var, df, compared = np.broadcast_arrays(np.asarray(var, float), np.asarray(df, float),
                                            np.asarray(compared, bool))  # fmt: skip
    if var.ndim == 1:
        keep = np.flatnonzero(compared)
        shape = tuple(np.round(var[keep] / var[keep].max(), 4)) if len(keep) else ()
        floor = tuple(np.clip(np.floor(df[keep]), 1, MAX_DF))
        return np.float64(_panel(shape, floor, level))
    flat = [a.reshape(-1, a.shape[-1]) for a in (var, df, compared)]
    out = np.concatenate([_max_t(*(a[i : i + CHUNK] for a in flat), level)
                          for i in range(0, len(flat[0]), CHUNK)])  # fmt: skip
    return out.reshape(var.shape[:-1])


@functools.lru_cache(maxsize=4096)
def _panel(shape: tuple, floor: tuple, level: float) -> float:
    """`simultaneous` of one panel of compared cells: relative variances `shape`, df `floor`."""
    if len(shape) < 2 or not max(shape) > 0:
        return math.nan
    one = np.ones((1, len(shape)), bool)
    return float(_max_t(np.array([shape]), np.array([floor]), one, level)[0])


def _max_t(var: np.ndarray, df: np.ndarray, compared: np.ndarray, level: float) -> np.ndarray:
    """`simultaneous` of panels (rows): the quantile of the maximum statistic over DRAWS."""
    cells = var.shape[-1]
    i, j = np.triu_indices(cells, 1)
    pair = compared[:, i] & compared[:, j]
    sd = np.sqrt(np.where(compared, np.nan_to_num(var), 0.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        total = np.sqrt(sd[:, i] ** 2 + sd[:, j] ** 2)
        a, b = sd[:, i] / total, sd[:, j] / total
    live = pair & (total > 0)
    a = np.where(live, a, 0.0).astype(np.float32)[..., None]
    b = np.where(live, b, 0.0).astype(np.float32)[..., None]
    z = _normals(cells).astype(np.float32)
    u = _scale_draws(np.where(compared, df, 1.0)).astype(np.float32)
    stat = np.zeros((len(var), DRAWS), np.float32)
    for k in range(cells - 1):  # the pairs (k, j > k): one block of draws at a time
        at = slice(int(np.searchsorted(i, k)), int(np.searchsorted(i, k + 1)))
        part = z[k] * a[:, at] - z[k + 1 :] * b[:, at]
        spread = (u[:, k : k + 1] * a[:, at]) ** 2 + (u[:, k + 1 :] * b[:, at]) ** 2
        with np.errstate(invalid="ignore", divide="ignore"):
            part = np.where(spread > 0, np.abs(part) / np.sqrt(spread), 0.0)
        np.maximum(stat, part.max(1), out=stat)
    values = np.quantile(stat, level, axis=-1)
    return np.where(pair.any(-1), values, np.nan)


@dataclass
class Best:
    """The comparison with the best, per cell (arrays over the leading axes, cells last):
    `low` and `high` the simultaneous interval of θ_i = μ_i − max_{j≠i} μ_j (NaN without
    one), `could_be_best` (its interval reaches 0 or above, or the cell has no interval:
    nothing rules it out), `slower` (its interval lies below 0: slower than the best),
    `compared` (the cell has an interval and entered the comparison), and per study `cells`,
    how many did, and `critical`, the panel's simultaneous critical value (NaN with "range")."""

    low: np.ndarray
    high: np.ndarray
    could_be_best: np.ndarray
    slower: np.ndarray
    compared: np.ndarray
    cells: np.ndarray
    critical: np.ndarray


def compare_with_best(
    y: np.ndarray,
    var: np.ndarray,
    df: np.ndarray,
    pair_df: np.ndarray | None = None,
    level: float = LEVEL,
    *,
    critical: str = "panel",
) -> Best:
    """Simultaneous intervals at `level` of each cell's θ_i = μ_i − max_{j≠i} μ_j from
    per-cell estimates `y` (log throughput, or −log cost: higher is better), their variances
    `var` and degrees of freedom `df`, each shaped (..., cells). A cell without a finite y,
    var ≥ 0 and df ≥ 1 is left out (could be best, never slower).

    With c the panel's simultaneous critical value (`simultaneous`: every compared pair at
    once, each cell on its own variance and df) and s_ij = √(V_i + V_j): θ_i ∈ [min_{j≠i}
    (y_i − y_j − c s_ij), min_{j≠i} (y_i − y_j + c s_ij)] for every i at once, as every pair's
    μ_i − μ_j is within c s_ij of y_i − y_j at once. `critical="range"` takes instead the
    studentized range's value at each pair's df (`pair_df`, (..., cells, cells); by default
    Welch–Satterthwaite's of the two cells': Games–Howell's way), the method before; the
    panel's value does not read `pair_df`."""
    y, var, df = (np.asarray(a, dtype=float) for a in (y, var, df))
    compared = np.isfinite(y) & np.isfinite(var) & (var >= 0) & (df >= 1)
    cells = compared.sum(-1)
    if critical == "panel":
        c = np.asarray(simultaneous(var, df, compared, level))[..., None, None]
    elif critical == "range":
        nu = welch_df(var, df) if pair_df is None else np.asarray(pair_df, dtype=float)
        c = critical_values(cells[..., None, None], nu, level)
    else:
        raise ValueError(f"critical={critical!r}: use 'panel' or 'range'")
    others = compared[..., :, None] & compared[..., None, :] & ~np.eye(y.shape[-1], dtype=bool)
    with np.errstate(invalid="ignore"):
        diff = y[..., :, None] - y[..., None, :]
        reach = c * np.sqrt(var[..., :, None] + var[..., None, :])
        high = np.where(others, diff + reach, np.inf).min(-1)
        low = np.where(others, diff - reach, np.inf).min(-1)
    inside = compared & (cells[..., None] >= 2)
    high, low = np.where(inside, high, np.nan), np.where(inside, low, np.nan)
    slower = inside & (high < 0)
    value = c[..., 0, 0] if critical == "panel" else np.nan
    return Best(low, high, ~slower, slower, compared, cells, value * np.ones(cells.shape))
