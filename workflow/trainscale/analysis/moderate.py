"""Moderated run-to-run variances: every cell keeps its own, drawn toward a prior (empirical
Bayes, as limma's `squeezeVar` does; Smyth 2004), with no pretest of equal variances.

Two levels: the strata's pooled variances are drawn toward the study's prior, then each cell's
own toward its stratum's. At each level the prior's degrees of freedom d₀ and scale s₀² are
fitted by the method of moments on the log variances (`fit_prior`, limma's `fitFDist`), and
d₀ is capped at PRIOR_DF: with cells of one or two runs the fitted d₀ is infinite in about half
of simulated studies, and a noisy cell squeezed onto quiet ones under-covers as pooling did.
The posterior variance is (d₀ s₀² + d s²) / (d₀ + d) on d₀ + d degrees of freedom. Methods:
docs/metrics.md, "confidence interval"; simulated error rates: tests/test_moderate.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The cap on the prior's degrees of freedom at each level (the fitted d₀ is reported as is).
PRIOR_DF = 3.0


@dataclass(frozen=True)
class Prior:
    """A fitted prior per study (arrays over the leading axes): `df` the fitted d₀ (inf where
    the variances spread no more than sampling explains), `scale2` s₀²."""

    df: np.ndarray
    scale2: np.ndarray


#: Bernoulli numbers B₂ … B₁₄, for the asymptotic series of ψ and its derivatives.
_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6)
#: ψ's series are used from here up (the recurrences carry smaller arguments up to it): the
#: first term left out is below 1e-16 of the value.
_SERIES_FROM = 10.0


def polygamma(n: int, x: np.ndarray) -> np.ndarray:
    """ψ (n = 0), ψ′ (1) or ψ″ (2) of x > 0: the recurrence up to _SERIES_FROM, then the
    asymptotic series. scipy.special's polygamma gives the same to 1e-13; importing it took
    half a second of every report, for a few hundred values."""
    shape = np.shape(x)
    x = np.asarray(x, dtype=float).ravel()
    low = np.zeros_like(x)  # ψ⁽ⁿ⁾(x) − ψ⁽ⁿ⁾(x + shift), summed while shifting x up
    k = np.arange(1, len(_BERNOULLI) + 1)[:, None]
    b = np.array(_BERNOULLI)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        while (small := x < _SERIES_FROM).any():
            low += np.where(small, (-1 / x, 1 / x**2, -2 / x**3)[n], 0.0)
            x = np.where(small, x + 1, x)
        inv = 1 / x
        if n == 0:
            series = np.log(x) - inv / 2 - (b / (2 * k) * inv ** (2 * k)).sum(0)
        elif n == 1:
            series = inv + inv**2 / 2 + (b * inv ** (2 * k + 1)).sum(0)
        else:
            series = -(inv**2) - inv**3 - ((2 * k + 1) * b * inv ** (2 * k + 2)).sum(0)
    return (series + low).reshape(shape)


def trigamma_inverse(x: np.ndarray) -> np.ndarray:
    """y with ψ′(y) = x, x > 0, by Newton's method from 0.5 + 1/x (limma's start)."""
    y = 0.5 + 1 / x
    for _ in range(50):
        tri = polygamma(1, y)
        step = tri * (1 - tri / x) / polygamma(2, y)
        y = y + step
        if np.all(-step / y < 1e-8):
            break
    return y


def fit_prior(s2: np.ndarray, df: np.ndarray) -> Prior:
    """d₀ and s₀² of the scaled-χ² prior of variances `s2` on `df` degrees of freedom (cells
    last; a cell with df 0, s² ≤ 0 or s² NaN is left out): d₀ by limma's moments, the variance
    of e = ln s² − ψ(d/2) + ln(d/2) matched to ψ′(d₀/2) plus the mean ψ′(d/2); s₀² the pooled
    Σ d s² / Σ d, not limma's exp(mean e), which over a handful of 1-df variances comes out
    about twice σ² (the mean of a few logs is far from the log of the mean). Where fewer than
    two cells enter, d₀ is 0 (NaN s₀² without one)."""
    ok = (df > 0) & (s2 > 0) & np.isfinite(s2)
    m = ok.sum(-1)
    half = np.where(ok, df, 2.0) / 2
    e = np.where(ok, np.log(np.where(ok, s2, 1.0)) - polygamma(0, half) + np.log(half), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = e.sum(-1) / m
        spread = np.where(ok, (e - mean[..., None]) ** 2, 0.0).sum(-1) / (m - 1)
        excess = spread - np.where(ok, polygamma(1, half), 0.0).sum(-1) / m
        d0 = np.where(excess > 0, 2 * trigamma_inverse(np.where(excess > 0, excess, 1.0)), np.inf)
        pooled = np.where(ok, s2 * df, 0.0).sum(-1) / np.where(ok, df, 0.0).sum(-1)
    return Prior(np.where(m < 2, 0.0, d0), pooled)


def squeeze(s2: np.ndarray, df: np.ndarray, prior2: np.ndarray, d0: np.ndarray) -> np.ndarray:
    """The posterior variance (d₀ s₀² + d s²) / (d₀ + d): `s2` on `df` drawn toward `prior2`
    with d₀ = `d0` (a cell without its own df takes the prior; NaN where neither has any)."""
    own = np.where(df > 0, np.nan_to_num(s2) * df, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (d0 * prior2 + own) / (d0 + df)


@dataclass(frozen=True)
class Moderated:
    """Per cell (cells last): `post` the moderated per-run variance, `df` its d₀ + d,
    `prior2` the stratum's variance it was drawn toward; per study: `prior` the cell level's
    fitted prior (d₀ before the cap) and `study` the strata level's."""

    post: np.ndarray
    df: np.ndarray
    prior2: np.ndarray
    prior: Prior
    study: Prior


def moderate(s2: np.ndarray, df: np.ndarray, at: np.ndarray) -> Moderated:
    """The two levels: cells' run-to-run variances `s2` on `df` (cells last), `at` each cell's
    stratum index (0..g−1). The strata's pooled variances are drawn toward the study's fitted
    prior, each cell toward its stratum's (the ratio s²/stratum fitted, so a stratum's level
    does not count as spread among its cells); both d₀ capped at PRIOR_DF."""
    member = (at[:, None] == np.arange(at.max() + 1)[None, :]).astype(float)
    own = np.where(df > 0, np.nan_to_num(s2) * df, 0.0)
    total, pooled_df = own @ member, np.where(df > 0, df, 0.0) @ member
    with np.errstate(invalid="ignore", divide="ignore"):
        strata2 = total / pooled_df
    study = fit_prior(strata2, pooled_df)
    if member.shape[1] == 1:  # one stratum: nothing to draw it toward
        study = Prior(np.zeros_like(study.df), study.scale2)
    d0s = np.minimum(study.df, PRIOR_DF)[..., None]
    stratum2 = squeeze(strata2, pooled_df, study.scale2[..., None], d0s)[..., at]
    with np.errstate(invalid="ignore", divide="ignore"):
        prior = fit_prior(s2 / stratum2, df)
    d0 = np.minimum(prior.df, PRIOR_DF)[..., None]
    prior2 = stratum2 * np.where(np.isfinite(prior.scale2), prior.scale2, 1.0)[..., None]
    post = squeeze(s2, df, prior2, d0)
    return Moderated(post, np.broadcast_to(d0 + np.where(df > 0, df, 0), post.shape), prior2,
                     prior, study)  # fmt: skip
