"""The ranking: per model, dataset and N, every cell with ok runs sorted by the geometric mean
of its steady throughput (exp of the mean log, the quantity the verdicts test) in its data's
unit (tokens/s on token data), and the verdicts that hold across the whole panel at once:
which cells could be the fastest (the comparison with the best, `trainscale.analysis.best`),
which are slower, which are equivalent to the fastest, and what
the panel resolves (`trainscale.analysis.settle`). The definitions are the terms "ranking",
"comparison with the best", "what a study can tell" and "equivalent" of
docs/methods.md, the report's Methods. `fastest` reads the same
ranking, so summary.txt, the summary table and the figure name one fastest cell.

Only ok runs count (a cell's means are over its ok runs; a cell without one has no throughput
and is not in the ranking), so a status that is not ok is never ranked. Cells on logical CPU
devices are listed where their throughput puts them but never ranked; a strategy whose
results need a note beside them (tf-ps: asynchronous) carries its catalog mark, as in the
tables.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainscale.analysis.best import compare_with_best, simultaneous
from trainscale.analysis.interval import CELL_COLUMNS, pair_df, t975
from trainscale.analysis.settle import (
    EQUIVALENCE,
    TOST_LEVEL,
    equivalent,
    repeats_to_resolve,
    resolution,
    verdict_text,
)
from trainscale.plan import catalog
from trainscale.plan.matrix import MATRIX_KEYS

#: A ranking's facet: the cells compared with each other.
GROUP = ["model", "dataset", "world_size"]
#: What a ranking may order by (config `report.rank_by`): the column ranked, its CI, and
#: whether higher is better.
BY = {
    "throughput": ("rate_gmean", "rate_gci95", True),
    "cost": ("cost_per_million_mean", "cost_per_million_ci95", False),
}
#: The verdict columns the ranking adds, and scaling.csv carries (ranked by throughput).
VERDICTS = ["could_be_fastest", "mcb_low", "mcb_high", "slower", "distinguishable", "mdd_rel",
            "repeats_for_5pct", "repeats_for_2pct", "repeats_for_equivalence",
            "repeats_to_resolve", "equivalent"]  # fmt: skip
#: Which of VERDICTS are booleans.
FLAGS = ("could_be_fastest", "slower", "distinguishable", "equivalent")


def rate(
    mean: float, ci: float, seq_len: int | float | None, unit: str = "samples/s"
) -> tuple[float, float, str]:
    """(mean, CI half-width, unit) of a throughput in its data's unit: tokens/s (× seq_len) for
    a cell on token data, else as given (`unit`, samples/s over all workers)."""
    if seq_len and not pd.isna(seq_len):
        return mean * seq_len, ci * seq_len, "tokens/s"
    return mean, ci, unit


def ranking(
    scaling: pd.DataFrame, by: str = "throughput", equivalence: float = EQUIVALENCE
) -> pd.DataFrame:
    """One row per cell with a mean throughput, grouped by GROUP, best first: `rate_mean` and
    `rate_ci95` in the data's `unit` (tokens/s on token data, else samples/s), `rate_gmean`
    and `rate_gci95` the geometric mean's (what throughput is ranked by), `mfu_mean` and
    `mfu_ci95` where recorded; `value`, `value_ci95` and `value_unit`, the figure ranked
    (`by`: throughput, the highest first, or cost per million, the lowest first; a cell
    without it is listed last, unranked); `rank` (1 = best; NaN for logical devices and
    unpriced cells), `fastest` (the best: the fastest, or the cheapest by cost); the verdicts
    of VERDICTS (`verdicts`), `settle` (the words beside a ranked cell that is not the best)
    and `behind` (how much worse than the best, a fraction: 1 − x / x_best for throughput,
    x / x_best − 1 for cost); `interval_method`, `logical`, `mark` (the catalog's
    results_mark), `oversubscribed`, `ranked_by` and `equivalence` (the TOST margin)."""
    cols = [*GROUP, "strategy", "rank", "rate_mean", "rate_ci95", "unit", *VERDICTS]
    s = scaling[scaling["throughput_mean"].notna()] if len(scaling) else scaling
    if not len(s):
        return pd.DataFrame(columns=cols)
    s = s.copy()
    seq = s["seq_len"] if "seq_len" in s else pd.Series(0, index=s.index)
    rates = [
        rate(m, c, q)
        for m, c, q in zip(s["throughput_mean"], s["throughput_ci95"], seq, strict=True)
    ]
    s["rate_mean"], s["rate_ci95"], s["unit"] = (list(v) for v in zip(*rates, strict=True))
    s["rate_gmean"], s["rate_gci95"] = geometric(s)
    for col in ("mfu_mean", "mfu_ci95", "cost_per_million_mean", "cost_per_million_ci95"):
        if col not in s:
            s[col] = np.nan
    mean, ci, higher = BY[by]
    s["value"], s["value_ci95"], s["ranked_by"], s["equivalence"] = s[mean], s[ci], by, equivalence
    if by == "cost":
        currency = s["currency"] if "currency" in s else pd.Series("", index=s.index)
        per = np.where(seq.fillna(0).to_numpy() > 0, "million tokens", "million samples")
        s["value_unit"] = currency.fillna("").astype(str).str.cat(per, sep=" per ").str.strip()
    else:
        s["value_unit"] = s["unit"]
    s["logical"] = s["logical"].fillna(False).astype(bool) if "logical" in s else False
    s["oversubscribed"] = s.get("oversubscribed", False)
    s["mark"] = s["strategy"].map(
        lambda n: catalog.STRATEGIES[n].results_mark if n in catalog.STRATEGIES else ""
    )
    if "interval_method" not in s:
        s["interval_method"] = ""
    key = s["value"] if higher else -s["value"]
    s = s.assign(_key=key.fillna(-np.inf))
    s = s.sort_values([*GROUP, "_key"], ascending=[True, True, True, False], kind="stable")
    ranked = ~s["logical"] & s["value"].notna()
    s["rank"] = ranked.groupby([s[k] for k in GROUP]).cumsum().where(ranked)
    s["fastest"] = s["rank"] == 1
    s = verdicts(s, ranked, by, equivalence)
    ref = s[s["fastest"]].set_index(GROUP)["value"]
    ref = ref.reindex(pd.MultiIndex.from_frame(s[GROUP])).to_numpy()
    s["behind"] = 1 - s["value"] / ref if higher else s["value"] / ref - 1
    rows = s.itertuples(index=False)
    s["settle"] = [
        verdict_text(r, equivalence) if i else "" for r, i in zip(rows, ranked, strict=True)
    ]
    return s.drop(columns="_key").reset_index(drop=True)


def geometric(s: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(rate_gmean, rate_gci95): the geometric mean of throughput (exp of the mean log, the
    quantity the verdicts test; `throughput_gmean`) in the data's unit, and its CI half-width
    at the arithmetic mean's relative width; the arithmetic mean where a table lacks it."""
    g = s["throughput_gmean"] if "throughput_gmean" in s else s["throughput_mean"]
    g = pd.to_numeric(g, errors="coerce").fillna(s["throughput_mean"])
    scale = g / s["throughput_mean"]
    return s["rate_mean"] * scale, s["rate_ci95"] * scale


