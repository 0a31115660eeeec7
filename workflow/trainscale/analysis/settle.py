"""Two cells of a study: whether their throughputs are told apart at 95%, and, where they are
not, what would tell them apart: more repeats, or more steady steps per run.

The definitions are the bullets "distinguishable" and "what would settle it" of
`trainscale.analysis.aggregate`'s docstring (the report's Methods); the cells' model columns come
from `trainscale.analysis.interval`. The ranking (fastest against each other cell), the summary's
runner-up and the coverage test (tests/test_interval.py) all decide through `told_apart`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from trainscale.analysis.interval import CELL_COLUMNS, STEPS, combined, t_quantile, t_scalar

#: Below this relative difference a pair is within the harness's resolution.
RESOLUTION = 0.01
#: The power "what would settle it" asks for, at the 95% level.
POWER = 0.80
#: Repeats per cell, and the factor on the steady steps, never asked beyond.
MAX_REPEATS = 100
MAX_STEPS_FACTOR = 100
#: The words where the observed difference is below RESOLUTION.
BELOW = "below the harness's resolution (< 1 %)"


def told_apart(d: np.ndarray, var: np.ndarray, df: np.ndarray) -> np.ndarray:
    """Whether a log difference `d` of variance `var` is told apart from 0 at 95%:
    |d| > t(0.975, df) · √var (False where any is missing)."""
    with np.errstate(invalid="ignore"):
        return np.abs(d) > t_quantile(df) * np.sqrt(var)


def _numbers(frame: pd.DataFrame, column: str) -> np.ndarray:
    return pd.to_numeric(frame[column], errors="coerce").to_numpy(float)


def verdicts(best: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """Row by row (the frames aligned, each a scaling table's rows), whether `other` is told
    apart from `best`, and for a pair that is not, what would settle it: `distinguishable`
    (True, False, None where either lacks an interval), `repeats_needed`,
    `steps_factor_needed` and `settle` (the words). A scaling table made before the model's
    columns gets the rule it had: the two 95% CIs disjoint."""
    out = pd.DataFrame(index=other.index)
    out["repeats_needed"], out["steps_factor_needed"], out["settle"] = np.nan, np.nan, ""
    if not all(c in best and c in other for c in CELL_COLUMNS):
        lo = best["throughput_mean"] - best["throughput_ci95"]
        hi = other["throughput_mean"] + other["throughput_ci95"]
        apart = (lo > hi).astype(object)
        apart[lo.isna() | hi.isna()] = None
        out["distinguishable"] = apart
        return out
    cols = [c for c in CELL_COLUMNS if c != "interval_method"] + ["throughput_n"]
    a = {c: _numbers(best, c) for c in cols}
    b = {c: _numbers(other, c) for c in cols}
    model = (best["interval_method"] == STEPS).to_numpy() & (
        other["interval_method"] == STEPS
    ).to_numpy()
    var, df = pair_variance(a, b, model)
    d = np.abs(a["throughput_log_mean"] - b["throughput_log_mean"])
    apart = told_apart(d, var, df)
    known = np.isfinite(d) & np.isfinite(var) & (df >= 1)
    out["distinguishable"] = pd.Series(apart, index=out.index).astype(object).where(known, None)
    reps, factors = np.full(len(d), np.nan), np.full(len(d), np.nan)
    words = [""] * len(d)
    for i in np.flatnonzero(known & ~apart):
        if d[i] < math.log1p(RESOLUTION):
            words[i] = BELOW
            continue
        ai, bi = ({k: v[i] for k, v in side.items()} for side in (a, b))
        reps[i] = repeats_needed(d[i], ai, bi, model[i])
        factor = steps_factor(d[i], ai, bi) if model[i] else None
        factors[i] = np.nan if factor is None else factor
        words[i] = settle_text(reps[i], factor, model[i])
    out["repeats_needed"], out["steps_factor_needed"], out["settle"] = reps, factors, words
    return out


def pair_variance(a: dict, b: dict, model: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Var, ν) of ȳ_a − ȳ_b. Both cells in the model: Var_a + Var_b, ν by Satterthwaite with
    the one σ_a² estimate they share; otherwise Welch–Satterthwaite of each side's (Var, ν)."""
    na, nb = a["throughput_n"], b["throughput_n"]
    shared = combined(
        1 / na + 1 / nb,
        a["between_run_var"],
        a["pooled_run_var"],
        a["pooled_df"],
        [(a["within_run_var"] / na, a["within_run_df"]),
         (b["within_run_var"] / nb, b["within_run_df"])],
    )  # fmt: skip
    va, vb = a["throughput_log_var"], b["throughput_log_var"]
    with np.errstate(invalid="ignore", divide="ignore"):
        welch = (va + vb) ** 2 / (va**2 / a["interval_df"] + vb**2 / b["interval_df"])
    return np.where(model, shared[0], va + vb), np.where(model, shared[1], welch)


def _needs(df: float) -> float:
    """t(0.975, df) + t(POWER, df): the separation, in standard errors, at which a true
    difference is told apart at 95% in POWER of studies."""
    return t_scalar(df) + t_scalar(df, POWER)


def repeats_needed(d: float, a: dict, b: dict, model: bool) -> float:
    """The fewest repeats n per cell at which a true difference `d` is told apart in POWER of
    studies: (t(0.975, ν) + t(0.80, ν)) · √Var(n) ≤ d, the variances as observed. In the
    model Var(n) is the pair's at n runs a cell, the pooled df that of the pool's cells with n
    runs each and each w̄'s df n/n_now as many; outside it (u_a + u_b)/n, u a cell's per-run
    variance n · Var(ȳ), with 2(n − 1) df. NaN beyond MAX_REPEATS. Var(n) falls and the df
    grow with n, so the first n that does is found by bisection."""
    na, nb = a["throughput_n"], b["throughput_n"]

    def met(n: int) -> bool:
        if model:
            var, df = combined(
                2 / n,
                a["between_run_var"],
                a["pooled_run_var"],
                a["interval_pool"] * (n - 1),
                [(a["within_run_var"] / n, a["within_run_df"] * n / na),
                 (b["within_run_var"] / n, b["within_run_df"] * n / nb)],
            )  # fmt: skip
        else:
            var = (a["throughput_log_var"] * na + b["throughput_log_var"] * nb) / n
            df = 2.0 * (n - 1)
        return bool(_needs(float(df)) * math.sqrt(var) <= d)

    if not met(MAX_REPEATS):
        return math.nan
    lo, hi = 1, MAX_REPEATS  # met(hi); not met(lo), as one repeat has no df
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if met(mid) else (mid, hi)
    return float(hi)


def steps_factor(d: float, a: dict, b: dict) -> float | None:
    """The fewest times m as many steady steps per run at which `d` is told apart in POWER of
    studies at today's repeats: each w̄ / m (as many blocks, so the same df) and the pooled s²
    σ_a² + (s² − σ_a²) / m; None where the between-run part alone already prevents it (more
    steps cannot), NaN beyond MAX_STEPS_FACTOR."""
    na, nb = a["throughput_n"], b["throughput_n"]
    c = 1 / na + 1 / nb
    between, df = a["between_run_var"], a["pooled_df"]
    rest = max(a["pooled_run_var"] - between, 0.0)  # the pooled w̄ in s²

    def met(m: float) -> bool:
        within = [(a["within_run_var"] / (na * m), a["within_run_df"]),
                  (b["within_run_var"] / (nb * m), b["within_run_df"])]  # fmt: skip
        s2 = between + rest / m
        var, nu = combined(c, between, s2, df, [] if m == math.inf else within)
        return bool(var <= 0 or _needs(float(nu)) * math.sqrt(var) <= d)

    if not met(math.inf):
        return None
    return next((float(m) for m in range(2, MAX_STEPS_FACTOR + 1) if met(m)), math.nan)


def settle_text(reps: float, factor: float | None, model: bool) -> str:
    """ "6 repeats would settle it, or 3× the steady steps per run"; `short` gives the figure's
    mark, the words before the first comma or semicolon."""
    text = (
        f"{int(reps)} repeats would settle it"
        if np.isfinite(reps)
        else f"more than {MAX_REPEATS} repeats would be needed"
    )
    if not model:
        return text
    if factor is None:
        return f"{text}; more steps cannot: run-to-run spread dominates"
    if not np.isfinite(factor):
        return f"{text}, or more than {MAX_STEPS_FACTOR}× the steady steps per run"
    return f"{text}, or {int(factor)}× the steady steps per run"


def short(settle: str) -> str:
    """The figure's mark of a `settle` text: its first clause ("below resolution (< 1 %)")."""
    if settle == BELOW:
        return "below resolution (< 1 %)"
    return settle.split(";")[0].split(", or")[0]
