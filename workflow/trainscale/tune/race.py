"""The tune's race (docs/tune.md, "The method"): which cells go on, which are stopped, and
which are the best, from the runs made so far.

Racing (Maron & Moore 1994; F-Race, Birattari et al. 2002; irace): every run has the same
length; a look is made once every surviving cell of a panel has its runs; the comparison with
the best (`trainscale.analysis.best`) stops the cells it calls slower, and every cell it does
not stop gets RUNS_A_LOOK more runs, or more where the next look could resolve its shortfall
from the best estimate (`more_runs`). A round's runs are made interleaved, so a spell of the machine
falls on all its cells alike; where the evidence names each run's round, each look compares
the cells with that drift taken out (blocking by round, as F-Race blocks by instance:
`trainscale.analysis.blocks`). The cells never stopped form a confidence set of the best: each
look's simultaneous intervals hold at 1 − ALPHA / MAX_LOOKS, so over a race of at most
MAX_LOOKS looks the true best is stopped with probability at most ALPHA (Bonferroni's split of
the level over a fixed maximum of looks). A panel ends when one cell is left, when its
survivors are equivalent within `equivalence` (TOST at the look's simultaneous level), or when
the budget (tune.max_runs, or the MAX_LOOKS-th look) runs out. Its winners then get `confirm`
runs that selected nothing, and their estimates and intervals come from those alone.

`decide` is pure: it replays the race look by look from the evidence, so every call gives the
same past decisions, and evidence beyond what was asked is not used.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainscale.analysis import interval
from trainscale.analysis.best import ALPHA, compare_with_best, look_level
from trainscale.analysis.settle import equivalent as tost
from trainscale.analysis.settle import repeats_to_resolve

GO_ON, STOPPED, BEST = "go on", "stopped", "best"
#: The most looks a race makes; each look's intervals hold at 1 − ALPHA / MAX_LOOKS
#: (`best.look_level`; ALPHA, the whole race's error, is `best.ALPHA`).
MAX_LOOKS = 10
#: The fewest runs a look gives each cell still racing. A look's power is bought with runs,
#: and a race of one run a look spends its ten looks before a cell 15 % behind is told from
#: the best at a run-to-run spread of 12 %: on the benchmark's panel, 3 a look keeps a set
#: without such a cell in 98 % of simulated races, against 67 % at one a look, for about 1.3
#: times the runs (docs/tune.md, "Runs a look, simulated, then built").
RUNS_A_LOOK = 3
#: Each look's simultaneous level.
LOOK_LEVEL = look_level(MAX_LOOKS, ALPHA)
#: The most a look multiplies a cell's runs by: more runs only where the next look could
#: resolve its observed shortfall within this (`more_runs`).
GROWTH = 3
#: Successive halving's rate where tune.cap is true: at most 1/ETA of a panel's cells go on.
ETA = 3
#: The fewest degrees of freedom of a panel's first look's pooled run-to-run variance.
FIRST_DF = 4
#: The words of a winner whose estimate comes from the runs that picked it.
BIASED = "selected: biased up"
#: The columns of `decide`'s inputs and result.
CELL_COLUMNS = ("cell", "panel", "stratum")
EVIDENCE_COLUMNS = ("cell", "y", "w", "k")
#: The evidence's optional column: each run's round, whose drift the looks then take out of
#: the comparison (`trainscale.analysis.blocks`).
ROUND = "round"
RESULT_COLUMNS = ["cell", "decision", "reason", "next_runs", "estimate", "ci_low", "ci_high"]


@dataclass(frozen=True)
class Settings:
    """Config `tune:` with its defaults (workflow/schemas/config.schema.yaml)."""

    epochs: int = 1  # steady epochs of every tune run, after one warm-up epoch
    steps_per_epoch: int = 40  # steps of each of a tune run's epochs
    equivalence: float = 0.02  # TOST margin, a fraction (config report.equivalence's default)
    cap: bool = False  # successive halving: at most 1/ETA of a panel's cells go on per look
    confirm: int = 2  # runs of each winner that selected nothing, for its estimate
    max_runs: int | None = None  # runs the tune may start, failed ones included
    max_worker_hours: float | None = None  # Σ world_size × wall hours the tune may spend
    objective: str = "throughput"  # throughput or cost

    @classmethod
    def of(cls, config: dict) -> Settings:
        """From a filled study config: `tune:`'s keys, equivalence from report's by default."""
        given = dict(config.get("tune") or {})
        if given.get("equivalence") is None:  # null: report.equivalence
            given["equivalence"] = (config.get("report") or {}).get("equivalence", 0.02)
        return cls(**{f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def empty_evidence() -> pd.DataFrame:
    """The evidence before round 1: the columns, no rows."""
    return pd.DataFrame({c: pd.Series(dtype=str if c == "cell" else float)
                         for c in EVIDENCE_COLUMNS})  # fmt: skip


def cells_frame(cells: list[dict]) -> pd.DataFrame:
    """`decide`'s cells from rows of CELL_COLUMNS."""
    return pd.DataFrame(cells, columns=list(CELL_COLUMNS))


