"""The confidence interval from steps and repeats (trainscale.analysis.interval) and the verdict
between two cells (trainscale.analysis.settle): a coverage test over simulated studies of the
default study's shape, hand-computed values, and the tables, ranking and summary that carry
them. Synthetic data only: the whole file runs in a few seconds."""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from test_aggregate import ok_record, spec_for, write

from trainscale.analysis import interval, moderate
from trainscale.analysis.study import Study
from trainscale.data import imagesets
from trainscale.measure import steptimes
from trainscale.plan.matrix import build_runs, repeat_count

from conftest import ROOT, validated

# --------------------------------------------------------------------------------------------
# simulated studies

#: The simulation's truth: run-to-run spread of log throughput (σ_a), the range each cell's
#: coefficient of variation of a step's time is drawn from, and the steps' lag-1 autocorrelation.
SIGMA_A = 0.02
STEP_CV = (0.05, 0.10)
PHI = 0.5
#: Simulated studies: enough that the rates below are known to about ±0.5 percentage points.
STUDIES = 3000
#: A true difference of 10 %.
TEN = math.log(1.1)


def default_shape() -> tuple[int, int, np.ndarray]:
    """(repeats, steady epochs, steps per epoch of each cell) of the default study (config.yaml)
    as the planner builds it on CPU, without tf-ps, whose runs record no step times."""
    repeats, epochs, cells = default_cells()
    return repeats, epochs, np.array(sorted(steps for steps, _, _ in cells.values()))


def default_cells() -> tuple[int, int, dict[str, tuple[int, str, int]]]:
    """(repeats, steady epochs, {cell: (steps per epoch, stratum, N)}) of the default study
    (config.yaml) as the planner builds it on CPU, without tf-ps (no step times)."""
    cfg = validated(yaml.safe_load((ROOT / "config.yaml").read_text()))
    runs, _ = build_runs(cfg, accelerator="cpu")
    cells = {}
    for r in runs:
        if r.strategy == "tf-ps":
            continue
        train = imagesets.info_of(r.dataset).train_samples * r.scale
        replicas = r.global_batch_size // r.per_worker_batch_size  # 1 for torch-pipeline
        steps = train // replicas // r.per_worker_batch_size
        stratum = interval.stratum_of(r.strategy, r.world_size, "cpu")
        cells[r.path.rsplit("/repeat", 1)[0]] = (steps, stratum, r.world_size)
    return repeat_count(cfg["repeats"]), cfg["epochs"] - 1, cells  # every cell's: min


def simulate(
    rng: np.random.Generator,
    studies: int,
    steps: np.ndarray,
    true: np.ndarray,
    repeats: int,
    epochs: int,
    sigma_a: float = SIGMA_A,
    step_cv: tuple[float, float] = STEP_CV,
) -> tuple[np.ndarray, ...]:  # noqa: E501, fmt: skip
    """(y, w, k), each (studies, cells, repeats): the log throughput of every run, and its
    within-run variance and batch count from its steady epochs' batch means, as
    `metrics_tables.runs_frame` computes them from a record. A run's step times are
    exp(−true − a) · exp(c·z − c²/2): a ~ N(0, sigma_a²) per run, z a stationary AR(1) of
    unit variance and lag-1 correlation PHI per epoch, c the cell's CV in that study (drawn
    from `step_cv`)."""
    cells = len(steps)
    cv = rng.uniform(*step_cv, (studies, cells))
    y, w, k = (np.empty((studies, cells, repeats)) for _ in range(3))
    for n in np.unique(steps):
        at = np.flatnonzero(steps == n)
        shape = (studies, len(at), repeats, epochs)
        z = np.empty((*shape, n))
        z[..., 0] = rng.standard_normal(shape)
        shocks = rng.standard_normal((*shape, n)) * math.sqrt(1 - PHI**2)
        for i in range(1, n):
            z[..., i] = PHI * z[..., i - 1] + shocks[..., i]
        a = rng.standard_normal(shape[:3]) * sigma_a
        c = cv[:, at, None, None, None]
        times = np.exp(
            -true[at][None, :, None, None, None] - a[..., None, None] + c * z - c * c / 2
        )
        means = spans(times, n).reshape(*shape[:3], -1)
        blocks = means.shape[-1]
        w[:, at] = means.var(-1, ddof=1) / (blocks * means.mean(-1) ** 2)
        k[:, at] = blocks
        y[:, at] = -np.log(times.mean((-2, -1)))  # samples per step: 1
    return y, w, k


