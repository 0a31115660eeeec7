"""The grid search of trainscale.predict's fit: t_fixed and overlap of the exposed time
e = t_fixed + max(0, t_comm − overlap), least squares over a grid of overlaps from 0 to the
largest t_comm (t_fixed ≥ 0 in closed form at each), for many bootstrap resamples at once.

It is the report's costliest numerical step (every family's bootstrap refits, and again for
each leave-one-out check), so the sums are accumulated shape by shape in place: one
(resamples, grid) buffer at a time, not a (resamples, grid, shapes) array and its square.
"""

from __future__ import annotations

import numpy as np


def grid_search(
    tcs: np.ndarray, count: np.ndarray, sum_e: np.ndarray, sum_e2: np.ndarray, points: int
) -> tuple[np.ndarray, np.ndarray]:
    """(t_fixed, overlap) per resample (rows of tcs, t_comm of each (N, nodes) shape), from
    each shape's run count, Σe and Σe² (resamples × shapes), on `points` overlaps."""
    grid = np.linspace(0.0, np.maximum(tcs.max(axis=1), 1e-12), points, axis=1)  # (resamples, grid)
    h1, h2, he = _hidden_sums(tcs, grid, count, sum_e)
    total_e, n_runs = sum_e.sum(1)[:, None], count.sum()
    t_fixed = total_e - h1
    t_fixed /= n_runs
    np.maximum(t_fixed, 0.0, out=t_fixed)
    # Σ over shapes of Σe² − 2(t_fixed + h)·Σe + n·(t_fixed + h)², expanded; in place, in
    # the order of: Σe² − 2·(t_fixed·Σe + he) + (n·t_fixed² + 2·t_fixed·h1 + h2)
    sse = np.multiply(t_fixed, total_e)
    sse += he
    sse *= 2
    np.subtract(sum_e2.sum(1)[:, None], sse, out=sse)
    rest = np.multiply(t_fixed, t_fixed)
    rest *= n_runs
    he = np.multiply(t_fixed, 2, out=he)
    he *= h1
    rest += he
    rest += h2
    sse += rest
    i = np.argmin(sse, axis=1)
    rows = np.arange(len(tcs))
    return t_fixed[rows, i], grid[rows, i]


def _hidden_sums(
    tcs: np.ndarray, grid: np.ndarray, count: np.ndarray, sum_e: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Σ n·h, Σ n·h² and Σ h·Σe over shapes, (resamples, grid) each, with h = max(0, t_comm −
    overlap) the hidden communication of each shape at each grid overlap. Accumulated shape by
    shape in place (a few shapes): one (resamples, grid) buffer, not a (resamples, grid,
    shapes) array and its square, which made this the report's slowest step."""
    h1, h2, he = (np.zeros(grid.shape) for _ in range(3))
    h, tmp = np.empty(grid.shape), np.empty(grid.shape)
    for j in range(tcs.shape[1]):
        np.subtract(tcs[:, j, None], grid, out=h)
        np.maximum(h, 0.0, out=h)
        np.multiply(h, count[j], out=tmp)
        h1 += tmp
        tmp *= h
        h2 += tmp
        np.multiply(h, sum_e[:, j, None], out=tmp)
        he += tmp
    return h1, h2, he