def with_verdicts(scaling: pd.DataFrame, equivalence: float = EQUIVALENCE) -> pd.DataFrame:
    """`scaling` with the ranking by throughput's VERDICTS of each cell (scaling.csv's
    columns; a cell not ranked: not could-be-fastest, not slower, the rest NaN)."""
    r = ranking(scaling, equivalence=equivalence)
    keys = list(MATRIX_KEYS)
    if not len(r) or not all(k in scaling for k in keys):
        return scaling.assign(**{c: False if c in FLAGS else np.nan for c in VERDICTS})
    out = scaling.drop(columns=[c for c in VERDICTS if c in scaling])
    out = out.merge(r[[*keys, *VERDICTS]], on=keys, how="left", validate="one_to_one")
    return out.fillna(dict.fromkeys(FLAGS, False)).astype(dict.fromkeys(FLAGS, bool))


def model_of(s: pd.DataFrame, by: str) -> dict[str, np.ndarray]:
    """The cells' model columns (interval's CELL_COLUMNS by name) with `score`, the log of the
    figure ranked, higher better: log throughput in the data's unit (+ ln seq_len on token
    data), or for cost −log cost per million up to a constant of the panel (log throughput +
    ln seq_len − ln price: a run's cost is price · N / (x · u)). A scaling table made before
    the model's columns gets them from its Student's t CI: Var = (ci / (t · x̄))², n − 1 df."""
    n = pd.to_numeric(s["throughput_n"] if "throughput_n" in s else s["ok"], errors="coerce")
    cols = {"throughput_n": n.to_numpy(float)}
    if all(c in s for c in CELL_COLUMNS):
        for c in CELL_COLUMNS:
            if c not in ("interval_method", "stratum"):
                cols[c] = pd.to_numeric(s[c], errors="coerce").to_numpy(float)
    else:
        x = s["throughput_mean"].to_numpy(float)
        se = s["throughput_ci95"].to_numpy(float) / (t975(n.to_numpy(float)) * x)
        cols |= {"throughput_log_mean": np.log(x), "throughput_log_var": se**2,
                 "interval_df": n.to_numpy(float) - 1}  # fmt: skip
        for c in ("within_run_var", "within_run_df", "between_run_var", "pooled_run_var",
                  "pooled_df", "variance_pool"):  # fmt: skip
            cols[c] = np.full(len(s), np.nan)
    seq = pd.to_numeric(s.get("seq_len", 0), errors="coerce")
    units = np.log(np.where(np.asarray(seq, float) > 0, np.asarray(seq, float), 1.0))
    score = cols["throughput_log_mean"] + units
    if by == "cost":
        hours = s.get("device_hours_per_million_mean", np.nan)
        score = score - np.log((s["cost_per_million_mean"] / hours).to_numpy(float))
    cols["score"] = score
    return cols


