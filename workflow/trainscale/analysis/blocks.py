"""Runs made in blocks (a tune's rounds): the drift a block's runs share, taken out of the
comparison of cells.

A tune runs a round's cells interleaved, so that a slow or fast spell of the machine falls on
all of them alike. Its records show such spells: a model of cell + round effects put rounds
0.04–0.44 apart in ln throughput (docs/tune.md, "The benchmark"). A comparison of cell means
that ignores them counts that drift as run-to-run noise; blocking by round, as F-Race blocks
by instance (Birattari et al. 2002), removes it. The model is the additive two-way one,
y = μ_cell + ρ_block + e, fitted by least squares over a panel's runs (Scheffé 1959, The
Analysis of Variance, ch. 4: the two-way layout with unequal numbers):

- `adjusted`: y − ρ̂_block. A cell's mean of these is its μ̂, and their deviations from it are
  the model's residuals, so a cell's spread of them is its share of the residual sum of
  squares.
- `df_share`: the residual df, N − rank, is fewer than Σ(n_c − 1) = N − C by the blocks'
  effects (R − 1 of them, R blocks); each cell's n − 1 is scaled by (N − rank) / (N − C), so
  its s² of adjusted runs stays unbiased on average.
- `inflation`: where the cells' runs are not spread over the blocks in proportion, the
  contrasts μ̂_i − μ̂_j vary more than σ²(1/n_i + 1/n_j). Each cell's factor is the most any
  of its contrasts does, so Var(ȳ_i) + Var(ȳ_j) bounds every pair's variance from above.

With one block, or any run's block unknown, nothing changes: `adjusted` is y, the shares and
the factors 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Blocked:
    """The fit's three parts, per cell (cells first, as `fit`'s arrays): see the module."""

    adjusted: np.ndarray
    df_share: np.ndarray
    inflation: np.ndarray


def unblocked(y: np.ndarray) -> Blocked:
    """y as it is: no block effects (any leading axes)."""
    ones = np.ones(y.shape[:-1])
    return Blocked(y, ones, ones)


def fit(y: np.ndarray, blocks: np.ndarray) -> Blocked:
    """The additive model of `y` (cells, runs; NaN where a cell has no such run) on `blocks`
    (the same shape: each run's block number; NaN where unknown)."""
    have = np.isfinite(y)
    if not have.any() or not np.isfinite(blocks[have]).all():
        return unblocked(y)
    levels, block = np.unique(blocks[have], return_inverse=True)
    if len(levels) < 2:
        return unblocked(y)
    cell = np.nonzero(have)[0]
    cells = np.unique(cell)
    counts = np.zeros((y.shape[0], len(levels)))
    np.add.at(counts, (cell, block), 1.0)
    design = np.hstack([np.eye(y.shape[0])[cell][:, cells],
                        np.eye(len(levels))[block][:, 1:]])  # fmt: skip
    coef, _, rank, _ = np.linalg.lstsq(design, y[have], rcond=None)
    rho = np.concatenate([[0.0], coef[len(cells) :]])
    rho -= np.average(rho, weights=counts.sum(0))  # centred on the runs: ȳ stays near the raw
    adjusted = np.full(y.shape, np.nan)
    adjusted[have] = y[have] - rho[block]
    residual_df, cell_df = have.sum() - rank, have.sum() - len(cells)
    share = np.full(y.shape[0], residual_df / cell_df if cell_df > 0 else 1.0)
    return Blocked(adjusted, share, inflation(counts))


def inflation(counts: np.ndarray) -> np.ndarray:
    """Per cell, the most Var(μ̂_i − μ̂_j) / (σ²(1/n_i + 1/n_j)) of its contrasts with the other
    cells that have runs, from the cells' information after the blocks are profiled out,
    M = diag(n) − N diag(m)⁻¹ Nᵀ (N the cells × blocks counts, m the blocks' runs), whose
    pseudo-inverse is the contrasts' covariance in units of σ²; at least 1."""
    n, m = counts.sum(1), counts.sum(0)
    ran = n > 0
    info = np.diag(n[ran]) - (counts[ran] / m) @ counts[ran].T
    cov = np.linalg.pinv(info)
    d = np.diag(cov)
    pair = d[:, None] + d[None, :] - 2 * cov
    simple = 1 / n[ran][:, None] + 1 / n[ran][None, :]
    ratio = np.where(np.eye(len(d), dtype=bool), 1.0, pair / simple)
    out = np.ones(len(n))
    out[ran] = np.maximum(ratio.max(1), 1.0)
    return out
