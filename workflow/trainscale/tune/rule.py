"""A round of the tune: its runs' records (every round's so far) as the race's evidence,
`trainscale.tune.race.decide` on it, the budget in worker-hours, and the round's result: each
cell's estimate, interval, decision and reason, the runs of the next round, what was spent,
and why the tune ends, if it does (results/<study>/tune/round~R/round.json).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from trainscale.analysis.flags import LOGICAL
from trainscale.analysis.metrics_tables import run_id
from trainscale.tune import evidence, race
from trainscale.tune.race import BEST, GO_ON, STOPPED
from trainscale.tune.records import CellDecision, FailedRun, Round, RoundZero, TriedCell
from trainscale.tune.space import Prices, Settings, cell_of

__all__ = ["BEST", "GO_ON", "STOPPED", "over_budget", "round_result"]
#: A cost estimate's scale: per million units, a device-hour's price per hour.
PER_MILLION_HOURS = evidence.MILLION / evidence.HOUR


def pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def all_runs(
    records: list[tuple[int, str, dict]], invalid: list[tuple[int, str, str]], prices: Prices
) -> pd.DataFrame:
    """Every run made so far, in the order made (round, repeat): `evidence.runs_table`'s rows,
    and a row of status "invalid" for each file that was no valid record."""
    runs = evidence.runs_table(records, prices)
    bad = []
    for r, path, why in invalid:
        run = run_id(path)
        bad.append({"cell": cell_of(run), "round": r, "repeat": int(run.rsplit("~", 1)[1]),
                    "status": "invalid", "error": why.split("\n")[0]})  # fmt: skip
    if bad:
        runs = pd.concat([runs, pd.DataFrame(bad)], ignore_index=True)
    return runs.sort_values(["round", "repeat", "cell"], kind="stable").reset_index(drop=True)


def log_objective(runs: pd.DataFrame, objective: str) -> pd.Series:
    """Each run's y: log throughput in the data's units, or for cost −log of its device-hours
    (× price) per unit; NaN unless ok."""
    units = np.where(runs["seq_len"].fillna(0) > 0, runs["seq_len"], 1).astype(float)
    y = np.log(pd.to_numeric(runs["throughput"], errors="coerce")) + np.log(units)
    if objective == "cost":
        y -= np.log(runs["world_size"].astype(float) * runs["price"].fillna(1.0))
    return y


def excluded(space: RoundZero, runs: pd.DataFrame) -> dict[str, str]:
    """Cells the race never compares, with why: logical CPU devices (`flags.LOGICAL`), and
    every cell of a cost panel that mixes priced and unpriced devices."""
    out = {}
    for cell in runs.loc[runs["logical"].fillna(False).astype(bool), "cell"]:
        out[cell] = f"{LOGICAL.note}; never ranked"
    if space.settings.objective != "cost":
        return out
    ok = runs[runs["status"] == "ok"]  # a cell without an ok run says nothing of its device
    priced = ok.groupby("cell")["price"].apply(lambda p: p.notna().any())
    for panel in {c.panel_label for c in space.cells}:
        cells = [c.cell for c in space.cells if c.panel_label == panel]
        known = priced.reindex(cells).dropna()
        if known.any() and not known.all():
            unpriced = ", ".join(sorted(known.index[~known.astype(bool)]))
            why = (
                f"the panel mixes priced and unpriced devices ({unpriced} has no "
                "cost.device_hour price): give every device a price, or tune by throughput"
            )
            out.update(dict.fromkeys(cells, why))  # fmt: skip
    return out


def round_result(
    space: RoundZero,
    number: int,
    records: list[tuple[int, str, dict]],
    previous: Round | None,
    invalid: Sequence[tuple[int, str, str]] = (),
) -> Round:
    """Round `number`'s result from round 0's `space` (round~0/space.json), the records of
    every run of rounds 1..`number` ((round, path, record)), the previous round's result
    (None in round 1; the race replays every run, so it reads none of it), and the files that
    were no valid record ((round, path, why): counted as spent, no evidence)."""
    settings = space.settings
    runs = all_runs(records, invalid, Prices.from_config({"cost": space.cost}))
    runs["y"] = log_objective(runs, settings.objective)
    info = {c.cell: c for c in space.cells}
    decided = race_decisions(space, runs)
    table = evidence.cells_table(runs[runs["status"].notna() & runs["world_size"].notna()],
                                 settings.objective, space.grid).reindex(list(info))  # fmt: skip
    now = runs[runs["round"] == number]
    table["worker_seconds"] = now.groupby("cell")["worker_seconds"].sum()
    spent = float(runs["worker_seconds"].fillna(0).sum())
    done = over_budget(decided, table, settings, spent)
    if done:
        stop_for_budget(decided, done)
    made = runs.groupby("cell").size().reindex(list(info)).fillna(0).astype(int)
    going = decided.index[decided["next_runs"] > 0]
    failed = now[now["status"] != "ok"][["cell", "repeat", "status", "error"]]
    return Round(
        round=number,
        steady_epochs=settings.epochs,
        steps_per_epoch=settings.steps_per_epoch,
        cells=[
            cell_row(c, decided.loc[c.cell], table.loc[c.cell], runs, settings.objective)
            for c in info.values()
        ],  # fmt: skip
        failed=[FailedRun(**f) for f in failed.astype({"repeat": int}).to_dict("records")],
        runs=len(now),
        worker_seconds=float(now["worker_seconds"].fillna(0).sum()),
        spent_runs=len(runs),
        spent_worker_seconds=spent,
        next={c: list(range(made[c], made[c] + int(decided.loc[c, "next_runs"]))) for c in going},
        done=done or (None if len(going) else ending(decided)),
    )


def race_decisions(space: RoundZero, runs: pd.DataFrame) -> pd.DataFrame:
    """`race.decide` on every cell it compares (index: cell), each run with its round (the
    looks take the rounds' drift out of the comparison); the cells it never compares
    (`excluded`) stopped with why."""
    out = excluded(space, runs)
    raced = [c for c in space.cells if c.cell not in out]
    cells = race.cells_frame([{"cell": c.cell, "panel": c.panel_label, "stratum": c.stratum}
                              for c in raced])  # fmt: skip
    ev = runs[runs["cell"].isin([c.cell for c in raced])].rename(
        columns={"within_run_var": "w", "within_run_blocks": "k"}
    )[[*race.EVIDENCE_COLUMNS, race.ROUND]]
    decided = race.decide(cells, ev, space.settings).set_index("cell")
    for cell, why in out.items():
        decided.loc[cell, ["decision", "reason", "next_runs"]] = STOPPED, why, 0
    return decided


def ending(decided: pd.DataFrame) -> str:
    """Why a race that asks no more runs ended: its budget, where a panel's reason names it."""
    budget = decided["reason"].str.extract(r"(budget: [^;]*)", expand=False).dropna()
    return budget.iloc[0] if len(budget) else "every panel has its winning set"


def cell_row(
    tried: TriedCell, decided: pd.Series, table: pd.Series, runs: pd.DataFrame, objective: str
) -> CellDecision:
    """A cell's row of round.json: the race's decision, its estimate in the objective's unit."""
    mine = runs[runs["cell"] == tried.cell]
    est, low, high = (float(decided[k]) for k in ("estimate", "ci_low", "ci_high"))
    if objective == "cost":
        est, low, high = (PER_MILLION_HOURS * math.exp(-v) for v in (est, high, low))
    else:
        est, low, high = (math.exp(v) for v in (est, low, high))
    unit = table.get("unit")
    return CellDecision(
        cell=tried.cell,
        values=tried.values,
        world_size=tried.world_size,
        panel=tried.panel_label,
        runs=len(mine),
        ran=int((mine["round"] == mine["round"].max()).sum()) if len(mine) else 0,
        ok=int((mine["status"] == "ok").sum()),
        estimate=finite(est),
        ci_low=finite(low),
        ci_high=finite(high),
        score=finite(decided["estimate"]),
        worker_seconds=finite(table.get("worker_seconds")),
        grid_seconds=finite(table.get("grid_seconds")),
        price=finite(table.get("price")),
        unit=unit if isinstance(unit, str) else "",
        decision=decided["decision"],
        reason=decided["reason"],
    )


def over_budget(
    decided: pd.DataFrame, table: pd.DataFrame, settings: Settings, seconds: float
) -> str | None:
    """Why the next round's runs would pass tune.max_worker_hours, having spent `seconds`
    worker-seconds (None: they fit): each run's set-up and warm-up and its steady epochs at
    its cell's measured seconds (tune.max_runs is the race's own)."""
    asked = decided["next_runs"]
    if settings.max_worker_hours is None or not (asked > 0).any():
        return None
    t = table.reindex(decided.index)
    each = t["next_seconds"] + settings.epochs * t["steady_epoch_seconds"]
    predicted = float((asked * each * t["world_size"]).where(asked > 0, 0.0).sum())
    if not math.isfinite(predicted) or seconds + predicted > settings.max_worker_hours * 3600:
        return (
            f"budget: the next round's {int(asked.sum())} runs, "
            f"{evidence.hours(predicted):.3g} worker-hours predicted, would pass "
            f"tune.max_worker_hours {settings.max_worker_hours:g} "
            f"({evidence.hours(seconds):.3g} spent)"
        )
    return None


def stop_for_budget(decided: pd.DataFrame, why: str) -> None:
    """End the race where it stands: the cells going on join the winners, and no run is
    made, so a winner without its confirmation runs keeps a biased estimate."""
    going = decided["decision"] == GO_ON
    decided.loc[going, "decision"] = BEST
    waiting = (decided["decision"] == BEST) & ((decided["next_runs"] > 0) | going)
    pending = decided.loc[waiting, "reason"].str.replace(r"; selected: biased up until.*$", "",
                                                         regex=True)  # fmt: skip
    decided.loc[waiting, "reason"] = pending + f"; {why}; {race.BIASED}"
    decided["next_runs"] = 0


def finite(v: object) -> float | None:
    """A number for JSON: None where it is missing or not finite."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None