def verdicts(s: pd.DataFrame, ranked: pd.Series, by: str, equivalence: float) -> pd.DataFrame:
    """`s` (a panel-sorted ranking) with VERDICTS per ranked cell, each panel at once: the
    comparison with the best's `could_be_fastest`, `mcb_low`, `mcb_high` and `slower`
    (`distinguishable` its copy, for older readers); the panel's `mdd_rel`,
    `repeats_for_5pct`, `repeats_for_2pct` and `repeats_for_equivalence` (`settle.resolution`),
    and each cell's `repeats_to_resolve` (`settle.repeats_to_resolve`: its own pair's);
    `equivalent` to the panel's best by TOST at ±`equivalence` with the panel's simultaneous
    value, none where the study's repeats cannot pass it. Cells not ranked are neither
    could-be-fastest nor slower."""
    out = {c: np.zeros(len(s), bool) if c in FLAGS else np.full(len(s), np.nan) for c in VERDICTS}
    model = model_of(s, by)
    best_of = s["fastest"].to_numpy()
    for rows in s.groupby(GROUP, sort=False).indices.values():
        at = rows[ranked.to_numpy()[rows]]
        if not len(at):
            continue
        cells = {k: v[at] for k, v in model.items()}
        var, df = cells["throughput_log_var"], cells["interval_df"]
        b = compare_with_best(cells["score"], var, df, pair_df(cells))
        found = {"could_be_fastest": b.could_be_best, "slower": b.slower,
                 "distinguishable": b.slower, "mcb_low": b.low, "mcb_high": b.high}  # fmt: skip
        inside = b.compared
        top = int(np.flatnonzero(best_of[at])[0])
        d = cells["score"] - cells["score"][top]
        n = cells["throughput_n"]
        told = resolution(var[inside], df[inside], n[inside], equivalence)
        found |= told
        found["repeats_to_resolve"] = repeats_to_resolve(var, df, n, -d, top, inside)
        n0 = float(np.median(cells["throughput_n"][inside])) if inside.any() else np.nan
        can = told["repeats_for_equivalence"] <= n0  # else TOST cannot succeed: none marked
        c = simultaneous(var, df, inside, TOST_LEVEL)
        found["equivalent"] = can & equivalent(d, var + var[top], float(c), equivalence)
        found["equivalent"][top] = False
        for col, value in found.items():
            out[col][at] = value
    return s.assign(**out)


#: The fastest cell's columns that `fastest` keeps.
_WINNER = [
    *(k for k in MATRIX_KEYS if k not in ("model", "dataset")),  # the cell's keys
    "throughput_mean", "throughput_ci95", "mfu_mean", "tokens_per_second_mean", "speedup",
    "efficiency", "efficiency_kind", "speedup_vs_single", "baseline_note", "oversubscribed",
    "logical", "ok", "runs", "rate_mean", "rate_gmean", "rate_gci95", "throughput_gmean",
    "unit", "mdd_rel", "repeats_for_5pct",
    "repeats_for_2pct",
]  # fmt: skip


def fastest(
    scaling: pd.DataFrame, equivalence: float = EQUIVALENCE, ranked: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Per model, dataset and N (the ranking by throughput's panels): the fastest cell, its
    efficiency, `could_be` (the cells that could be the fastest, as "a, b"), and the best
    cell of another strategy, the runner-up: its throughput (`runner_up_throughput`, in
    samples/s), `margin` (how much faster the fastest is, in the panel's unit), `distinct`
    (whether it is slower than the fastest: the comparison with the best) and `settle` (the
    ranking's words for it). `ranked`: `ranking(scaling, "throughput", equivalence)` where
    the caller has it already (at 10,000 runs each ranking is half a second)."""
    r = ranking(scaling, equivalence=equivalence) if ranked is None else ranked
    if not len(r) or not r["fastest"].any():
        return pd.DataFrame(columns=[*GROUP, "strategy"])
    win = r[r["fastest"]]
    win = win[[*GROUP, *(c for c in _WINNER if c in r.columns)]].set_index(GROUP)
    ranked = r[r["rank"].notna()]
    won = win["strategy"].reindex(pd.MultiIndex.from_frame(ranked[GROUP])).to_numpy()
    runner = ranked[ranked["strategy"].to_numpy() != won].drop_duplicates(GROUP).set_index(GROUP)
    win["could_be"] = (
        ranked[ranked["could_be_fastest"]]
        .groupby(GROUP)["strategy"]
        .agg(lambda v: ", ".join(dict.fromkeys(v)))
    )
    win["runner_up"] = runner["strategy"]
    win["runner_up_throughput"] = runner["throughput_mean"]
    win["margin"] = win["rate_gmean"] / runner["rate_gmean"] - 1
    win["distinct"] = runner["slower"].astype(object)
    win["settle"] = runner["settle"]
    out = win.reset_index()
    out["distinct"] = out["distinct"].astype(object).where(out["distinct"].notna(), None)
    out["settle"] = out["settle"].astype(object).where(out["settle"].notna(), "")
    return out