def most_runs(first: int) -> int:
    """The most runs a cell makes before its confirmation runs, where its first look came
    after `first`: RUNS_A_LOOK a look, or up to GROWTH² times its first runs where the looks
    ask more (`more_runs`). The tune's run paths are numbered up to this
    (tune.space.max_repeats)."""
    return max(first + RUNS_A_LOOK * (MAX_LOOKS - 1), first * GROWTH**2)


def first_runs(cells: int) -> int:
    """Runs of each cell before a panel's first look: 2, more where so few cells would pool a
    run-to-run variance of fewer than FIRST_DF degrees of freedom."""
    return max(2, 1 + math.ceil(FIRST_DF / max(cells, 1)))


@dataclass
class Cell:
    """One cell's place in the replayed race."""

    decision: str = GO_ON
    reason: str = ""
    target: int = 0  # runs it is to have before its panel's next look (or its confirmation)
    used: int = 0  # runs the race's looks read (the rest, if any, confirm a winner)
    low: float = math.nan  # the last look's interval of it minus the best of the others
    high: float = math.nan
    confirming: bool = False  # its confirmation runs are asked (or none fit the budget)
    confirmations: int = 0


def decide(cells: pd.DataFrame, evidence: pd.DataFrame, settings: Settings) -> pd.DataFrame:
    """Each cell's decision, reason, the runs to make before the next call, and its estimate
    with its 95 % interval on `y`'s scale. `cells`: CELL_COLUMNS; `evidence`: one row per run
    in the order made, EVIDENCE_COLUMNS (a row whose `y` is NaN is a run that failed: spent,
    no evidence), and optionally ROUND, each run's round: each look then compares the cells
    with the rounds' shared drift taken out (blocking). The race is over when no row has
    `next_runs` > 0."""
    check_columns(cells, CELL_COLUMNS, "cells")
    check_columns(evidence, EVIDENCE_COLUMNS, "evidence")
    names = cells["cell"].astype(str).tolist()
    if not names:
        return pd.DataFrame(columns=RESULT_COLUMNS).astype({"next_runs": int})
    runs = runs_by_cell(names, evidence)
    have = {c: len(runs[c]) for c in names}
    panels = {
        p: rows["cell"].astype(str).tolist() for p, rows in cells.groupby("panel", sort=False)
    }
    strata = dict(zip(names, pd.factorize(cells["stratum"].astype(str))[0], strict=True))
    size = {c: len(members) for members in panels.values() for c in members}
    state = {c: Cell(target=first_runs(size[c])) for c in names}
    for c in (c for c in names if size[c] == 1):
        state[c] = Cell(decision=BEST, reason="the only cell of its panel")
    live = {p for p, members in panels.items() if len(members) > 1}
    first = sum(s.target for s in state.values() if s.decision == GO_ON)
    if settings.max_runs is not None and first > settings.max_runs:
        raise ValueError(
            f"tune.max_runs {settings.max_runs}: the first look needs {first} runs; raise it "
            f"to at least {first}, or narrow matrix"
        )
    for look in range(1, MAX_LOOKS + 1):
        ready = [p for p in live if all(have[c] >= state[c].target for c in panels[p]
                                        if state[c].decision == GO_ON)]  # fmt: skip
        if len(ready) < len(live):
            break
        for p in sorted(live):
            if look_panel(panels[p], runs, strata, state, look, settings):
                live.discard(p)
        if live and look == MAX_LOOKS:
            end_by_budget(live, panels, state, f"budget: the race's last look ({MAX_LOOKS})")
            live = set()
        if live and over_runs(state, have, settings):
            for s in (s for s in state.values() if s.decision == GO_ON):
                s.target = s.used + 1  # the more runs asked do not fit: one each
        if live and over_runs(state, have, settings):
            why = (f"budget: the next look's runs and the winners' confirmations would pass "
                   f"tune.max_runs {settings.max_runs}")  # fmt: skip
            end_by_budget(live, panels, state, why)
            live = set()
        ask_confirmation(state, have, settings)
        if not live:
            break
    return result(names, runs, strata, state, have, settings)


