"""Blocking by round (`trainscale.analysis.blocks`): the additive model's round effects, the
residual df and the variance a contrast gains where rounds are unbalanced."""

from __future__ import annotations

import numpy as np

from trainscale.analysis import blocks, interval

NAN = np.nan


def test_a_drift_shared_by_a_rounds_runs_is_taken_out():
    """Two cells, three rounds; each round moves both alike: the adjusted runs differ by the
    cells' gap alone, and the residual df are Σ(n − 1) less the 2 rounds' effects."""
    mu, drift = np.array([[0.0], [-0.1]]), np.array([0.0, 0.3, -0.2])
    rounds = np.array([[1, 1, 2, 3], [1, 1, 2, 3]], float)
    y = mu + drift[(rounds - 1).astype(int)] + np.array([[0.01, -0.01, 0.0, 0.0]] * 2)
    fit = blocks.fit(y, rounds)
    assert np.allclose(fit.adjusted[0] - fit.adjusted[1], 0.1)
    assert np.ptp(fit.adjusted[0]) < 0.03  # the drift of 0.5 is gone; the ±0.01 noise stays
    assert np.allclose(fit.df_share, (8 - 2 - 2) / (8 - 2))
    assert np.allclose(fit.inflation, 1.0)  # every round holds both cells in proportion


def test_unequal_runs_in_a_round_widen_the_contrasts():
    """A cell with three runs in round 2 and one in round 1 against one with two and two: the
    contrast's variance is more than σ²(1/n_i + 1/n_j), and each cell's factor says by how much."""
    rounds = np.array([[1, 2, 2, 2], [1, 1, 2, 2]], float)
    fit = blocks.fit(np.zeros((2, 4)), rounds)
    runs = [(c, r) for c in range(2) for r in rounds[c]]  # the design: μ_0, μ_1, ρ_2
    x = np.array([[c == 0, c == 1, r == 2] for c, r in runs], float)
    contrast = np.array([1.0, -1.0, 0.0])
    exact = contrast @ np.linalg.inv(x.T @ x) @ contrast  # Var(μ̂_0 − μ̂_1) / σ², 15/28
    assert np.allclose(fit.inflation, exact / (1 / 4 + 1 / 4))
    assert (fit.inflation > 1).all()


def test_without_rounds_or_with_one_the_fit_is_the_plain_one():
    rng = np.random.default_rng(1)
    y = rng.normal(0, 0.1, (3, 4))
    w, k = np.full_like(y, 0.0004), np.full_like(y, 8.0)
    plain = interval.fit(y, w, k)
    for rounds in (np.ones_like(y), np.full_like(y, NAN)):
        same = interval.fit(y, w, k, None, rounds)
        assert np.allclose(same.var, plain.var) and np.allclose(same.ybar, plain.ybar)
