"""What a study can tell: the smallest difference a panel of the ranking resolves, how many
repeats would resolve 5 % and 2 %, and whether a cell is equivalent to the fastest.

Not post-hoc power: a tie is not "N repeats would settle it" (that treats the observed
difference as the true one, and where the truth is 0 no number of repeats settles anything),
but what the study resolves: "not told apart: this study resolves differences of ≥ 18 %;
6 repeats would resolve ≥ 5 %". And "equivalent" only by an equivalence test (TOST) against a
stated margin (config `report.equivalence`), never from a point estimate. The definitions are
the terms "what a study can tell" and "equivalent" of docs/methods.md (the report's Methods);
the ranking (`trainscale.analysis.ranking`) applies them.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from trainscale.analysis.best import LEVEL, simultaneous
from trainscale.analysis.interval import NO_INTERVAL, t_scalar

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
    "95 % intervals, the panel's own Monte-Carlo critical value; each cell's run-to-run "
    "variance moderated toward its stratum's, no pretest); simulated with 2 repeats: some cell "
    "of 13 equal ones called slower in 0.7 % of panels, 2.9 % with one small stratum at 6 % "
    "among 1 % ones (Bartlett's pretest, before: 29.8 %); a true 10 % difference called in "
    "11.8 % (68 % at 4 repeats, 95 % at 6) (Methods: comparison with the best)"
)


#: TOST's level: each one-sided test at 5 %, every pair at once (the intervals at 90 %).
TOST_LEVEL = 0.90


@functools.cache
def panel_value(cells: int, df: float, level: float = LEVEL) -> float:
    """The simultaneous critical value at `level` of a panel of `cells` cells of equal
    variance on `df` degrees of freedom each (`best.simultaneous`, cached)."""
    if cells < 2 or not df >= 1:
        return math.nan
    ones = np.ones(cells)
    return float(simultaneous(ones, np.full(cells, float(df)), ones > 0, level))


def detectable(cells: int, var: float, df: float, level: float = LEVEL) -> float:
    """The log difference from the best that a pair of variance `var` (the pair's: V_i + V_j)
    is called slower at in POWER of studies, among `cells` cells whose variances have `df`
    degrees of freedom each: (c + t(POWER, df)) · √var, c the comparison's value for such a
    panel at `level` (`panel_value`)."""
    if cells < 2 or not df >= 1 or not var >= 0:
        return math.nan
    return (panel_value(cells, math.floor(df), level) + t_scalar(df, POWER)) * math.sqrt(var)


def resolution(var: np.ndarray, df: np.ndarray, n: np.ndarray, margin: float = EQUIVALENCE) -> dict:
    """A panel's `mdd_rel` (the smallest shortfall 1 − x/x_best it resolves: `detectable`
    as a fraction), `repeats_for_5pct` and `repeats_for_2pct` (the fewest repeats per cell
    that would bring it to 5 % and 2 %; NaN beyond MAX_REPEATS) and `repeats_for_equivalence`
    (the fewest at which TOST at ±`margin` can succeed: c · √(2 V) < ln(1 + margin)), from
    its compared cells' Var(ȳ), df and repeats: the df the comparison uses. A pair of the panel's
    typical cell: Var = 2 · the median Var(ȳ); at n repeats the median cell's per-run variance
    n₀ · Var(ȳ) over n, on the median df plus (n − n₀): a cell's df is its prior's d₀ plus its
    own n − 1, so one more per repeat."""
    var, df, n = (np.asarray(a, dtype=float) for a in (var, df, n))
    cells = len(var)
    keys = ("mdd_rel", "repeats_for_5pct", "repeats_for_2pct", "repeats_for_equivalence")
    out = dict.fromkeys(keys, math.nan)
    if cells < 2:
        return out
    v, nu, n0 = float(np.median(var)), float(np.median(df)), float(np.median(n))

    def at(reps: float) -> tuple[float, float]:  # (the pair's Var, the cells' df) at reps
        return 2 * v * n0 / reps, nu + (reps - n0)

    out["mdd_rel"] = -math.expm1(-detectable(cells, *at(n0)))
    for target, key in zip(TARGETS, keys[1:3], strict=True):
        out[key] = fewest(lambda reps, t=target: detectable(cells, *at(reps)) <= -math.log1p(-t))
    tost = lambda reps: tost_reach(cells, *at(reps)) < math.log1p(margin)  # noqa: E731
    out["repeats_for_equivalence"] = fewest(tost)
    return out


def repeats_to_resolve(
    var: np.ndarray,
    df: np.ndarray,
    n: np.ndarray,
    gaps: np.ndarray,
    top: int,
    compared: np.ndarray,
    level: float = LEVEL,
) -> np.ndarray:
    """Per cell, the fewest repeats (of it and of the panel's fastest, cell `top`) that
    resolve its log shortfall in `gaps` (the size observed, not a claim that it is the true
    one), among the `compared` cells at the comparison's `level`: from the pair's own Var(ȳ),
    moderated as the comparison reads them, not the panel's median, so a noisy cell says it
    needs more. At r repeats the
    pair's variance is (V_i n_i + V_top n_top) / r, on the smaller of the two cells' df, each
    grown by one a repeat (a cell's df is its prior's d₀ plus its own n − 1). NaN for the
    fastest, a cell not behind it or not compared, and beyond MAX_REPEATS."""
    var, df, n, gaps = (np.asarray(a, dtype=float) for a in (var, df, n, gaps))
    cells = int(np.sum(compared))

    def met(i: int, reps: float) -> bool:
        pair_var = (var[i] * n[i] + var[top] * n[top]) / reps
        nu = min(df[i] + reps - n[i], df[top] + reps - n[top])
        return detectable(cells, pair_var, nu, level) <= gaps[i]

    out = np.full(len(gaps), math.nan)
    for i in np.flatnonzero(np.asarray(compared, bool) & (gaps > 0)):
        if i != top:
            out[i] = fewest(lambda reps, i=i: met(i, reps))
    return out


def tost_reach(cells: int, var: float, df: float) -> float:
    """How far TOST's interval of a pair of variance `var` reaches: c · √var, c the panel's
    simultaneous value at TOST_LEVEL."""
    return panel_value(cells, math.floor(df), TOST_LEVEL) * math.sqrt(var) if df >= 1 else math.nan


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


def equivalent(d: np.ndarray, var: np.ndarray, c: float | np.ndarray, margin: float) -> np.ndarray:
    """TOST, the one test of equivalence here (the ranking, a study's repeats, the tune's
    race): a log difference `d` (variance `var`) is equivalent to 0 within ±`margin` when
    d ± c · √var lies inside ±ln(1 + margin) (False where any is missing). `c` is the
    critical value of each one-sided test: the ranking's is the panel's simultaneous value at
    TOST_LEVEL, whose intervals hold for every pair at once, so for a fastest picked from the
    data too; the race's a t quantile per pair at its look's level (an array)."""
    with np.errstate(invalid="ignore"):
        return np.abs(d) + c * np.sqrt(var) < math.log1p(margin)


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
    text = f"not told apart: {resolves(r.mdd_rel, r.repeats_for_5pct)}"
    return text + needs(r.behind, r.repeats_to_resolve)


def needs(behind: float, reps: float) -> str:
    """ "; a 31 % shortfall (as observed) needs 5 repeats": what would resolve a cell left
    unresolved, by the size of its own observed shortfall."""
    if not behind > 0:
        return ""
    if not np.isfinite(reps):
        return f"; a {pct(behind)} shortfall (as observed) needs more than {MAX_REPEATS} repeats"
    return f"; a {pct(behind)} shortfall (as observed) needs {int(reps)} repeats"
