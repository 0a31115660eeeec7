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


def ranking(scaling: pd.DataFrame) -> pd.DataFrame:
    """One row per cell with a mean throughput, grouped by GROUP, fastest first: `rate_mean` and
    `rate_ci95` in the data's `unit` (tokens/s on token data, else samples/s), `mfu_mean` and
    `mfu_ci95` where recorded, `rank` (1 = fastest; NaN for logical devices), `fastest`,
    `distinguishable` (True: the 95% interval of the log difference from the fastest excludes
    0; False: it does not; None: the fastest itself, a logical cell, or an interval missing),
    for a False its `repeats_needed`, `steps_factor_needed` and `settle` (the words: what would
    settle it, or that the difference is below the harness's resolution), `interval_method`,
    `logical`, `mark` (the catalog's results_mark) and `oversubscribed`."""
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
    for col in ("mfu_mean", "mfu_ci95"):
        if col not in s:
            s[col] = np.nan
    s["logical"] = s["logical"].fillna(False).astype(bool) if "logical" in s else False
    s["oversubscribed"] = s.get("oversubscribed", False)
    s["mark"] = s["strategy"].map(
        lambda n: catalog.STRATEGIES[n].results_mark if n in catalog.STRATEGIES else ""
    )
    s = s.sort_values([*GROUP, "rate_mean"], ascending=[True, True, True, False], kind="stable")
    ranked = ~s["logical"]
    s["rank"] = ranked.groupby([s[k] for k in GROUP]).cumsum().where(ranked)
    s["fastest"] = s["rank"] == 1
    top = s[s["fastest"]].set_index(GROUP)
    ref = top.reindex(pd.MultiIndex.from_frame(s[GROUP])).set_index(s.index)
    told = verdicts(ref, s)
    unknown = s["fastest"] | s["logical"] | ref["rate_mean"].isna()
    s["distinguishable"] = told["distinguishable"].where(~unknown, None)
    for col in ("repeats_needed", "steps_factor_needed"):
        s[col] = told[col].where(~unknown)
    s["settle"] = told["settle"].where(~unknown, "")
    if "interval_method" not in s:
        s["interval_method"] = ""
    s["behind"] = 1 - s["rate_mean"] / ref["rate_mean"]
    return s.reset_index(drop=True)
