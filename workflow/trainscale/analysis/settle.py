"""What a study can tell: the smallest difference a panel of the ranking resolves, how many
repeats would resolve 5 % and 2 %, and whether a cell is equivalent to the fastest.

Not post-hoc power: a tie is not "N repeats would settle it" (that treats the observed
difference as the true one, and where the truth is 0 no number of repeats settles anything),
but what the study resolves: "not told apart: this study resolves differences of ≥ 18 %;
6 repeats would resolve ≥ 5 %". And "equivalent" only by an equivalence test (TOST) against a
stated margin (config `report.equivalence`), never from a point estimate. The definitions are
the bullets "what a study can tell" and "equivalent" of `trainscale.analysis.aggregate`'s
docstring (the report's Methods); the ranking (`trainscale.analysis.ranking`) applies them.
"""

from __future__ import annotations

import math

import numpy as np

from trainscale.analysis.best import critical_value, df_floor
from trainscale.analysis.interval import NO_INTERVAL, t_quantile, t_scalar

#: The power at which a difference counts as resolved.
POWER = 0.80
#: Repeats per cell never asked beyond.
MAX_REPEATS = 100
#: The differences `resolution` asks the repeats for (fractions of the fastest's throughput).
TARGETS = (0.05, 0.02)
#: config `report.equivalence`'s default: the equivalence margin, a fraction.
EQUIVALENCE = 0.02
#: summary.txt's line on the method and its simulated error rates (tests/test_best.py prints
#: them; Methods: comparison with the best).
METHOD = (
    "fastest sets: every cell of a panel against the best of the others at once (simultaneous "
    "95 % intervals, the studentized range's critical value; run-to-run variance pooled over "
    "alike strata); simulated with 2 repeats: some cell of 14 equal ones called slower in "
    "2.5 % of studies (a test of each against the fastest at 5 %: 68 %), a true 10 % "
    "difference called in 34 % (Methods: comparison with the best)"
)


def detectable(cells: int, var: float, df: float) -> float:
    """The log difference from the best that a pair of variance `var` and `df` degrees of
    freedom is called slower at in POWER of studies, among `cells` cells compared:
    (c(cells, ν) + t(POWER, ν)) · √var, c the comparison with the best's critical value."""
    nu = float(df_floor(df))
    if cells < 2 or not nu >= 1 or not var >= 0:
        return math.nan
    return (critical_value(cells, nu) + t_scalar(nu, POWER)) * math.sqrt(var)


def resolution(var: np.ndarray, df: np.ndarray, n: np.ndarray, pooled: np.ndarray) -> dict:
    """A panel's `mdd_rel` (the smallest shortfall 1 − x/x_best it resolves: `detectable`
    as a fraction), `repeats_for_5pct` and `repeats_for_2pct` (the fewest repeats per cell
    that would bring it to 5 % and 2 %; NaN beyond MAX_REPEATS), from its compared cells'
    Var(ȳ), df, repeats and cells pooled (NaN outside a pool: 1). A pair of the panel's
    typical cell: Var = 2 · the median Var(ȳ); at n repeats the median cell's per-run variance
    n₀ · Var(ȳ) over n, and the median df plus (n − n₀) for every cell pooled with it."""
    var, df, n = (np.asarray(a, dtype=float) for a in (var, df, n))
    cells = len(var)
    out = dict.fromkeys(("mdd_rel", "repeats_for_5pct", "repeats_for_2pct"), math.nan)
    if cells < 2:
        return out
    v, nu, n0 = float(np.median(var)), float(np.median(df)), float(np.median(n))
    m = float(np.nanmedian(np.where(np.isfinite(pooled), pooled, 1.0)))

    def mdd(reps: float) -> float:
        return detectable(cells, 2 * v * n0 / reps, nu + (reps - n0) * m)

    out["mdd_rel"] = -math.expm1(-mdd(n0))
    for target, key in zip(TARGETS, ("repeats_for_5pct", "repeats_for_2pct"), strict=True):
        out[key] = fewest(lambda reps, t=target: mdd(reps) <= -math.log1p(-t))
    return out


def fewest(met) -> float:
    """The fewest repeats in 2..MAX_REPEATS for which `met(repeats)` (true from some count
    on), by bisection; NaN where not even MAX_REPEATS do."""
    if not met(MAX_REPEATS):
        return math.nan
    lo, hi = 1, MAX_REPEATS  # met(hi); lo stands for "too few" (one repeat: no df)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if met(mid) else (mid, hi)
    return float(hi)


def equivalent(d: np.ndarray, var: np.ndarray, df: np.ndarray, margin: float) -> np.ndarray:
    """TOST at 5 %: a log difference `d` (variance `var`, `df` degrees of freedom) is
    equivalent to 0 within ±`margin` when its 90 % interval, d ± t(0.95, ν) · √var, lies
    inside ±ln(1 + margin) (False where any is missing)."""
    with np.errstate(invalid="ignore"):
        return np.abs(d) + t_quantile(df, 0.95) * np.sqrt(var) < math.log1p(margin)


def pct(fraction: float) -> str:
    """18 %, 4.5 %, 0.8 %: two significant digits below 10 %."""
    v = 100 * fraction
    return f"{v:.0f} %" if v >= 9.5 else f"{v:.2g} %"


def resolves(mdd_rel: float, reps5: float) -> str:
    """ "this study resolves differences of ≥ 18 %; 6 repeats would resolve ≥ 5 %"."""
    if not np.isfinite(mdd_rel):
        return "too few cells with an interval to resolve any difference"
    text = f"this study resolves differences of ≥ {pct(mdd_rel)}"
    if mdd_rel <= TARGETS[0]:
        return text
    if not np.isfinite(reps5):
        return f"{text}; more than {MAX_REPEATS} repeats would be needed for 5 %"
    return f"{text}; {int(reps5)} repeats would resolve ≥ 5 %"


def verdict_text(r, margin: float) -> str:
    """What a ranked cell's row says beside its place (a row of the ranking): slower, one run
    without an interval, equivalent, or not told apart and what the study resolves."""
    if r.fastest:
        return ""
    if r.slower:
        return "slower than the fastest (95 %, simultaneous)"
    if r.interval_method == NO_INTERVAL or not np.isfinite(r.mcb_high):
        return NO_INTERVAL if r.interval_method == NO_INTERVAL else "no interval"
    if r.equivalent:
        return f"equivalent to the fastest within ±{pct(margin)} (TOST)"
    return f"not told apart: {resolves(r.mdd_rel, r.repeats_for_5pct)}"
