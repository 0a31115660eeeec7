"""A cell's 95% confidence interval of throughput from steps and repeats.

The definition (model and assumptions) is the term "confidence interval" of docs/methods.md
(the report's Methods) and of docs/metrics.md; this
module computes it, once, for scaling.csv (`trainscale.analysis.cells`), and through it for the
ranking, the summary and `trainscale compare`: the within-run variance of each run from its
blocks (`within_variance`), each cell's run-to-run variance moderated toward its stratum's
(`trainscale.analysis.moderate`; no pretest), each cell's interval (`fit`) and every pair's
degrees of freedom (`pair_df`), which the comparison with the best (`trainscale.analysis.best`)
reads. `fit` works on arrays with any leading axes, so the error-rate tests
(tests/test_moderate.py, tests/test_interval.py) run thousands of simulated studies through the
same code a report runs its one study through.

Student's t quantiles are computed here without scipy (a third of a second of every report for
a handful of quantiles).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainscale.analysis import blocks, moderate
from trainscale.measure import steptimes
from trainscale.plan import catalog

#: interval_method of a cell: its interval uses the steps' batch means and the study's repeats.
STEPS = "steps and repeats"
#: interval_method of a cell whose runs lack batch means: Student's t over its repeats alone.
REPEATS = "repeats only (records without step times)"
#: scaling.csv's columns of the model, per cell (`cell_intervals`).
CELL_COLUMNS = ["throughput_log_mean", "throughput_log_var", "interval_df", "interval_method",
                "within_run_var", "within_run_df", "between_run_var", "pooled_run_var",
                "pooled_df", "variance_pool", "prior_run_var", "prior_df", "prior_scale",
                "stratum"]  # fmt: skip
#: CELL_COLUMNS that are text.
TEXT_COLUMNS = ("interval_method", "stratum")


# --------------------------------------------------------------------------------------------
# Student's t


@functools.cache
def _t_df(df: int, central: float) -> float:
    """The t at which P(|T| ≤ t) = `central`, T Student's t with integer df ≥ 1: bisection on
    that probability's closed form (Abramowitz & Stegun 26.7.3-4)."""

    def prob(t: float) -> float:  # P(|T| <= t)
        theta = math.atan(t / math.sqrt(df))
        c2 = math.cos(theta) ** 2
        total, term = 1.0, 1.0
        if df % 2:  # odd: (2/π)(θ + sinθ cosθ Σ_k a_k cos^2k θ), a_k = a_k-1 · 2k/(2k+1)
            for k in range(1, (df - 1) // 2):
                term *= c2 * (2 * k) / (2 * k + 1)
                total += term
            sums = math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0
            return 2 / math.pi * (theta + sums)
        for k in range(1, df // 2):  # even: sinθ Σ_k b_k cos^2k θ, b_k = b_k-1 · (2k-1)/2k
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return math.sin(theta) * total

    lo, hi = 0.0, 20.0  # t(0.975, 1) = 12.7
    while hi - lo > 1e-13 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if prob(mid) < central else (lo, mid)
    return (lo + hi) / 2


#: From this many degrees of freedom on, a quantile comes from its expansion in 1/df (whose
#: error there is below 1e-13; the closed form's terms grow with df).
EXPANSION_FROM = 500


@functools.cache
def _z(central: float) -> float:
    """The standard normal z at which P(|Z| ≤ z) = `central`, by bisection on erf."""
    lo, hi = 0.0, 10.0
    while hi - lo > 1e-15 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erf(mid / math.sqrt(2)) < central else (lo, mid)
    return (lo + hi) / 2


def _t_expansion(df: float, central: float) -> float:
    """t by its expansion about z in powers of 1/df (Abramowitz & Stegun 26.7.5)."""
    z = _z(central)
    g = [
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    ]
    return z + sum(gi / df ** (i + 1) for i, gi in enumerate(g))


def t_scalar(df: float, q: float = 0.975) -> float:
    """Student's t(q, df) for q > 0.5 of one df, floored to an integer (NaN below 1)."""
    df = math.floor(df) if math.isfinite(df) else math.nan
    if not df >= 1:
        return math.nan
    central = 2 * q - 1
    return _t_df(int(df), central) if df < EXPANSION_FROM else _t_expansion(df, central)


def t_quantile(df: np.ndarray | float, q: float = 0.975) -> np.ndarray | float:
    """Student's t(q, df) for q > 0.5, df floored to an integer (NaN where df < 1): the floor
    errs wide, as a Satterthwaite df calls for."""
    df = np.floor(np.asarray(df, dtype=float))
    out = np.full(df.shape, np.nan)
    ok = df >= 1
    values = {v: t_scalar(v, q) for v in np.unique(df[ok])}
    out[ok] = [values[v] for v in df[ok]]
    return out if out.ndim else float(out)


def t975(n: np.ndarray | pd.Series | int) -> np.ndarray | float:
    """Student's t quantile t(0.975, n − 1) for samples of size n (NaN where n < 2)."""
    return t_quantile(np.asarray(n, dtype=float) - 1)


# --------------------------------------------------------------------------------------------
# one run: its within-run variance


#: Steps a block of the within-run variance spans at least, where an epoch has enough for two:
#: consecutive steps are correlated, blocks this long nearly independent (lag-1 correlation of
#: their means under 0.07 for steps whose own lag-1 correlation is 0.5).
BLOCK_STEPS = 10


def within_variance(epochs: Iterable[dict]) -> tuple[float | None, int]:
    """(w, k) of a run: w the variance of the log of its throughput's mean step span from the
    blocks of its steady epochs (2..E) pooled, var(b) / (k · mean(b)²) with k blocks (the
    delta method), each epoch's blocks `spans`; (None, 0) where a steady epoch has no batch
    means (records made before them; tf-ps) or k < 2."""
    blocks: list[float] = []
    for e in list(epochs)[1:]:
        means = e.get("step_batch_means")
        if not means:
            return None, 0
        blocks += spans(means, e.get("steps") or 0, e.get("seconds"))
    k = len(blocks)
    mean = sum(blocks) / k if k else 0.0
    if k < 2 or mean <= 0:
        return None, 0
    var = sum((b - mean) ** 2 for b in blocks) / (k - 1)
    return var / (k * mean * mean), k


def spans(means: list[float], steps: int, seconds: float | None) -> list[float]:
    """An epoch's batch means (of `steps` step times, `steptimes.block_bounds`'s blocks) as
    the throughput sees them: adjacent blocks merged into max(2, steps // BLOCK_STEPS) blocks
    (as many as there were at most), and scaled by seconds / Σ step times, so the gaps between
    steps (loader waits, copies), which the epoch's wall time holds and step times do not,
    are spread over the epoch's steps in proportion."""
    sizes = np.diff(steptimes.block_bounds(steps)) if steps else []
    if len(sizes) != len(means):  # steps not as recorded: blocks of equal weight
        sizes = np.ones(len(means))
    parts = steptimes.block_bounds(
        len(means), min(len(means), max(2, int(sum(sizes)) // BLOCK_STEPS))
    )
    time = np.asarray(means, dtype=float) * sizes
    merged = [time[i:j].sum() / sizes[i:j].sum() for i, j in zip(parts, parts[1:], strict=False)]
    total = float(time.sum())
    scale = seconds / total if seconds and total > 0 else 1.0
    return [m * scale for m in merged]


# --------------------------------------------------------------------------------------------
# the cells of a study


#: The fewest prior degrees of freedom at which a cell of one ok run gets an interval (the
#: prior's variance on d₀ df; t(0.975, 4) = 2.8); below, "one run: no interval".
MIN_DF = 4
#: The words of a cell of one ok run whose prior gives fewer than MIN_DF.
NO_INTERVAL = "one run: no interval"


@dataclass
class Fit:
    """The model fitted to a study's cells (arrays over the leading axes of `fit`'s arguments,
    cells last). Per cell: n ok runs, ȳ, w̄ and its degrees of freedom, `steps` (whether its
    runs all have batch means), s² its own run-to-run variance on `df` = n − 1, `post` that
    variance moderated toward `prior2` (its stratum's, `trainscale.analysis.moderate`),
    `between` = max(post − w̄, 0) (what the blocks do not account for), Var(ȳ) and its
    degrees of freedom d₀ + n − 1; per study the prior's `prior_df` (d₀, capped) and
    `prior_scale` (s₀ of the study's prior, the strata level's)."""

    n: np.ndarray
    ybar: np.ndarray
    wbar: np.ndarray
    wdf: np.ndarray
    steps: np.ndarray
    s2: np.ndarray
    df: np.ndarray
    post: np.ndarray
    prior2: np.ndarray
    between: np.ndarray
    var: np.ndarray
    vdf: np.ndarray
    prior_df: np.ndarray
    prior_scale: np.ndarray

    def half_width(self) -> np.ndarray:
        """t(0.975, ν) · √Var(ȳ) per cell: the 95% interval is exp(ȳ ± this)."""
        return t_quantile(self.vdf) * np.sqrt(self.var)

    def columns(self) -> dict[str, np.ndarray]:
        """The fit by scaling.csv's column names, as `pair_df` reads them (each cell keeps its
        own variance: no `variance_pool`, so every pair's df is Welch–Satterthwaite's)."""
        every = np.ones(self.n.shape)
        return {"throughput_n": self.n, "throughput_log_var": self.var, "interval_df": self.vdf,
                "within_run_var": self.wbar, "within_run_df": self.wdf,
                "between_run_var": self.between, "pooled_run_var": self.post,
                "pooled_df": self.vdf, "variance_pool": np.full(self.n.shape, np.nan),
                "prior_df": self.prior_df[..., None] * every,
                "prior_scale": self.prior_scale[..., None] * every}  # fmt: skip


def fit(
    y: np.ndarray,
    w: np.ndarray,
    k: np.ndarray,
    strata: np.ndarray | None = None,
    rounds: np.ndarray | None = None,
) -> Fit:
    """The model of docs/metrics.md's "confidence interval" on log throughputs `y`, within-run
    variances `w` and batch counts `k`, each shaped (..., cells, runs) with NaN where a cell
    has no such run (w NaN where the run has no batch means); `strata` labels each cell
    (integers, one per cell; None: one stratum). Every cell's own run-to-run variance is
    moderated toward its stratum's, the strata's toward the study's (`moderate.moderate`):
    no test decides what is pooled. Var(ȳ) = max(post, w̄) / n (the blocks' w̄ a floor: a run
    varies at least as much as its steps say), on d₀ + n − 1 df. `rounds` (cells, runs; two
    axes only): each run's round, whose shared drift is then taken out of the cells'
    comparison (`trainscale.analysis.blocks`): ȳ and s² are of the runs less their round's
    effect, n − 1 scaled to the residual df, Var(ȳ) raised where the rounds are unbalanced."""
    block = blocks.unblocked(y) if rounds is None else blocks.fit(y, rounds)
    y = block.adjusted
    have = np.isfinite(y)
    n = have.sum(-1)
    labels = np.zeros(y.shape[-2], int) if strata is None else np.asarray(strata)
    at = np.unique(labels, return_inverse=True)[1].ravel()
    with np.errstate(invalid="ignore", divide="ignore"):
        ybar = np.where(have, y, 0).sum(-1) / n
        steps = (n > 0) & (np.isfinite(w) | ~have).all(-1)
        runs = have & steps[..., None]
        wbar = np.where(steps, np.where(runs, w, 0).sum(-1) / n, np.nan)
        wdf = np.where(runs, k - 1, 0).sum(-1)
        df = (n - 1).clip(0) * block.df_share
        s2 = (np.where(have, y - ybar[..., None], 0) ** 2).sum(-1) / df
        m = moderate.moderate(np.where(df > 0, s2, np.nan), df, at)
        per_run = np.fmax(m.post, np.where(steps, wbar, 0.0))
        between = np.where(steps, np.maximum(m.post - wbar, 0.0), m.post)
        usable = (n > 1) | ((n == 1) & (m.df >= MIN_DF))
        ok = usable & np.isfinite(per_run)
        var = np.where(ok, per_run * block.inflation / n, np.nan)
        vdf = np.where(ok, m.df, np.nan)
    prior_df = np.minimum(m.prior.df, moderate.PRIOR_DF)
    return Fit(n, ybar, wbar, wdf, steps, s2, df, m.post, m.prior2, between, var, vdf,
               prior_df, np.sqrt(m.study.scale2))  # fmt: skip


def combined(c, between, s2, df, within: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    """(V, ν) of V = c · σ_a² + Σ w_i: σ_a² = s² − (the pooled w̄), its error that of s² (df
    `df`; the pooled w̄ averages every run's blocks, so its own error is left out), each w_i
    with its degrees of freedom; ν by Satterthwaite, (c·s²)²/df · σ_a²/s² + Σ w_i²/df_i in the
    denominator: the s² term weighted by the share of s² that σ_a² is, so ν moves continuously
    as σ_a² goes to 0 (dropping the term where σ_a² came out 0 made ν jump from about 1-5 to
    the w_i's). Where V's parts are all exactly 0 (identical runs) ν is `df`."""
    v = c * between + sum(x for x, _ in within)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(s2 > 0, np.clip(between / s2, 0.0, 1.0), 0.0)
        den = np.where(between > 0, (c * s2) ** 2 / df * share, 0.0) + sum(
            np.where(x > 0, x**2 / d, 0.0) for x, d in within
        )
        nu = np.where(den > 0, v**2 / den, df)
    return v, nu


def welch_df(var: np.ndarray, df: np.ndarray) -> np.ndarray:
    """(..., cells, cells): Welch–Satterthwaite's df of every pair's difference,
    (V_i + V_j)² / (V_i²/ν_i + V_j²/ν_j); the pair's own df where both variances are 0."""
    vi, vj = var[..., :, None], var[..., None, :]
    di, dj = df[..., :, None], df[..., None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        den = vi**2 / di + vj**2 / dj
        return np.where(den > 0, (vi + vj) ** 2 / den, np.minimum(di, dj))


def pair_df(cells: dict[str, np.ndarray]) -> np.ndarray:
    """(..., cells, cells): the degrees of freedom of every pair's difference of ȳ from the
    cells' columns (scaling.csv's names, arrays with cells last). Two cells of one variance
    pool share its s²: Satterthwaite's ν of (1/n_i + 1/n_j) · σ_a² + w̄_i/n_i + w̄_j/n_j with
    s² counted once; otherwise Welch–Satterthwaite's of the two cells' (Var, ν)."""
    a = {k: np.asarray(v, dtype=float)[..., :, None] for k, v in cells.items()}
    b = {k: np.asarray(v, dtype=float)[..., None, :] for k, v in cells.items()}
    na, nb = a["throughput_n"], b["throughput_n"]
    with np.errstate(invalid="ignore", divide="ignore"):
        within = [(a["within_run_var"] / na, a["within_run_df"]),
                  (b["within_run_var"] / nb, b["within_run_df"])]  # fmt: skip
        shared = combined(
            1 / na + 1 / nb, a["between_run_var"], a["pooled_run_var"], a["pooled_df"], within
        )[1]
    welch = welch_df(np.asarray(cells["throughput_log_var"], float),
                     np.asarray(cells["interval_df"], float))  # fmt: skip
    same = (a["variance_pool"] == b["variance_pool"]) & (a["variance_pool"] >= 0)
    return np.where(same, shared, welch)


def cell_intervals(runs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per cell of `runs` (one row per run: the cell `keys`, `throughput`, NaN unless ok,
    `within_run_var`, `within_run_blocks` and `stratum`, the cell's `stratum_of`), indexed by
    `keys`, the columns CELL_COLUMNS (docs/methods.md defines them) and ci95_rel, the
    relative half-width exp(t·√Var) − 1 of every figure that is a fixed multiple of throughput
    or of its inverse (NaN outside the model). Cells whose runs lack batch means are moderated
    too, with no within-run floor (for the verdicts; their CI stays Student's t on throughput
    itself); a cell of one ok run whose prior gives fewer than MIN_DF df gets none
    (`interval_method` NO_INTERVAL). `pooled_run_var` is the cell's moderated run-to-run
    variance, `pooled_df` its df, `prior_run_var` its stratum's prior; `variance_pool` stays
    empty (tables made before moderation named the pool there)."""
    x = pd.to_numeric(runs["throughput"], errors="coerce")
    ok = runs[(x > 0).to_numpy()]
    by_cell = runs.groupby(keys, sort=True, dropna=False)
    cells = by_cell.size().index
    out = pd.DataFrame(np.nan, index=cells, columns=[*CELL_COLUMNS, "ci95_rel"])
    out["interval_method"] = ""
    out["stratum"] = by_cell["stratum"].first() if "stratum" in runs else ""
    if not len(ok):
        return out
    index = pd.MultiIndex.from_frame(ok[keys]) if len(keys) > 1 else pd.Index(ok[keys[0]])
    codes = pd.Index(cells).get_indexer(index)
    slot = pd.Series(codes).groupby(codes).cumcount().to_numpy()
    y, w, k = (np.full((len(cells), slot.max() + 1), np.nan) for _ in range(3))
    y[codes, slot] = np.log(pd.to_numeric(ok["throughput"]).to_numpy(float))
    w[codes, slot] = pd.to_numeric(ok["within_run_var"], errors="coerce").to_numpy(float)
    k[codes, slot] = pd.to_numeric(ok["within_run_blocks"], errors="coerce").to_numpy(float)
    f = fit(y, w, k, pd.factorize(out["stratum"].fillna(""))[0])
    model = f.steps & np.isfinite(f.var)
    alone = ~f.steps & np.isfinite(f.var)
    single = ~np.isfinite(f.var) & (f.n == 1)
    mine = lambda v: np.where(model | alone, v, np.nan)  # noqa: E731  (of a cell with Var(ȳ))
    out["throughput_log_mean"] = np.where(f.n > 0, f.ybar, np.nan)
    out["throughput_log_var"] = mine(f.var)
    out["interval_df"] = mine(f.vdf)
    out["interval_method"] = np.select([model, alone, single], [STEPS, REPEATS, NO_INTERVAL], "")
    out["within_run_var"] = np.where(f.steps, f.wbar, np.nan)
    out["within_run_df"] = np.where(f.steps, f.wdf, np.nan)
    out["between_run_var"] = mine(f.between)
    out["pooled_run_var"] = mine(f.post)
    out["pooled_df"] = mine(f.vdf)
    out["variance_pool"] = np.nan
    out["prior_run_var"] = np.where(f.n > 0, f.prior2, np.nan)
    out["prior_df"] = float(f.prior_df)
    out["prior_scale"] = float(f.prior_scale)
    out["ci95_rel"] = np.where(model, np.expm1(f.half_width()), np.nan)
    return out


def stratum_of(strategy: str, world_size: int, device: str) -> str:
    """A cell's stratum, the cells whose run-to-run variances share a prior: its framework
    family (torch, tensorflow, horovod, deepspeed; a strategy not in the catalog is its own),
    world size and device kind, e.g. "torch · N=2 · cpu"."""
    row = catalog.STRATEGIES.get(strategy)
    return f"{row.framework if row else strategy} · N={world_size} · {device or 'unknown'}"
