"""What a tune's records say of its cells: one row per run, then one per cell with its
estimate, interval and the model's columns the comparison with the best reads, and what its
runs cost, measured and predicted.

The statistics are the study's (`trainscale.analysis.interval`): a cell's runs of every round
so far are its repeats, each with its own within-run variance from its steady epochs' blocks;
the run-to-run variance is pooled over alike strata of the cells given together.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from trainscale.analysis import cost
from trainscale.analysis.interval import (
    cell_intervals,
    stratum_of,
    t_quantile,
    within_variance,
)
from trainscale.analysis.metrics_tables import run_id
from trainscale.tune.records import Grid
from trainscale.tune.space import Prices, cell_of

#: Seconds in an hour; units in a million.
HOUR, MILLION = 3600.0, 1e6
#: `runs_table`'s columns (the device's and spec's as analysis.cost reads them).
RUN_COLUMNS = ["cell", "round", "repeat", "status", "error", "world_size", "seq_len", "logical",
               "throughput", "within_run_var", "within_run_blocks", "stratum", "wall_seconds",
               "worker_seconds", "fixed_seconds", "first_epoch_seconds", "steady_epoch_seconds",
               "step_seconds", "tune_steps", "train_samples", "global_batch_size",
               "spec.seq_len", "spec.world_size", "spec.threads_per_worker", "device.kind",
               "device.name"]  # fmt: skip


def runs_table(records: list[tuple[int, str, dict]], prices: Prices | None) -> pd.DataFrame:
    """One row per (round, metrics path, record): its cell, round, repeat, status and first
    line of error; `throughput` (NaN unless ok), `within_run_var`, `within_run_blocks`,
    `stratum`; `worker_seconds` (world_size × wall_seconds); the seconds the cost predictions
    read (`fixed_seconds`: wall time outside the epochs; first and steady epoch seconds,
    steady seconds per step, `tune_steps`: the steps of its epochs); and `price`, one device-
    hour's price at `prices` (NaN where none applies)."""
    rows = []
    for number, path, rec in records:
        s, epochs = rec["spec"], rec.get("epochs") or []
        ok = rec["status"] == "ok"
        w, k = within_variance(epochs) if ok else (None, 0)
        kind = (rec.get("device") or {}).get("kind")
        wall = rec.get("wall_seconds")
        steady = [e for e in epochs[1:] if e.get("steps")]
        rows.append({
            "cell": cell_of(run_id(path)),
            "round": number,
            "repeat": s["repeat"],
            "status": rec["status"],
            "error": (rec.get("error") or "").strip().split("\n")[0],
            "world_size": s["world_size"],
            "seq_len": s.get("seq_len") or 0,
            "logical": bool((rec.get("device") or {}).get("logical")),
            "throughput": rec.get("throughput") if ok else np.nan,
            "within_run_var": np.nan if w is None else w,
            "within_run_blocks": k,
            "stratum": stratum_of(s["strategy"], s["world_size"], kind or ""),
            "wall_seconds": np.nan if wall is None else wall,
            "worker_seconds": np.nan if wall is None else wall * s["world_size"],
            "fixed_seconds": np.nan if wall is None or not epochs
            else wall - sum(e["seconds"] for e in epochs),
            "first_epoch_seconds": rec.get("first_epoch_seconds") if ok else np.nan,
            "steady_epoch_seconds": rec.get("steady_epoch_seconds") if ok else np.nan,
            "step_seconds": np.mean([e["seconds"] / e["steps"] for e in steady])
            if ok and steady else np.nan,
            "tune_steps": epochs[0]["steps"] if epochs else np.nan,
            "train_samples": (rec.get("data") or {}).get("train_samples"),
            "global_batch_size": s["global_batch_size"],
            "spec.seq_len": s.get("seq_len") or 0,
            "spec.world_size": s["world_size"],
            "spec.threads_per_worker": s["threads_per_worker"],
            "device.kind": kind,
            "device.name": (rec.get("device") or {}).get("name"),
        })  # fmt: skip
    runs = pd.DataFrame(rows, columns=RUN_COLUMNS)
    priced = cost.run_costs(runs.assign(throughput=1.0), prices)
    runs["price"] = priced["cost_per_million"] / priced["device_hours_per_million"]
    return runs


