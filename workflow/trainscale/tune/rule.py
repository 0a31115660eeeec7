"""The stop rule of a round (the bullets "stop rule" and "end" of `trainscale.tune`'s
docstring), and a round's result: each cell's estimate, interval, decision and reason, the
cells that go on, what was spent, and why the tune ends, if it does.

`decide` works on a table of cells (`evidence.cells_table`'s columns), so the elimination rule
is tested on simulated cells as it runs on records; `round_result` is what the workflow's
checkpoint of each round writes (results/<study>/tune/round~R/round.json).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from trainscale.analysis.best import compare_with_best
from trainscale.analysis.interval import pair_df
from trainscale.analysis.metrics_tables import run_id
from trainscale.tune import evidence
from trainscale.tune.space import Prices, Settings, cell_of

GO_ON, STOPPED, BEST = "go on", "stopped", "best"


def pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def behind(theta: float) -> str:
    """A log difference from the best as a share behind it: "12 %"."""
    return pct(-math.expm1(theta))


def decide(cells: pd.DataFrame, round: int, eta: int) -> pd.DataFrame:
    """`cells` (one row per cell of the round: `panel`, `n` ok runs, `logical`, `statuses`,
    `score`, the interval model's columns) with `decision` (go on, stopped or best),
    `reason`, `mcb_low` and `mcb_high` (the comparison with the best's interval of the
    cell's log objective minus the best of the others), panel by panel."""
    out = cells.assign(decision=GO_ON, reason="", mcb_low=np.nan, mcb_high=np.nan)
    for _, rows in out.groupby("panel", sort=False).groups.items():
        decide_panel(out, list(rows), round, eta)
    return out


def decide_panel(out: pd.DataFrame, rows: list, round: int, eta: int) -> None:
    """`decide` for one panel's rows of `out`, in place."""
    p = out.loc[rows]
    failed = p.index[p["n"] == 0]
    out.loc[failed, "decision"] = STOPPED
    out.loc[failed, "reason"] = "no ok run (" + p.loc[failed, "statuses"] + ")"
    logical = p.index[(p["n"] > 0) & p["logical"]]
    out.loc[logical, "decision"] = STOPPED
    out.loc[logical, "reason"] = "logical CPU devices: a code path check, never ranked"
    alive = p[(p["n"] > 0) & ~p["logical"]]
    if not len(alive):
        return
    cols = evidence.model_columns(alive)
    b = compare_with_best(alive["score"].to_numpy(float), cols["throughput_log_var"],
                          cols["interval_df"], pair_df(cols))  # fmt: skip
    out.loc[alive.index, "mcb_low"], out.loc[alive.index, "mcb_high"] = b.low, b.high
    stopped = len(failed) + len(logical)
    for cell, low, high in zip(alive.index[b.slower], b.low[b.slower], b.high[b.slower],
                               strict=True):  # fmt: skip
        why = f"slower than the panel's best: {behind(high)} to {behind(low)} behind (95 %)"
        out.loc[cell, ["decision", "reason"]] = STOPPED, why
        stopped += 1
    rest = alive[~b.slower].sort_values("score", ascending=False, kind="stable")
    cap = max(2, math.ceil(len(rows) / eta))
    for cell in rest.index[cap:]:
        why = (
            f"could still be the best, but not among the {cap} best estimates of the panel's "
            f"{len(rows)} cells (successive halving: at most 1/{eta} go on)"
        )
        out.loc[cell, ["decision", "reason"]] = STOPPED, why
        stopped += 1
    left = rest.index[:cap]
    why = could_be(out.loc[left])
    if len(left) == 1:
        out.loc[left, ["decision", "reason"]] = BEST, "the only cell left that could be the best"
    elif round >= 2 and stopped == 0:
        out.loc[left, "decision"] = BEST
        out.loc[left, "reason"] = (
            why + f"; round {round} stopped none of the panel's cells: the set stopped shrinking"
        )
    else:
        out.loc[left, "reason"] = why


def could_be(rows: pd.DataFrame) -> pd.Series:
    """The words for cells that could be the best: how far behind or ahead of the best of the
    others they could be (the comparison with the best's interval)."""

    def words(low: float, high: float) -> str:
        if not (np.isfinite(low) and np.isfinite(high)):
            return "could be the best (one run: no interval yet)"
        lo = f"{behind(low)} behind" if low < 0 else f"{pct(math.expm1(low))} ahead"
        return f"could be the best (95 %: from {lo} to {pct(math.expm1(high))} ahead of the others)"

    pairs = zip(rows["mcb_low"], rows["mcb_high"], strict=True)
    return pd.Series([words(lo, hi) for lo, hi in pairs], index=rows.index, dtype=object)


def round_result(
    space: dict,
    round: int,
    records: list[tuple[int, str, dict]],
    previous: dict | None,
    invalid: list[tuple[int, str, str]] = (),
) -> dict:
    """Round `round`'s result from round 0's `space` (round~0/space.json), the records of
    its cells' runs in this round and every earlier one ((round, path, record)), the
    previous round's result (None in round 1), and the files of this round that were no
    valid record ((round, path, why): reported among the failed runs, no evidence)."""
    settings = Settings(**space["settings"])
    prices = Prices.from_config({"cost": space.get("cost")})
    info = {c["cell"]: c for c in space["cells"]}
    this = previous["next"] if previous else list(info)
    runs = evidence.runs_table(records, prices)
    runs = runs[runs["cell"].isin(this)]
    cells = evidence.cells_table(runs, settings.objective, space["grid"])
    cells = cells.reindex(this)
    cells["panel"] = [info[c]["panel_label"] for c in this]
    for col, empty in (("n", 0), ("runs", 0), ("logical", False), ("statuses", "no record")):
        cells[col] = cells[col].fillna(empty)
    now = runs[runs["round"] == round]
    cells["worker_seconds"] = now.groupby("cell")["worker_seconds"].sum()  # this round's
    decided = decide(cells, round, settings.eta)
    spent_runs = (previous["spent_runs"] if previous else 0) + len(now)
    spent = (previous["spent_worker_seconds"] if previous else 0.0) + float(
        now["worker_seconds"].fillna(0).sum()
    )
    going = decided.index[decided["decision"] == GO_ON]
    done = None
    if len(going):
        over = over_budget(decided.loc[going], round + 1, settings, spent_runs, spent)
        if over:
            done = over
            decided.loc[going, "decision"] = BEST
            decided.loc[going, "reason"] += "; " + over
            going = going[:0]
    else:
        done = "every panel has its winning set"
    rows = []
    for cell, r in decided.iterrows():
        rows.append({
            "cell": cell, "values": info[cell]["values"], "world_size": info[cell]["world_size"],
            "panel": r["panel"], "runs": int(r["runs"]), "ok": int(r["n"]),
            **{k: finite(r.get(k)) for k in ("estimate", "ci_low", "ci_high", "mcb_low",
                                             "mcb_high", "score", "worker_seconds",
                                             "grid_seconds", "price")},
            "unit": r.get("unit") if isinstance(r.get("unit"), str) else "",
            "decision": r["decision"], "reason": r["reason"],
        })  # fmt: skip
    failed = now[now["status"] != "ok"][["cell", "repeat", "status", "error"]].to_dict("records")
    for r, path, why in invalid:
        if r == round:
            run = run_id(path)
            failed.append({"cell": cell_of(run), "repeat": int(run.rsplit("~", 1)[1]),
                           "status": "invalid", "error": why.split("\n")[0]})  # fmt: skip
    return {
        "round": round,
        "steady_epochs": settings.steady_epochs(round),
        "steps_per_epoch": settings.steps_per_epoch,
        "cells": rows,
        "failed": failed,
        "runs": len(now),
        "worker_seconds": float(now["worker_seconds"].fillna(0).sum()),
        "spent_runs": spent_runs,
        "spent_worker_seconds": spent,
        "next": list(going),
        "done": done,
    }


def over_budget(
    going: pd.DataFrame, round: int, settings: Settings, runs: int, seconds: float
) -> str | None:
    """Why round `round` of the cells `going` would pass the tune's budget, having spent
    `runs` runs and `seconds` worker-seconds (None: it fits). Its runs are one per cell; its
    worker-seconds are predicted, each run's set-up and warm-up and its steady epochs at the
    cell's measured seconds."""
    more = len(going)
    if settings.max_runs is not None and runs + more > settings.max_runs:
        return (
            f"budget: round {round}'s {more} runs would pass tune.max_runs "
            f"{settings.max_runs} ({runs} run{'s' * (runs != 1)} so far)"
        )
    if settings.max_worker_hours is None:
        return None
    each = going["next_seconds"] + settings.steady_epochs(round) * going["steady_epoch_seconds"]
    predicted = float((each * going["world_size"]).sum())
    if not math.isfinite(predicted) or seconds + predicted > settings.max_worker_hours * 3600:
        return (
            f"budget: round {round}'s {more} runs, {evidence.hours(predicted):.3g} worker-hours "
            f"predicted, would pass tune.max_worker_hours {settings.max_worker_hours:g} "
            f"({evidence.hours(seconds):.3g} spent)"
        )
    return None


def finite(v: object) -> float | None:
    """A number for JSON: None where it is missing or not finite."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None
