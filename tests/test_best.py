"""The comparison with the best (trainscale.analysis.best) and what a study can tell
(trainscale.analysis.settle): error rates over simulated studies of the default study's shape,
hand-computed values, and the ranking, figure marks and summary that carry them. Synthetic data
only: the whole file runs in seconds."""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import pytest
from test_interval import STUDIES, TEN, default_cells, simulate, study_of

from trainscale.analysis import best, interval, settle, studentized_range
from trainscale.analysis.ranking import fastest, ranking
from trainscale.report.figures import ranking as ranking_figure

#: The one-sided 99 % Monte-Carlo margin of a rate near 5 % over `n` simulated panels.
MC = lambda n: 2.33 * math.sqrt(0.05 * 0.95 / n)  # noqa: E731


def panels_of_14() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, strata, N) of the default study's 26 cells with step times plus a stand-in for
    tf-ps at N = 1 and 2 (22 steps, tensorflow): two panels of 14 cells, as the default
    study ranks."""
    _, _, cells = default_cells()
    rows = [*cells.values(), (22, interval.stratum_of("tf-ps", 1, "cpu"), 1),
            (22, interval.stratum_of("tf-ps", 2, "cpu"), 2)]  # fmt: skip
    steps, strata, n = (np.array(v) for v in zip(*rows, strict=True))
    return steps, pd.factorize(strata)[0], n


def verdicts(f: interval.Fit, panel: np.ndarray) -> best.Best:
    """The comparison with the best of one panel's cells in every study, as the ranking makes
    it (each pair's df from interval.pair_df)."""
    cols = {k: v[:, panel] for k, v in f.columns().items()}
    return best.compare_with_best(f.ybar[:, panel], f.var[:, panel], f.vdf[:, panel],
                                  interval.pair_df(cols))  # fmt: skip


def dunnett(cells: int, df: float) -> float:
    """Dunnett's one-sided critical value (correlations ½) from scipy's multivariate t by
    root-finding at a fixed random state: what Hsu's constrained MCB would use."""
    from scipy import optimize, stats

    m = cells - 1
    shape = np.full((m, m), 0.5) + 0.5 * np.eye(m)
    t = stats.multivariate_t(np.zeros(m), shape, df=df)

    def excess(c: float) -> float:
        return t.cdf(np.full(m, c), random_state=np.random.default_rng(0)) - 0.95

    return optimize.brentq(excess, 1.0, 20.0, xtol=1e-3)


def test_no_cell_is_called_slower_among_equal_cells():
    """STUDIES simulated default studies whose 28 cells are all equally fast, ranked in their
    two panels of 14: some cell is called slower than the fastest in at most 5 % of panels
    (+MC(6000) ≈ 0.7 points of Monte-Carlo error). Printed beside it: the pairwise verdict
    the ranking had (each cell against the observed fastest at 5 %: about 34 % on the
    moderated variances) and Hsu's constrained MCB with Dunnett's critical value read as
    "slower" (about 6 %, above this one's)."""
    start = time.perf_counter()
    steps, strata, n = panels_of_14()
    rng = np.random.default_rng(14)
    f = interval.fit(*simulate(rng, STUDIES, steps, np.zeros(len(steps)), 2, 2), strata)
    called, pairwise, hsu = [], [], []
    for panel in (n == 1, n == 2):
        assert panel.sum() == 14
        called.append(verdicts(f, panel).slower.any(-1))
        y, v, df = f.ybar[:, panel], f.var[:, panel], f.vdf[:, panel]
        top = y.argmax(-1)[:, None]
        gap = np.take_along_axis(y, top, -1) - y
        se = np.sqrt(v + np.take_along_axis(v, top, -1))
        pairwise.append((gap > interval.t_quantile(best.welch_df(v, df).min((-2, -1)))[:, None]
                         * se).any(-1))  # fmt: skip
        c = dunnett(14, float(np.median(f.vdf)))
        hsu.append((gap > c * se).any(-1))
    rate = float(np.mean(called))
    print(f"some cell called slower: {rate:.4f} of panels (pairwise at 5 %: "
          f"{np.mean(pairwise):.3f}; Dunnett's constrained MCB: {np.mean(hsu):.3f}), "
          f"{time.perf_counter() - start:.1f} s")  # fmt: skip
    assert rate <= 0.05 + MC(2 * STUDIES)
    assert np.mean(hsu) > rate + 0.03  # why every pair, not Dunnett's value


def test_the_power_the_default_shape_has_is_printed():
    """A cell 10 % faster than the 13 others of its panel (default shape, STUDIES studies):
    how often each other cell is called slower (the power at 10 %; printed, not asserted
    beyond what the method gives), and that the faster cell is never called slower and is
    nearly always in the could-be-fastest set."""
    steps, strata, n = panels_of_14()
    panel = n == 1
    true = np.where(panel & (np.cumsum(panel) == 1), TEN, 0.0)
    rng = np.random.default_rng(10)
    f = interval.fit(*simulate(rng, STUDIES, steps, true, 2, 2), strata)
    b = verdicts(f, panel)
    first = np.flatnonzero(true[panel] > 0)[0]
    others = np.arange(14) != first
    power = float(b.slower[:, others].mean())
    print(f"power at 10 %: {power:.3f} per cell; the faster one in the set: "
          f"{b.could_be_best[:, first].mean():.4f}")  # fmt: skip
    assert not b.slower[:, first].any()
    assert b.could_be_best[:, first].mean() >= 0.95
    assert power < 0.5  # 2 repeats: the test_moderate.py power test asks for more repeats


def test_default_like_panel_names_the_fastest_set():
    """A panel like the default study's at N = 2 (14 cells, 2 repeats, 12 % run-to-run spread
    in one stratum of 28 cells): how often a cell of each true shortfall is called slower,
    printed; the fastest is always in the set, cells 69 % or more slower are called in at least
    70 % of studies and cells 30 % or less in at most 5 % (at 2 repeats a cell's variance has
    d₀ + 1 df: `repeats_to_resolve` says what resolves the rest)."""
    behind = np.array([0, 0.1, 0.2, 0.27, 0.27, 0.3, 0.33, 0.46, 0.5, 0.61, 0.69, 0.7, 0.73, 0.73])
    rng = np.random.default_rng(12)
    runs = 2000
    y = np.log1p(-np.concatenate([behind, behind]))[None, :, None]
    y = y + rng.standard_normal((runs, 28, 2)) * 0.12
    w = np.full(y.shape, 1e-4)
    f = interval.fit(y, w, np.full(y.shape, 16.0))
    b = verdicts(f, np.arange(28) < 14)
    called = b.slower.mean(0)
    print("behind → called slower: " + ", ".join(
        f"{x:.0%}: {c:.2f}" for x, c in zip(behind, called, strict=True)))  # fmt: skip
    assert b.could_be_best[:, 0].all() or b.could_be_best[:, 0].mean() > 0.99
    assert called[behind >= 0.69].min() >= 0.7 and called[behind <= 0.3].max() <= 0.05


def test_critical_values_are_the_studentized_ranges():
    """c(k, ν): P(every pair within c standard errors) = 95 %, checked by simulation
    (200,000 draws: ±0.25 points); two cells: Student's two-sided t; df floored to the grid."""
    assert best.critical_value(2, 7) == pytest.approx(interval.t_scalar(7, 0.975))
    rng = np.random.default_rng(0)
    z = rng.standard_normal((200_000, 14))
    s = np.sqrt(rng.chisquare(20, (200_000, 1)) / 20)
    c = best.critical_value(14, 20)
    inside = (z.max(-1) - z.min(-1)) / (s[:, 0] * math.sqrt(2)) <= c
    assert inside.mean() == pytest.approx(0.95, abs=0.0025)
    assert best.df_floor(np.array([0.5, 1, 10.9, 11.5, 27, 1000])).tolist()[1:] == [
        1, 10, 10, 24, 240]  # fmt: skip
    assert np.isnan(best.df_floor(0.5))
    assert c > dunnett(14, 20)  # every pair at once asks more than one against the rest


def test_compare_with_best_by_hand_on_records():
    """The public entry on synthetic records (as `trainscale tune` calls it): three cells
    with an interval and one without; the intervals are the formula's."""
    y = np.log([100.0, 97.0, 70.0, 120.0])
    var = np.array([0.02, 0.03, 0.02, np.nan]) ** 2
    df = np.array([12.0, 12.0, 12.0, np.nan])
    b = best.compare_with_best(y, var, df)
    c = best.simultaneous(var[:3], df[:3], np.ones(3, bool))
    assert b.critical == pytest.approx(c) and 2.3 < c < 3.0  # t(0.975, 12) = 2.18 for one pair

    def reach(i: int, j: int) -> float:  # the panel's c times the pair's standard error
        return c * math.sqrt(var[i] + var[j])

    assert b.high[0] == pytest.approx(min(y[0] - y[j] + reach(0, j) for j in (1, 2)))
    assert b.low[1] == pytest.approx(min(y[1] - y[j] - reach(1, j) for j in (0, 2)))
    assert b.could_be_best.tolist() == [True, True, False, True]
    assert b.slower.tolist() == [False, False, True, False]
    assert b.high[2] < 0 and math.isnan(b.high[3]) and b.cells == 3
    study = best.compare_with_best(np.stack([y, y]), np.stack([var, var]), np.stack([df, df]))
    assert study.slower.shape == (2, 4) and study.slower[1].tolist() == b.slower.tolist()


def test_a_noisy_cell_says_it_needs_more_repeats_than_the_panels_median():
    """`repeats_to_resolve` reads the cell's own (moderated) Var(ȳ) and the fastest's, not the
    panel's median: of two cells 10 % behind, the one four times as noisy needs more, and the
    quiet one's count is its own pair's by hand."""
    var = np.array([0.01, 0.01, 0.01, 0.01, 0.04, 0.01]) ** 2
    df, n = np.full(6, 4.0), np.full(6, 2.0)
    gaps = np.array([0.0, 0.1, 0.0, 0.0, 0.1, 0.0])
    quiet, noisy = settle.repeats_to_resolve(var, df, n, gaps, 0, np.ones(6, bool))[[1, 4]]
    assert quiet < noisy

    def reach(reps: int, v: float) -> float:  # the pair (cell, fastest) at reps, 1 df more each
        nu = 4 + (reps - 2)
        return (settle.panel_value(6, nu) + interval.t_scalar(nu, 0.8)) * math.sqrt(
            (v + 0.01**2) * 2 / reps
        )

    assert reach(int(quiet), 0.01**2) <= 0.1 < reach(int(quiet) - 1, 0.01**2)
    assert reach(int(noisy), 0.04**2) <= 0.1 < reach(int(noisy) - 1, 0.04**2)
    skipped = settle.repeats_to_resolve(var, df, n, gaps, 0, np.arange(6) != 4)
    assert np.isnan(skipped[4])  # not compared: nothing asked


def test_resolution_and_equivalence_by_hand():
    """mdd and the repeats asked from the df the comparison uses (a cell's d₀ + n − 1: one
    more per repeat), the panel's own critical value; TOST at the simultaneous 90 % value."""
    var, df, n = np.full(6, 0.04**2), np.full(6, 4.0), np.full(6, 2.0)
    got = settle.resolution(var, df, n)
    c = float(best.simultaneous(var, df, np.ones(6, bool)))
    assert settle.panel_value(6, 4) == pytest.approx(c)
    t8 = interval.t_scalar(4, 0.8)
    assert got["mdd_rel"] == pytest.approx(-math.expm1(-(c + t8) * math.sqrt(2 * 0.04**2)))

    def mdd(reps: int) -> float:  # the median cell's per-run variance over reps, 1 df more each
        nu = 4 + (reps - 2)
        return (settle.panel_value(6, nu) + interval.t_scalar(nu, 0.8)) * math.sqrt(
            2 * 2 * 0.04**2 / reps
        )

    reps = int(got["repeats_for_5pct"])
    assert mdd(reps) <= -math.log(0.95) < mdd(reps - 1)
    assert not got["repeats_for_2pct"] <= reps  # more, or beyond MAX_REPEATS (NaN)
    asked = settle.repeats_to_resolve(var, df, n, [0.0, 0.3, 0, 0, 0, 0], 0, np.ones(6, bool))
    assert math.isnan(asked[0]) and np.isnan(asked[2:]).all()
    big = int(asked[1])  # equal cells: the pair's own variance is the median pair's
    assert mdd(big) <= 0.3 < mdd(big - 1)
    assert math.isnan(got["repeats_for_equivalence"])  # ±2 % at 4 % a cell: beyond 100
    quiet = settle.resolution(np.full(6, 0.005**2), df, n)
    tost = int(quiet["repeats_for_equivalence"])
    c90 = lambda k: settle.panel_value(6, 4 + k - 2, settle.TOST_LEVEL)  # noqa: E731
    reach = lambda k: c90(k) * math.sqrt(4 * 0.005**2 / k)  # noqa: E731
    assert reach(tost) < math.log(1.02) <= reach(tost - 1)
    assert settle.resolves(0.18, 6.0) == (
        "this study resolves differences of ≥ 18 %; 6 repeats would resolve ≥ 5 %"
    )
    assert "more than 100 repeats" in settle.resolves(0.4, math.nan)
    assert settle.needs(0.31, 5.0) == "; a 31 % shortfall (as observed) needs 5 repeats"
    # TOST: 0.5 % apart, reach ±1.2 % inside ±2 %: equivalent; ±15 %: not
    d = np.log(np.array([0.995, 0.995]))
    same = settle.equivalent(d, np.array([0.004, 0.05]) ** 2, 3.0, 0.02)
    assert same.tolist() == [True, False]


def test_the_ranking_names_the_fastest_set_and_what_the_study_resolves(tmp_path):
    study = study_of(tmp_path)  # 5 cells at N = 2, deepspeed-zero0 a third slower
    r = study.ranking.set_index("strategy")
    assert r.loc["torch-ddp", "fastest"] and r.loc["torch-ddp", "could_be_fastest"]
    assert not r.loc["torch-ddp", "slower"] and not r.loc["torch-ddp", "equivalent"]
    slow = r.loc["deepspeed-zero0"]
    assert slow["slower"] and slow["distinguishable"] and slow["mcb_high"] < 0
    assert slow["settle"] == "slower than the fastest (95 %, simultaneous)"
    could = ["torch-ddp", "horovod-torch", "torch-fsdp"]  # lightning-ddp: repeats only, moderated
    assert r.loc["lightning-ddp", "slower"]  # 22 % behind: its 1 df once left it a tie
    assert list(r.index[r["could_be_fastest"]]) == could
    assert (r["distinguishable"] == r["slower"]).all()
    assert (r["mcb_low"] <= r["mcb_high"]).all()
    tie = r.loc["torch-fsdp"]
    assert tie["settle"].startswith("not told apart: this study resolves differences of ≥ ")
    assert "shortfall (as observed) needs" in tie["settle"]  # what would resolve it
    assert not r["equivalent"].any() and (r["repeats_for_equivalence"] > 2).all()  # needs more
    assert r["mdd_rel"].nunique() == 1 and 0 < tie["mdd_rel"] < 0.3
    assert not tie["repeats_for_2pct"] < tie["repeats_for_5pct"]  # more, or beyond 100
    marks = {s: ranking_figure.marks(row, 4) for s, row in r.iterrows()}
    assert marks["torch-ddp"] == "fastest · 1 of 4 that could be"
    assert marks["torch-fsdp"] == "−2.2 % · could be the fastest"
    assert marks["deepspeed-zero0"] == "−33 % · slower"
    text = study.summary()
    assert ("at 95 %, the fastest is one of "
            "{torch-ddp, horovod-torch, torch-fsdp}") in text  # fmt: skip
    assert "run-to-run variances moderated toward a prior fitted to this study: d0 = 3" in text
    assert "could be the fastest at 95 %" in text
    s = study.scaling.set_index("strategy")  # scaling.csv carries the verdicts
    assert s.loc["deepspeed-zero0", "slower"] and s.loc["torch-fsdp", "could_be_fastest"]
    assert s["mdd_rel"].notna().all() and s["equivalent"].dtype == bool
    assert (s["prior_df"] == 3).all() and s["prior_scale"].nunique() == 1
    assert s["throughput_gmean"].lt(s["throughput_mean"] + 1e-9).all()  # gmean ≤ mean


def test_token_cells_are_ranked_and_compared_in_tokens_per_second():
    """Two seq_len values in one panel: more samples/s at 128 tokens, more tokens/s at 512.
    The ranking, the verdict and `fastest` (summary.txt's) all go by tokens/s."""
    base = {"model": "gpt", "dataset": "tok", "world_size": 2, "workers": 2, "nodes": 1,
            "scale": 1, "batch_size": 8, "batch_mode": "global", "precision": "fp32",
            "logical": False, "oversubscribed": False, "ok": 2, "runs": 2, "tp": 1,
            "activation_checkpointing": "none", "offload": "none", "throughput_ci95": 0.1,
            "efficiency": math.nan, "efficiency_kind": "strong", "speedup": math.nan,
            "speedup_vs_single": math.nan, "baseline_note": ""}  # fmt: skip
    s = pd.DataFrame([
        base | {"strategy": "torch-ddp", "seq_len": 128, "throughput_mean": 30.0},
        base | {"strategy": "torch-fsdp", "seq_len": 512, "throughput_mean": 10.0},
    ])  # fmt: skip
    r = ranking(s).set_index("strategy")
    assert r.loc["torch-fsdp", "fastest"] and r.loc["torch-ddp", "slower"]
    assert r.loc["torch-ddp", "behind"] == pytest.approx(1 - 30 * 128 / (10 * 512))
    (win,) = fastest(s).itertuples(index=False)
    assert win.strategy == "torch-fsdp" and win.runner_up == "torch-ddp" and win.distinct


def test_the_kept_quantiles_are_scipys():
    """trainscale.analysis.studentized_range (scripts/studentized-range-table.py wrote it):
    every cell count 3..K_MAX at every df of the grid, its entries scipy's; beyond it, the
    critical value is scipy's at run time."""
    from scipy import stats

    kept = studentized_range.QUANTILES
    assert studentized_range.DF == best.DF_GRID and studentized_range.LEVEL == best.LEVEL
    assert sorted(kept) == list(range(3, studentized_range.K_MAX + 1))
    assert {len(row) for row in kept.values()} == {len(best.DF_GRID)}
    for cells, df in ((3, 1), (14, 20), (studentized_range.K_MAX, 240)):
        want = stats.studentized_range.ppf(best.LEVEL, cells, df)
        assert kept[cells][best.DF_GRID.index(df)] == pytest.approx(want, rel=1e-9)
        assert best.critical_value(cells, df) == pytest.approx(want / math.sqrt(2), rel=1e-9)
    beyond = studentized_range.K_MAX + 1
    want = stats.studentized_range.ppf(best.LEVEL, beyond, 20) / math.sqrt(2)
    assert best.critical_value(beyond, 20) == pytest.approx(want, rel=1e-9)
