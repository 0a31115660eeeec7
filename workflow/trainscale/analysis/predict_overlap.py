"""The least-squares fit of t_fixed and overlap in trainscale.analysis.predict: the exposed time of
each measured run, e = t_fixed + max(0, t_comm − overlap), with t_fixed ≥ 0 and overlap
between 0 and the largest t_comm, solved exactly for many bootstrap resamples at once.

Why exact and not a grid: the hidden communication h_j(o) = max(0, t_comm_j − o) of each
(N, nodes) shape j is linear in the overlap o between consecutive t_comm values, and t_fixed,
at its optimum for a given o, is max(0, (Σe − Σ n_j·h_j) / n). The sum of squares is
therefore a quadratic in o on each of a few pieces, and its minimum lies at a piece's end, at
the point where t_fixed reaches 0, or at a quadratic's stationary point. Evaluating those
candidates (about four per shape) finds the optimum a 2,000-point grid only approached, at a
hundredth of the cost: this was the report's costliest numerical step (every family's
bootstrap refits, again for each leave-one-out check).
"""

from __future__ import annotations

import numpy as np


def fit_overlap(
    tcs: np.ndarray, count: np.ndarray, sum_e: np.ndarray, sum_e2: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(t_fixed, overlap) per resample (rows of tcs, t_comm of each (N, nodes) shape), from
    each shape's run count, Σe and Σe² (resamples × shapes). Among equally good overlaps the
    smallest is taken (with one multi-worker shape fully exposed, t_fixed and overlap trade
    off one for one)."""
    candidates = _candidates(tcs, count, sum_e)
    sse, t_fixed = _sse(tcs, count, sum_e, sum_e2, candidates)
    best = sse.min(axis=1, keepdims=True)
    tol = 1e-12 * np.maximum(sum_e2.sum(axis=1, keepdims=True), 1e-300)
    i = np.argmax(sse <= best + tol, axis=1)  # the first (smallest overlap) within rounding
    rows = np.arange(len(tcs))
    return t_fixed[rows, i], candidates[rows, i]


def _candidates(tcs: np.ndarray, count: np.ndarray, sum_e: np.ndarray) -> np.ndarray:
    """Every overlap where the sum of squares can be least, ascending (resamples × points):
    0, each t_comm, and on each piece between consecutive t_comm values the stationary points
    of its two quadratics (t_fixed at 0, t_fixed free) and the overlap where t_fixed reaches 0,
    each clipped into its piece."""
    top = np.maximum(tcs.max(axis=1, keepdims=True), 1e-12)
    ends = np.sort(np.concatenate([np.zeros((len(tcs), 1)), np.minimum(tcs, top)], axis=1), 1)
    lo, hi = ends[:, :-1], ends[:, 1:]  # (resamples, pieces)
    active = tcs[:, None, :] >= hi[:, :, None]  # shapes still hiding communication on a piece
    n_all, s_all = count.sum(), sum_e.sum(axis=1, keepdims=True)
    n_a = (active * count).sum(axis=2)
    a1 = (active * (count * tcs)[:, None, :]).sum(axis=2)  # Σ n_j·t_comm_j over active j
    s_a = (active * sum_e[:, None, :]).sum(axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        at_zero = (a1 - s_a) / n_a  # t_fixed clamped at 0
        reach_zero = (a1 - s_all) / n_a  # (Σe − Σ n·h) / n = 0
        curvature = n_a - n_a * n_a / n_all
        slope = (s_a - a1) - n_a * (s_all - a1) / n_all
        free = -slope / curvature  # t_fixed = (Σe − Σ n·h) / n
    points = [np.clip(np.nan_to_num(p, nan=0.0, posinf=0.0, neginf=0.0), lo, hi)
              for p in (at_zero, reach_zero, free)]  # fmt: skip
    return np.sort(np.concatenate([ends, *points], axis=1), axis=1)


def _sse(
    tcs: np.ndarray, count: np.ndarray, sum_e: np.ndarray, sum_e2: np.ndarray, o: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(sum of squares, t_fixed) at each candidate overlap o (resamples × points): the sums
    over runs reduce to sums over shapes of n_j, Σe_j and Σe²_j, since every run of a shape
    hides the same h_j."""
    h = np.maximum(tcs[:, None, :] - o[:, :, None], 0.0)  # (resamples, points, shapes)
    h1 = (h * count).sum(axis=2)
    h2 = (h * h * count).sum(axis=2)
    he = (h * sum_e[:, None, :]).sum(axis=2)
    total_e, n_runs = sum_e.sum(axis=1, keepdims=True), count.sum()
    t_fixed = np.maximum((total_e - h1) / n_runs, 0.0)
    sse = (
        sum_e2.sum(axis=1, keepdims=True)
        - 2 * (t_fixed * total_e + he)
        + n_runs * t_fixed * t_fixed
        + 2 * t_fixed * h1
        + h2
    )
    return sse, t_fixed
