"""Repeats a study buys (config `repeats: {min, max}`; docs/tune.md, "Repeats a study buys"):
after every cell's `min` repeats, which cells get one more.

The racing step of `trainscale tune` at the study's own run length: at each look, per panel,
the comparison with the best (`trainscale.analysis.best`, on the ranking's model of the
records so far) names the cells that could be the fastest. While more than one could, and
they are not all equivalent within ±`equivalence` (TOST against the set's top), each of them
gets one more repeat, up to `max`. The looks share the error as the tune's race does
(Bonferroni's split over a fixed maximum of looks): a study makes at most max − min looks,
and each look's simultaneous intervals hold at 1 − ALPHA / (max − min), so the true fastest
leaves the set over the whole study with probability at most ALPHA.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainscale.analysis.best import ALPHA, compare_with_best, look_level, simultaneous
from trainscale.analysis.interval import pair_df
from trainscale.analysis.ranking import GROUP, model_of
from trainscale.analysis.settle import equivalent, pct
from trainscale.plan.runspec import MATRIX_KEYS

#: The columns `decide` returns (one row per cell).
COLUMNS = ["cell", "repeats_taken", "more", "repeats_reason"]


@dataclass(frozen=True)
class Repeats:
    """Config `repeats` as a range: `low` repeats of every cell, at most `high`."""

    low: int
    high: int

    @property
    def looks(self) -> int:
        """The most looks a study makes: one before each repeat past `low`."""
        return self.high - self.low

    def look_level(self) -> float:
        """Each look's simultaneous level (`best.look_level`: Bonferroni over the looks)."""
        return look_level(self.looks, ALPHA)


def decide(scaling: pd.DataFrame, repeats: Repeats, equivalence: float) -> pd.DataFrame:
    """One row per cell of `scaling` (the study's scaling table of the records so far) with
    `cell` (the run path without the repeat), `repeats_taken` (the repeats asked of it so
    far: a failed or invalid run is spent), `more` (whether it gets one more repeat) and
    `repeats_reason`."""
    missing = [c for c in ("cell", "repeats_taken") if c not in scaling]
    if missing:
        raise ValueError(f"repeats.decide: scaling lacks the columns {missing}; add them "
                         "(with_cells, and the repeats asked of each cell)")  # fmt: skip
    rows = []
    for _, panel in scaling.groupby(GROUP, sort=False, dropna=False):
        rows += panel_decisions(panel, repeats, equivalence)
    return pd.DataFrame(rows, columns=COLUMNS)


def panel_decisions(
    panel: pd.DataFrame, repeats: Repeats, equivalence: float
) -> list[tuple[str, int, bool, str]]:
    """`decide`'s rows of one panel."""
    taken = panel["repeats_taken"].astype(int).to_numpy()
    cells = panel["cell"].astype(str).tolist()
    value = pd.to_numeric(panel["throughput_mean"], errors="coerce").to_numpy(float)
    logical = panel["logical"].fillna(False).astype(bool) if "logical" in panel else False
    ranked = np.isfinite(value) & ~np.asarray(logical, bool)
    if ranked.sum() <= 1:
        why = "the only cell of its panel" if len(cells) == 1 else "the only ranked cell"
        return [(c, t, False, why if r else "not ranked: no throughput")
                for c, t, r in zip(cells, taken, ranked, strict=True)]  # fmt: skip
    model = {k: v[ranked] for k, v in model_of(panel, "throughput").items()}
    level = repeats.look_level()
    best = compare_with_best(model["score"], model["throughput_log_var"], model["interval_df"],
                             pair_df(model), level=level)  # fmt: skip
    could = np.zeros(len(cells), bool)
    could[ranked] = best.could_be_best
    open_set = could.sum() > 1 and not all_equivalent(model, best.could_be_best, repeats,
                                                       equivalence)  # fmt: skip
    rows = []
    for i, c in enumerate(cells):
        more = bool(open_set and could[i] and taken[i] < repeats.high)
        why = reason(bool(could[i]), open_set, more, int(could.sum()), level, equivalence,
                     repeats)  # fmt: skip
        rows.append((c, int(taken[i]), more, why if ranked[i] else "not ranked: no throughput"))
    return rows