def check_columns(frame: pd.DataFrame, columns: tuple[str, ...], name: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"race.decide: {name} lacks the columns {missing}; give {list(columns)}")


def runs_by_cell(names: list[str], evidence: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each cell's runs in the order made: an array (runs, 4) of y, w, k and the round (NaN
    where the evidence has no ROUND). An ok run without a within-run variance (w NaN: no batch
    means) gets w = 0: its spread within is then part of its run-to-run spread, which the
    repeats estimate (Student's t over them)."""
    columns = [*EVIDENCE_COLUMNS[1:], ROUND]
    values = evidence.reindex(columns=columns).apply(pd.to_numeric, errors="coerce")
    values = values.to_numpy(float, copy=True)
    bare = np.isfinite(values[:, 0]) & ~(np.isfinite(values[:, 1]) & (values[:, 2] >= 2))
    values[bare, 1], values[bare, 2] = 0.0, 2.0
    at = pd.Index(names).get_indexer(evidence["cell"].astype(str))
    return {c: values[at == i] for i, c in enumerate(names)}


def arrays(
    cells: list[str], runs: dict[str, np.ndarray], upto: dict[str, slice]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(y, w, k, round) shaped (cells, runs) of each cell's runs in `upto`, NaN-padded
    (failed: NaN)."""
    parts = [runs[c][upto[c]] for c in cells]
    width = max([len(r) for r in parts] + [1])
    out = np.full((4, len(cells), width), np.nan)
    for i, r in enumerate(parts):
        out[:, i, : len(r)] = r.T
    return out[0], out[1], out[2], out[3]


def look_panel(
    panel: list[str],
    runs: dict[str, np.ndarray],
    strata: dict[str, int],
    state: dict[str, Cell],
    look: int,
    settings: Settings,
) -> bool:
    """One look at a panel, in place on `state`: stop the cells the comparison with the best
    calls slower (or, with the cap, cut past the cap); True where the panel ends."""
    alive = [c for c in panel if state[c].decision == GO_ON]
    for c in alive:
        state[c].used = state[c].target
    y, w, k, rounds = arrays(panel, runs, {c: slice(0, state[c].target) for c in panel})
    fit = interval.fit(y, w, k, np.array([strata[c] for c in panel]), rounds)
    on = np.array([c in alive for c in panel])
    level = LOOK_LEVEL
    pair_df = interval.pair_df(fit.columns())
    best = compare_with_best(np.where(on, fit.ybar, np.nan), fit.var, fit.vdf, pair_df,
                             level=level)  # fmt: skip
    for i, c in enumerate(panel):
        if not on[i]:
            continue
        s = state[c]
        s.low, s.high = best.low[i], best.high[i]
        if not np.isfinite(y[i]).any():
            s.decision, s.reason = STOPPED, "no ok run"
        elif best.slower[i]:
            s.decision = STOPPED
            s.reason = (f"slower than the panel's best at look {look}: {behind(s.high)} to "
                        f"{behind(s.low)} behind ({level:.2%} simultaneous)")  # fmt: skip
    left = [c for c in alive if state[c].decision == GO_ON]
    if settings.cap:
        left = cut_by_cap(left, fit.ybar, panel, state)
    if len(left) <= 1:
        for c in left:
            state[c].decision, state[c].reason = BEST, "the only cell of its panel left"
        return True
    at = [panel.index(c) for c in left]
    if equivalent(fit.ybar[at], fit.var[at], pair_df[np.ix_(at, at)], settings.equivalence):
        why = (f"the {len(left)} cells left are equivalent within ±{settings.equivalence:.0%} "
               f"(TOST at look {look}'s simultaneous level): any of them is as good")  # fmt: skip
        for c in left:
            state[c].decision, state[c].reason = BEST, why
        return True
    most = most_runs(first_runs(len(panel)))
    for c, more in zip(left, more_runs(fit, [panel.index(c) for c in left], most), strict=True):
        state[c].target += more
        state[c].reason = could_be(state[c], look, settings.cap)
    return False


def more_runs(fit: interval.Fit, left: list[int], most: int) -> list[int]:
    """The runs each cell left (indices into `fit`) makes before the next look: RUNS_A_LOOK,
    or, for a cell whose observed shortfall from the best estimate the next look could resolve
    with at most GROWTH times its runs (`settle.repeats_to_resolve` at the look's level: 80 %
    power at that shortfall), as many as that takes where it is more; the best estimate as
    many as the most any other is given, the pair's comparison needing both; none past `most`
    runs (most_runs).
    Runs are raised only where the look's result is promising, which does not raise the chance
    of calling the best slower (Chen, DeMets & Lan 2004; Mehta & Pocock 2011): docs/tune.md,
    "The method" step 5."""
    at = np.asarray(left)
    ybar, n = fit.ybar[at], fit.n[at].astype(float)
    top = int(np.argmax(ybar))
    gaps, compared = ybar[top] - ybar, np.isfinite(fit.var[at])
    need = repeats_to_resolve(fit.var[at], fit.vdf[at], n, gaps, top, compared, LOOK_LEVEL)
    promising = np.isfinite(need) & (need <= GROWTH * n)
    more = np.where(promising, need - n, RUNS_A_LOOK).clip(RUNS_A_LOOK).astype(int)
    more[top] = more.max()
    return np.minimum(more, most - n).clip(0).astype(int).tolist()  # none past `most` runs


def cut_by_cap(left: list[str], ybar: np.ndarray, panel: list[str], state: dict) -> list[str]:
    """Successive halving (tune.cap): of the cells left, the max(2, ⌈n/ETA⌉) best estimates
    go on; the rest are cut, though they could still be the best."""
    cap = max(2, math.ceil(len(left) / ETA))
    order = sorted(left, key=lambda c: -ybar[panel.index(c)])
    for c in order[cap:]:
        state[c].decision = STOPPED
        state[c].reason = f"cut by the cap; could still be the best (at most {cap} go on)"
    return order[:cap]


def equivalent(ybar: np.ndarray, var: np.ndarray, pair_df: np.ndarray, margin: float) -> bool:
    """TOST of every pair of the cells given (their ȳ, Var(ȳ) and pairs' df): each pair's
    one-sided tests at the look's error α, its difference ± t(1 − α, ν) · s inside
    ±ln(1 + margin). "All pairs equivalent" is an intersection of the pairs' hypotheses, so
    the pairs' tests at α each hold it at α (Berger 1982's intersection-union test); each
    pair's test is `settle.equivalent`'s."""
    from scipy import stats

    off = ~np.eye(len(ybar), dtype=bool)
    t = stats.t.ppf(LOOK_LEVEL, np.floor(pair_df[off]))  # floored df: errs wide
    d = (ybar[:, None] - ybar[None, :])[off]
    return bool(np.all(tost(d, (var[:, None] + var[None, :])[off], t, margin)))


def over_runs(state: dict[str, Cell], have: dict[str, int], settings: Settings) -> bool:
    """Whether the runs asked next (`more_runs`) and the confirmation runs every
    cell going on or newly won could need would pass tune.max_runs, counting every run made
    so far, failed ones included: the race ends while its winners' confirmations still fit."""
    if settings.max_runs is None:
        return False
    going = [s for s in state.values() if s.decision == GO_ON]
    fresh = [s for s in state.values() if s.decision == BEST and not s.confirming]
    spent = sum(min(have[c], s.target) for c, s in state.items() if s.decision != GO_ON)
    asked = sum(s.target for s in going) + settings.confirm * (len(going) + len(fresh))
    return spent + asked > settings.max_runs


def end_by_budget(live: set, panels: dict, state: dict[str, Cell], why: str) -> None:
    """End the panels still racing: their cells going on are the winners, with `why`."""
    for p in live:
        for c in panels[p]:
            s = state[c]
            if s.decision == GO_ON:
                s.target = s.used  # the next look's run is not made
                s.decision, s.reason = BEST, f"{s.reason}; {why}".lstrip("; ")


def ask_confirmation(state: dict[str, Cell], have: dict[str, int], settings: Settings) -> None:
    """Each new winner's target: `confirm` runs beyond those its race read, where
    tune.max_runs leaves room for them (else none: its estimate is BIASED)."""
    room = math.inf
    if settings.max_runs is not None:
        going = sum(s.target for s in state.values() if s.decision == GO_ON)
        made = sum(min(have[c], s.target) for c, s in state.items() if s.decision != GO_ON)
        room = settings.max_runs - going - made
    for s in state.values():
        if s.decision == BEST and not s.confirming:
            s.confirming = True
            s.confirmations = settings.confirm if room >= settings.confirm else 0
            room -= s.confirmations
            s.target = s.used + s.confirmations


def result(
    names: list[str],
    runs: dict[str, np.ndarray],
    strata: dict[str, int],
    state: dict[str, Cell],
    have: dict[str, int],
    settings: Settings,
) -> pd.DataFrame:
    """The table `decide` returns: estimates from the runs the race read, a winner's from its
    confirmation runs once they are all in (with the run-to-run variance pooled over every
    run of the race), else labelled BIASED."""
    sel = {c: slice(0, state[c].used or min(have[c], state[c].target)) for c in names}
    y, w, k, _ = arrays(names, runs, sel)
    labels = np.array([strata[c] for c in names])
    selected = interval.fit(y, w, k, labels)
    winners = [c for c in names if state[c].decision == BEST]
    done = [c for c in winners if state[c].confirmations > 0 and have[c] >= state[c].target]
    confirm_fit, at = None, {}
    if done:
        conf = {c: slice(state[c].used, state[c].target) for c in done}
        cy, cw, ck, _ = arrays(done, runs, conf)
        pad = max(cy.shape[1], y.shape[1])
        stack = [np.pad(a, ((0, 0), (0, pad - a.shape[1])), constant_values=np.nan)
                 for a in (cy, cw, ck, y, w, k)]  # fmt: skip
        both = [np.vstack([stack[i], stack[i + 3]]) for i in range(3)]
        lab = np.concatenate([[strata[c] for c in done], labels])
        confirm_fit, at = interval.fit(*both, lab), {c: i for i, c in enumerate(done)}
    rows = []
    half = selected.half_width()
    chalf = confirm_fit.half_width() if confirm_fit is not None else None
    for i, c in enumerate(names):
        s = state[c]
        est, h, reason = selected.ybar[i], half[i], s.reason
        if c in at:
            j = at[c]
            est, h = confirm_fit.ybar[j], chalf[j]
            reason += f"; estimate from {s.confirmations} confirmation runs"
        elif s.decision == BEST and s.confirmations == 0:
            reason += f"; {BIASED}"
        elif s.decision == BEST:
            reason += f"; {BIASED} until its {settings.confirm} confirmation runs are in"
        if s.decision == BEST and settings.cap:
            reason += "; a set left by the cap, not a confidence set of the best"
        nxt = max(s.target - have[c], 0) if s.decision != STOPPED else 0
        est = est if np.isfinite(y[i]).any() or c in at else math.nan
        rows.append({"cell": c, "decision": s.decision, "reason": reason, "next_runs": nxt,
                     "estimate": est, "ci_low": est - h, "ci_high": est + h})  # fmt: skip
    return pd.DataFrame(rows, columns=RESULT_COLUMNS).astype({"next_runs": int})


def behind(theta: float) -> str:
    """A log difference from the best as a share behind it: "12 %"."""
    return f"{-100 * math.expm1(theta):.0f} %"


def could_be(s: Cell, look: int, capped: bool) -> str:
    """A cell going on: how far behind or ahead of the best of the others it could be."""
    if not (np.isfinite(s.low) and np.isfinite(s.high)):
        return f"could be the best (look {look}: no interval yet)"
    lo = f"{behind(s.low)} behind" if s.low < 0 else f"{100 * math.expm1(s.low):.0f} % ahead"
    words = f"could be the best (look {look}: from {lo} to {100 * math.expm1(s.high):.0f} % ahead)"
    return words + ("; kept by the cap" if capped else "")