def cells_table(runs: pd.DataFrame, objective: str, grid: Grid) -> pd.DataFrame:
    """One row per cell of `runs` (index: cell): `n` ok runs, `runs`, `statuses`, `logical`,
    the interval model's CELL_COLUMNS and `throughput_n` (interval.pair_df reads them),
    `score` (the log objective, higher better: log throughput in the data's unit, minus
    ln(N × price per device-hour) for cost), `estimate`, `ci_low`, `ci_high` and `unit`;
    `worker_seconds` spent over all its runs, `next_seconds` (a run's set-up and warm-up; add
    the steady epochs' `steady_epoch_seconds`) and `grid_seconds`, one of the study's own runs
    of the cell (`grid`: its epochs and steps_per_epoch) predicted."""
    d = runs.copy()
    by = d.groupby("cell", sort=True)
    out = cell_intervals(d, ["cell"]).drop(columns="ci95_rel")
    out["n"] = by["throughput"].count()
    out["throughput_n"] = out["n"]
    out["runs"] = by.size()
    out["statuses"] = by["status"].agg(
        lambda v: ", ".join(f"{n} {s}" for s, n in v.value_counts().sort_index().items())
    )
    out["logical"] = by["logical"].any()
    out["world_size"] = by["world_size"].first()
    out["seq_len"] = by["seq_len"].first()
    out["price"] = by["price"].first()
    out["worker_seconds"] = by["worker_seconds"].sum()
    ok = d[d["throughput"].notna()].groupby("cell")
    out["next_seconds"] = ok["fixed_seconds"].max() + ok["first_epoch_seconds"].max()
    out["steady_epoch_seconds"] = ok["steady_epoch_seconds"].mean()
    out["grid_seconds"] = grid_seconds(ok, grid)
    units = np.where(out["seq_len"] > 0, out["seq_len"], 1).astype(float)
    ybar = out["throughput_log_mean"].to_numpy(float)
    half = t_quantile(out["interval_df"].to_numpy(float)) * np.sqrt(
        out["throughput_log_var"].to_numpy(float)
    )
    rate = np.exp(ybar) * units
    low, high = np.exp(ybar - half) * units, np.exp(ybar + half) * units
    kind = np.where(out["seq_len"] > 0, "tokens", "samples")
    if objective == "throughput":
        out["score"] = ybar + np.log(units)
        out["estimate"], out["ci_low"], out["ci_high"] = rate, low, high
        out["unit"] = [f"{k}/s" for k in kind]
        return out
    price = out["price"].fillna(1.0).to_numpy(float)
    per = out["world_size"].to_numpy(float) * price * MILLION / HOUR
    out["score"] = ybar + np.log(units) - np.log(out["world_size"].to_numpy(float) * price)
    out["estimate"], out["ci_low"], out["ci_high"] = per / rate, per / high, per / low
    money = out["price"].notna().to_numpy()
    out["unit"] = [f"{'cost' if m else 'device-hours'} per million {k}"
                   for m, k in zip(money, kind, strict=True)]  # fmt: skip
    return out


def grid_seconds(ok: pd.core.groupby.DataFrameGroupBy, grid: Grid) -> pd.Series:
    """Per cell: the wall seconds of one of the study's own runs (`grid`'s epochs, each of
    the data set's steps up to its steps_per_epoch), predicted from the cell's ok tune runs:
    their set-up and first epoch as measured, every further step at their steady seconds per
    step (evaluation left out)."""
    full = (ok["train_samples"].first() // ok["global_batch_size"].first()).astype(float)
    if grid.steps_per_epoch:
        full = full.clip(upper=grid.steps_per_epoch)
    step = ok["step_seconds"].mean()
    first = ok["first_epoch_seconds"].max() + (full - ok["tune_steps"].max()).clip(lower=0) * step
    return ok["fixed_seconds"].max() + first + (grid.epochs - 1) * full * step


#: The model's columns the comparison with the best reads (interval.Fit.columns's names).
MODEL_COLUMNS = ("throughput_n", "throughput_log_var", "interval_df", "within_run_var",
                 "within_run_df", "between_run_var", "pooled_run_var", "pooled_df",
                 "variance_pool")  # fmt: skip


def model_columns(cells: pd.DataFrame) -> dict[str, np.ndarray]:
    """The cells' MODEL_COLUMNS as arrays, as interval.pair_df reads them."""
    return {c: pd.to_numeric(cells[c], errors="coerce").to_numpy(float) for c in MODEL_COLUMNS}


def hours(seconds: float) -> float:
    return seconds / HOUR if seconds is not None and math.isfinite(seconds) else math.nan