def all_equivalent(
    model: dict[str, np.ndarray], could: np.ndarray, repeats: Repeats, margin: float
) -> bool:
    """TOST of every cell that could be the fastest against the best estimate among them,
    with the set's simultaneous value at 1 − 2 · the look's error (each side at it)."""
    score, var, df = model["score"], model["throughput_log_var"], model["interval_df"]
    at = np.flatnonzero(could)
    top = at[np.argmax(score[at])]
    c = float(simultaneous(var, df, could, 1 - 2 * (1 - repeats.look_level())))
    others = at[at != top]
    d, pair_var = score[others] - score[top], var[others] + var[top]
    return bool(np.all(equivalent(d, pair_var, c, margin)))


def reason(
    could: bool, open_set: bool, more: bool, size: int, level: float, margin: float,
    repeats: Repeats,
) -> str:  # fmt: skip
    """Why a ranked cell took the repeats it took (or takes one more), in words."""
    others = f"{size - 1} other cell" + ("s" if size > 2 else "")
    if not could:
        return f"slower than the panel's fastest ({100 * level:.4g} % simultaneous): resolved"
    if more:
        return f"could be the fastest with {others}, not resolved: one more repeat"
    if open_set:
        return f"could be the fastest with {others}, not resolved at repeats.max {repeats.high}"
    if size == 1:
        return "the only cell that could be the fastest: resolved"
    return (f"the {size} cells that could be the fastest are equivalent within "
            f"±{pct(margin)}: resolved")  # fmt: skip


def decide_study(
    scaling: pd.DataFrame,
    runs: pd.DataFrame,
    asked: list[str],
    repeats: Repeats,
    equivalence: float,
) -> pd.DataFrame:
    """`decide` on a study's tables (scaling.csv and runs.csv of the records so far), every
    run asked so far by run path in `asked` (failed and invalid ones too), with `next_run`:
    the run path of the repeat a cell gets next ("" where none)."""
    table = scaling.assign(cell=cell_ids(scaling, runs))
    taken = cells_of(pd.Series(asked, dtype=str)).value_counts()
    table["repeats_taken"] = table["cell"].map(taken).fillna(0).astype(int)
    out = decide(table, repeats, equivalence)
    nxt = out["cell"] + "/repeat~" + out["repeats_taken"].astype(str)
    return out.assign(next_run=nxt.where(out["more"], ""))


def cell_ids(scaling: pd.DataFrame, runs: pd.DataFrame) -> np.ndarray:
    """Each scaling row's cell (its runs' path without the repeat), matched on the matrix
    keys (runs.csv's `spec.<key>`)."""
    keys = [k for k in MATRIX_KEYS if k in scaling and f"spec.{k}" in runs]
    ids = runs[[f"spec.{k}" for k in keys]].set_axis(keys, axis=1)
    ids = ids.assign(cell=cells_of(runs["run"])).drop_duplicates(keys)
    merged = scaling[keys].merge(ids, on=keys, how="left", validate="many_to_one")
    return merged["cell"].to_numpy()


def cells_of(run_paths: pd.Series) -> pd.Series:
    """Each run's cell: its run path without the repeat."""
    return run_paths.astype(str).str.rsplit("/repeat~", n=1).str[0]


def with_repeats(
    scaling: pd.DataFrame, runs: pd.DataFrame, asked: list[str], repeats: Repeats,
    equivalence: float,
) -> pd.DataFrame:  # fmt: skip
    """scaling.csv of a study with repeats {min, max}: each cell's `repeats_taken` (runs
    asked, failed and invalid ones too) and `repeats_reason` (why no more, or "not resolved at
    repeats.max"), as the last look would decide on every record."""
    decided = decide_study(scaling, runs, asked, repeats, equivalence)
    cells = pd.Series(cell_ids(scaling, runs))
    found = decided.set_index("cell")
    return scaling.assign(repeats_taken=cells.map(found["repeats_taken"]).to_numpy(),
                          repeats_reason=cells.map(found["repeats_reason"]).to_numpy())  # fmt: skip


def panel_lines(scaling: pd.DataFrame) -> dict[tuple, str]:
    """Per panel (model, dataset, world_size) of a scaling table with `repeats_taken`: the
    report's line of how many repeats each cell took and why ("torch 3: …; torch-ddp 2: …");
    none without the columns (an integer `repeats`)."""
    if "repeats_taken" not in scaling:
        return {}
    out = {}
    for key, panel in scaling.groupby(GROUP, sort=False):
        parts = [f"{r.strategy} {int(r.repeats_taken)}: {r.repeats_reason}"
                 for r in panel.itertuples(index=False) if pd.notna(r.repeats_taken)]  # fmt: skip
        out[tuple(key)] = "; ".join(parts)
    return out
