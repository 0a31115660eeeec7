"""The ranking: per model, dataset and N, every cell with ok runs sorted by mean steady
throughput, each compared with the fastest by the 95% interval of their difference, and, where
that cannot tell them apart, what would (the definitions are the bullets "ranking",
"distinguishable" and "what would settle it" in `trainscale.analysis.aggregate`'s docstring,
quoted in Methods; `trainscale.analysis.settle` decides them).

Only ok runs count (a cell's means are over its ok runs; a cell without one has no throughput
and is not in the ranking), so a status that is not ok is never ranked. Cells on logical CPU
devices are listed where their throughput puts them but never ranked, as `fastest` never picks
them; a strategy whose results need a note beside them (tf-ps: asynchronous) carries its
catalog mark, as in the tables.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainscale.analysis.cells import rate
from trainscale.analysis.settle import verdicts
from trainscale.plan import catalog

#: A ranking's facet: the cells compared with each other.
GROUP = ["model", "dataset", "world_size"]


#: What a ranking may order by (config `report.rank_by`): the column ranked, its CI, and
#: whether higher is better.
BY = {
    "throughput": ("rate_mean", "rate_ci95", True),
    "cost": ("cost_per_million_mean", "cost_per_million_ci95", False),
}


def ranking(scaling: pd.DataFrame, by: str = "throughput") -> pd.DataFrame:
    """One row per cell with a mean throughput, grouped by GROUP, best first: `rate_mean` and
    `rate_ci95` in the data's `unit` (tokens/s on token data, else samples/s), `mfu_mean` and
    `mfu_ci95` where recorded; `value`, `value_ci95` and `value_unit`, the figure ranked
    (`by`: throughput, the highest first, or cost per million, the lowest first; a cell
    without it is listed last, unranked); `rank` (1 = best; NaN for logical devices and
    unpriced cells), `fastest` (the best: the fastest, or the cheapest by cost),
    `distinguishable` (True: the 95% interval of the log difference from the best excludes
    0; False: it does not; None: the best itself, a logical cell, or an interval missing),
    for a False its `repeats_needed`, `steps_factor_needed` and `settle` (the words: what would
    settle it, or that the difference is below the harness's resolution), `behind` (how much
    worse than the best, a fraction: 1 − x / x_best for throughput, x / x_best − 1 for cost),
    `interval_method`, `logical`, `mark` (the catalog's results_mark), `oversubscribed` and
    `ranked_by`."""
    cols = [*GROUP, "strategy", "rank", "rate_mean", "rate_ci95", "unit", "distinguishable"]
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
    for col in ("mfu_mean", "mfu_ci95", "cost_per_million_mean", "cost_per_million_ci95"):
        if col not in s:
            s[col] = np.nan
    mean, ci, higher = BY[by]
    s["value"], s["value_ci95"], s["ranked_by"] = s[mean], s[ci], by
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
    key = s["value"] if higher else -s["value"]
    s = s.assign(_key=key.fillna(-np.inf))
    s = s.sort_values([*GROUP, "_key"], ascending=[True, True, True, False], kind="stable")
    ranked = ~s["logical"] & s["value"].notna()
    s["rank"] = ranked.groupby([s[k] for k in GROUP]).cumsum().where(ranked)
    s["fastest"] = s["rank"] == 1
    scored = s if higher else _as_cost(s)
    top = scored[s["fastest"]].set_index(GROUP)
    ref = top.reindex(pd.MultiIndex.from_frame(s[GROUP])).set_index(s.index)
    told = verdicts(ref, scored)
    unknown = s["fastest"] | ~ranked | ref["value"].isna()
    s["distinguishable"] = told["distinguishable"].where(~unknown, None)
    for col in ("repeats_needed", "steps_factor_needed"):
        s[col] = told[col].where(~unknown)
    s["settle"] = told["settle"].where(~unknown, "")
    if "interval_method" not in s:
        s["interval_method"] = ""
    s["behind"] = 1 - s["value"] / ref["value"] if higher else s["value"] / ref["value"] - 1
    return s.drop(columns="_key").reset_index(drop=True)


def _as_cost(s: pd.DataFrame) -> pd.DataFrame:
    """The cells with their throughput columns standing for cost per million, for the pairwise
    verdict: a run's cost is its cell's price per device-hour p times N / (x · u) / 3600, so
    −log cost differs from log throughput by log p and a constant of the panel (N, u) only,
    with the same variance. Where a scaling table has no interval columns, the CI-overlap rule
    is applied to cost's own CIs (the throughput columns replaced by the negated cost)."""
    out = s.copy()
    hours = s.get("device_hours_per_million_mean", np.nan)
    price = s["cost_per_million_mean"] / hours
    if "throughput_log_mean" in s:
        out["throughput_log_mean"] = s["throughput_log_mean"] - np.log(price)
    out["throughput_mean"] = -s["cost_per_million_mean"]
    out["throughput_ci95"] = s["cost_per_million_ci95"]
    return out