def spans(times: np.ndarray, n: int) -> np.ndarray:
    """The blocks `interval.spans` makes of epochs of `n` step times (the last axis): the
    record's batch means merged into max(2, n // BLOCK_STEPS) blocks (no gaps between steps
    here: the epoch's seconds are its steps')."""
    bounds = np.asarray(steptimes.block_bounds(n))
    means = np.add.reduceat(times, bounds[:-1], axis=-1) / np.diff(bounds)
    groups = min(len(bounds) - 1, max(2, n // interval.BLOCK_STEPS))
    parts = np.asarray(steptimes.block_bounds(len(bounds) - 1, groups))
    sizes = np.diff(bounds)
    time = np.add.reduceat(means * sizes, parts[:-1], axis=-1)
    return time / np.add.reduceat(sizes, parts[:-1])


def coverage(f: interval.Fit, true: np.ndarray) -> np.ndarray:
    """Per study and cell: whether its 95% interval covers the true log throughput."""
    return np.abs(f.ybar - true) <= f.half_width()


def test_coverage_over_simulated_default_studies():
    """Over STUDIES simulated studies of the default shape (repeats 2, 2 steady epochs, 22 or 89
    steps an epoch, 26 cells with step times in 8 strata), the 95% interval covers each cell's
    true throughput in 93-97 % of them (±0.5 points of Monte-Carlo error)."""
    start = time.perf_counter()
    repeats, epochs, cells = default_cells()
    steps = np.array([c[0] for c in cells.values()])
    strata = pd.factorize(np.array([c[1] for c in cells.values()]))[0]
    assert repeats == 2 and epochs == 2 and len(steps) == 26 and set(steps) == {22, 89}
    assert strata.max() == 7  # torch, tensorflow, horovod, deepspeed at N = 1 and 2
    rng = np.random.default_rng(50)
    true = np.where(rng.permutation(len(steps)) < 13, TEN, 0.0)
    f = interval.fit(*simulate(rng, STUDIES, steps, true, repeats, epochs), strata)
    covered = float(coverage(f, true).mean())
    print(f"coverage {covered:.4f}, {time.perf_counter() - start:.2f} s")
    assert 0.93 <= covered <= 0.995  # errs wide: d₀ is capped where the cells are in fact alike
    assert np.median(f.vdf) == 1 + moderate.PRIOR_DF  # each cell its own df, plus its prior's


def test_strata_of_different_spread_keep_their_own_intervals():
    """Half the cells at 1 % run-to-run spread, half at 6 %, the halves in different strata
    (13 cells each): each half's 95% intervals cover its cells' truth in at least 93 % of
    STUDIES studies (±0.6 points), and so they do with no strata (one pool over both once
    covered the noisy half in 87 %) and with the default study's 8 small strata (Bartlett's
    pretest: 87 %)."""
    repeats, epochs, cells = default_cells()
    steps = np.array([c[0] for c in cells.values()])
    quiet = np.array(["torch" in c[1] for c in cells.values()])
    rng = np.random.default_rng(58)
    true = np.zeros(len(steps))
    runs = [simulate(rng, STUDIES, steps, true, repeats, epochs, sigma) for sigma in (0.01, 0.06)]
    y, w, k = (np.where(quiet[None, :, None], q, n) for q, n in zip(*runs, strict=True))
    halves = interval.fit(y, w, k, quiet.astype(int))
    covered = coverage(halves, true)
    one = coverage(interval.fit(y, w, k), true)
    strata = pd.factorize(np.array([c[1] for c in cells.values()]))[0]
    small = coverage(interval.fit(y, w, k, strata), true)
    print(f"1 % half {covered[:, quiet].mean():.4f}, 6 % half {covered[:, ~quiet].mean():.4f}; "
          f"one pool: {one[:, quiet].mean():.4f}, {one[:, ~quiet].mean():.4f}; 8 strata: "
          f"{small[:, quiet].mean():.4f}, {small[:, ~quiet].mean():.4f}")  # fmt: skip
    for got in (covered, one, small):
        assert got[:, quiet].mean() >= 0.93 and got[:, ~quiet].mean() >= 0.93


def test_the_simulation_computes_w_as_the_tables_do():
    """22 steps an epoch: the 8 batch means merged into 2 blocks of 11 (nearly independent),
    89 steps: 8 blocks of 11-12 kept; a record's epoch seconds, which hold the gaps between
    steps, scale its blocks (the throughput's own spans)."""
    rng = np.random.default_rng(1)
    for n, blocks in ((22, 4), (89, 16)):
        times = rng.lognormal(0, 0.1, (2, n))
        epochs = [{"step_batch_means": None}]
        epochs += [{"step_batch_means": steptimes.batch_means(list(e)), "steps": n,
                    "seconds": float(e.sum())} for e in times]  # fmt: skip
        w, k = interval.within_variance(epochs)
        means = spans(times, n).ravel()
        assert k == blocks == len(means)
        assert w == pytest.approx(means.var(ddof=1) / (blocks * means.mean() ** 2))
    gaps = [{**e, "seconds": e["seconds"] * g} for e, g in zip(epochs[1:], (1.0, 1.5), strict=True)]
    wider, _ = interval.within_variance(epochs[:1] + gaps)  # one epoch's gaps a third of it
    assert wider > 10 * w
    assert interval.within_variance(epochs[:1] + [{"step_batch_means": None}] * 2) == (None, 0)
    assert interval.within_variance([{}, {"steps": 3}]) == (None, 0)  # a record made before


# --------------------------------------------------------------------------------------------
# by hand, through the tables


def test_t_quantiles_are_scipys():
    from scipy.special import stdtrit

    df = np.array([1, 2, 3, 7, 26, 31, 120], dtype=float)
    assert interval.t_quantile(df) == pytest.approx(stdtrit(df, 0.975), rel=1e-12)
    assert interval.t_quantile(df, 0.8) == pytest.approx(stdtrit(df, 0.8), rel=1e-12)
    assert interval.t_quantile(26.9) == pytest.approx(stdtrit(26, 0.975))  # floored: wider
    assert np.isnan(interval.t_quantile(0.5))


#: Steady epoch seconds of each cell's two repeats, and the spread of its batch means.
CELLS = {
    "torch-ddp": ([1.00, 1.02], 0.04),
    "torch-fsdp": ([1.02, 1.045], 0.02),  # 2-3 % slower than torch-ddp
    "horovod-torch": ([1.005, 1.025], 0.03),  # 0.5 % slower: below the resolution
    "deepspeed-zero0": ([1.50, 1.52], 0.03),  # a third slower
    "lightning-ddp": ([1.2, 1.4], None),  # records made before batch means
}


def with_blocks(rec: dict, spread: float | None) -> dict:
    """`rec` with 8 batch means an epoch (of its 10 steps: 2, 2, 1, ... steps) around its mean
    step time, the first four +spread, the last four −spread: two blocks of 6 and 4 steps."""
    for e in rec["epochs"]:
        step = e["seconds"] / 10
        e["step_batch_means"] = (
            None
            if spread is None
            else [step * (1 + spread * (1 if i < 4 else -1)) for i in range(8)]
        )
    return rec


def study_of(tmp_path) -> Study:
    paths = []
    for strategy, (seconds, spread) in CELLS.items():
        for r, t in enumerate(seconds):
            spec = spec_for(strategy, 2, repeat=r)
            paths.append(write(tmp_path, spec, with_blocks(ok_record(spec, [t, t]), spread)))
    return Study.build(paths)


def by_hand(strata: dict[str, str]) -> dict:
    """The model's figures computed here from CELLS (each cell's stratum in `strata`), the
    formulas as docs/metrics.md states them; the moderation itself is moderate.moderate's
    (tests/test_moderate.py checks it against limma's moment fit)."""
    from scipy.special import stdtrit

    y = {s: np.log(1000 / np.array(t)) for s, (t, _) in CELLS.items()}
    # w per run: 4 blocks step·(1 ± spread)·c (c: the epoch's seconds over its step times):
    # var = spread²·(step·c)²·4/3, mean = step·c
    w = {s: spread**2 * 4 / 3 / 4 for s, (_, spread) in CELLS.items() if spread is not None}
    names = sorted(CELLS)  # the table's order
    own = np.array([((y[s] - y[s].mean()) ** 2).sum() for s in names])  # one df a cell
    at = pd.factorize(np.array([strata[s] for s in names]))[0]
    m = moderate.moderate(own, np.ones(len(names)), at)
    out = {}
    for i, s in enumerate(names):
        if s not in w:
            continue
        var = max(m.post[i], w[s]) / 2
        nu = m.df[i]
        h = stdtrit(math.floor(nu), 0.975) * math.sqrt(var)
        out[s] = {"ybar": y[s].mean(), "var": var, "nu": nu, "h": h,
                  "between": max(m.post[i] - w[s], 0.0)}  # fmt: skip
    return out


def test_the_interval_by_hand_and_old_records_keep_theirs(tmp_path):
    study = study_of(tmp_path)
    s = study.scaling.set_index("strategy")
    hand = by_hand(s["stratum"].to_dict())
    for strategy, h in hand.items():
        row = s.loc[strategy]
        assert row["interval_method"] == interval.STEPS
        assert row["throughput_log_mean"] == pytest.approx(h["ybar"])
        assert row["throughput_log_var"] == pytest.approx(h["var"])
        assert row["interval_df"] == pytest.approx(h["nu"])
        assert row["between_run_var"] == pytest.approx(h["between"])
        assert row["pooled_df"] == row["interval_df"] == 1 + moderate.PRIOR_DF
        assert row["prior_df"] == moderate.PRIOR_DF and row["prior_scale"] > 0
        assert row["throughput_ci95"] == pytest.approx(row["throughput_mean"] * math.expm1(h["h"]))
        student = interval.t975(2) * row["throughput_std"] / math.sqrt(2)
        assert row["throughput_ci95_repeats"] == pytest.approx(student)  # kept beside it
        per_worker = row["throughput_per_worker_mean"] * math.expm1(h["h"])
        assert row["throughput_per_worker_ci95"] == pytest.approx(per_worker)
    ddp = s.loc["torch-ddp"]  # t with d₀ + 1 df, not t(0.975, 1) = 12.7
    assert ddp["throughput_ci95"] < ddp["throughput_ci95_repeats"]
    assert s["throughput_gmean"].to_numpy() == pytest.approx(np.exp(s["throughput_log_mean"]))
    old = s.loc["lightning-ddp"]  # moderated for the verdicts, Student's t for its CI
    assert (
        old["interval_method"] == interval.REPEATS and old["interval_df"] == 1 + moderate.PRIOR_DF
    )
    assert old["throughput_ci95"] == pytest.approx(old["throughput_ci95_repeats"])
    assert old["throughput_ci95"] == pytest.approx(
        interval.t975(2) * old["throughput_std"] / 2**0.5
    )
    back = Study.read(_written(study, tmp_path / "tables")).scaling.set_index("strategy")
    assert back.loc["lightning-ddp", "interval_method"] == interval.REPEATS
    assert back.loc["torch-ddp", "throughput_ci95"] == pytest.approx(
        s.loc["torch-ddp", "throughput_ci95"]
    )


def _written(study: Study, folder):
    study.write(folder)
    return folder


# --------------------------------------------------------------------------------------------
# trainscale compare: the same interval


def folder_of(tmp_path, slow: float, spread: float | None) -> list:
    """4 cells × 2 repeats 2 % apart; torch-ddp's runs `slow`× as long."""
    paths = []
    for i, strategy in enumerate(("torch-ddp", "torch-fsdp", "horovod-torch", "lightning-ddp")):
        for r, jitter in enumerate((1.0, 1.02)):
            spec = spec_for(strategy, 2, repeat=r)
            t = (1 + 0.1 * i) * jitter * (slow if i == 0 else 1.0)
            paths.append(write(tmp_path, spec, with_blocks(ok_record(spec, [t, t]), spread)))
    return paths


def card_of(tmp_path, slow: float, spread: float | None) -> dict:
    from trainscale.compare import card

    return card.from_files(folder_of(tmp_path, slow, spread), [], str(tmp_path), "s")


def test_compare_uses_the_interval_from_steps_and_repeats(tmp_path):
    """The default CI pools both studies' run-to-run variance (they are alike: one
    configuration, run the same way): s², σ_a² and their df summed, Satterthwaite's ν."""
    from scipy.special import stdtrit

    from trainscale.compare import verdicts

    base, new = card_of(tmp_path / "base", 1.0, 0.01), card_of(tmp_path / "new", 1.08, 0.01)
    rows = {r["cell"]["strategy"]: r for r in verdicts.compare(base, new).cells}
    ddp = rows["torch-ddp"]
    assert ddp["ci"] == "steps" and verdicts.NOT_POOLED not in ddp["notes"]
    assert ddp["ratio"] == pytest.approx(1 / 1.08) and ddp["verdict"] == "slower"
    b, n = (p.model for c in (base, new)
            for k, p in verdicts.cells_of(c).items() if k[0] == "torch-ddp")  # fmt: skip
    nu = b.pooled_df  # a cell's moderated variance: d₀ + 1 df a study
    assert nu == n.pooled_df == 1 + moderate.PRIOR_DF
    s2 = (b.pooled_run_var + n.pooled_run_var) / 2
    between = (b.between_run_var + n.between_run_var) / 2
    var = between + b.within_run_var / 2 + n.within_run_var / 2
    share = between / s2  # the s² term weighted by σ_a²'s share: ν continuous as σ_a² → 0
    den = s2**2 / (2 * nu) * share + sum(
        (x.within_run_var / 2) ** 2 / x.within_run_df for x in (b, n)
    )
    high = math.exp(n.log_mean - b.log_mean + stdtrit(math.floor(var**2 / den), 0.975)
                    * math.sqrt(var))  # fmt: skip
    assert ddp["ci_high"] == pytest.approx(high)
    assert rows["torch-fsdp"]["verdict"] == "same"
    assert rows["torch-fsdp"]["ratio"] == pytest.approx(1)
    assert verdicts.compare(base, new, method="welch").cells[0]["ci"] == "welch"


def two_cells(tmp_path, slow: float, jitter: tuple[float, float]) -> dict:
    """A two-cell study (torch-ddp at 1 and 2 workers, 2 repeats `jitter` apart, the
    compare test's study); its 2-worker runs `slow`× as long."""
    from trainscale.compare import card

    paths = []
    for workers in (1, 2):
        for r, j in enumerate(jitter):
            spec = spec_for("torch-ddp", workers, repeat=r)
            t = j * (slow if workers == 2 else 1.0)
            paths.append(write(tmp_path, spec, with_blocks(ok_record(spec, [t, t]), 0.02)))
    return card.from_files(paths, [], str(tmp_path), "s")


def test_compare_flags_a_planted_2x_slowdown_of_a_two_cell_study(tmp_path):
    """Two cells of 2 repeats, the repeats 25 % apart: each study's own interval has 2 df
    (t = 4.3), pooled 4. The default (--ci steps) flags the 2-worker runs made 2× slower;
    a NEW study whose spread differs from BASE's is compared without pooling, and says so."""
    from trainscale.compare import verdicts

    base = two_cells(tmp_path / "base", 1.0, (1.0, 1.25))
    new = two_cells(tmp_path / "new", 2.0, (1.0, 1.25))
    result = verdicts.compare(base, new)
    assert result.ci == "steps"
    got = {r["cell"]["workers"]: r for r in result.cells}
    assert got[2]["verdict"] == "slower" and got[1]["verdict"] == "same"
    assert got[2]["ci"] == "steps" and got[2]["ci_high"] < 0.95
    assert verdicts.NOT_POOLED not in got[2]["notes"] and result.exit_status == 1
    quiet = two_cells(tmp_path / "quiet", 1.0, (1.0, 1.01))
    noisy = two_cells(tmp_path / "noisy", 1.0, (1.0, 1.5))
    row = verdicts.compare(quiet, noisy).cells[1]
    assert verdicts.NOT_POOLED in row["notes"] and row["verdict"] == "same"


def test_compare_of_old_records_falls_back_to_the_bootstrap_and_says_so(tmp_path):
    from trainscale.compare import card, sides, verdicts

    base, new = card_of(tmp_path / "base", 1.0, None), card_of(tmp_path / "new", 1.08, None)
    point = new["scaling"][0]["by_n"][0]["throughput"]
    assert point["interval"] == interval.REPEATS and point["log_var"] is not None
    rows = {r["cell"]["strategy"]: r for r in verdicts.compare(base, new, method="steps").cells}
    assert (
        rows["torch-ddp"]["ci"] == "bootstrap" and verdicts.FALLBACK in rows["torch-ddp"]["notes"]
    )
    assert rows["torch-ddp"]["verdict"] == "slower"  # every NEW repeat below every BASE one
    old = {k: v for k, v in point.items() if k not in ("interval", "log_mean", "log_var", "df")}
    new["scaling"][0]["by_n"][0]["throughput"] = old  # a card made before the fields
    card.validate(new)
    assert sides.model_of(new["scaling"][0]["by_n"][0]) is None
