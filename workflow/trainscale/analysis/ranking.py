"""The ranking: per model, dataset and N, every cell with ok runs sorted by mean steady
throughput, each compared with the fastest by their 95% confidence intervals (the definition is
the bullet "ranking" in `trainscale.analysis.aggregate`'s docstring, quoted in Methods).

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
from trainscale.plan import catalog

#: A ranking's facet: the cells compared with each other.
GROUP = ["model", "dataset", "world_size"]


#: What a ranking may order by (config `report.rank_by`): the figure it draws, its CI, whether
#: higher is better, and its unit (None: the data's rate unit).
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
    `distinguishable` (True: CIs disjoint from the best's; False: they overlap; None: the best
    itself, a logical cell, or a CI missing), `behind` (how much worse than the best, a
    fraction: 1 − x / x_best for throughput, x / x_best − 1 for cost), `logical`, `mark` (the
    catalog's results_mark), `oversubscribed` and `ranked_by`."""
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
    top = s[s["fastest"]].set_index(GROUP)[["value", "value_ci95"]]
    ref = s[GROUP].merge(top, left_on=GROUP, right_index=True, how="left").set_index(s.index)
    if higher:  # the best's interval wholly above the cell's
        apart = (ref["value"] - ref["value_ci95"]) > (s["value"] + s["value_ci95"])
        s["behind"] = 1 - s["value"] / ref["value"]
    else:  # wholly below
        apart = (ref["value"] + ref["value_ci95"]) < (s["value"] - s["value_ci95"])
        s["behind"] = s["value"] / ref["value"] - 1
    distinct = apart.astype(object)
    unknown = ref["value_ci95"].isna() | s["value_ci95"].isna() | s["fastest"] | ~ranked
    distinct[unknown] = None
    s["distinguishable"] = distinct
    return s.drop(columns="_key").reset_index(drop=True)
