"""Cell statistics: the per-cell figures of scaling.csv (mean, std and 95% CI over repeats,
speedup, efficiency, the baselines, the ranking's verdicts) and the per-epoch convergence
table. docs/methods.md states every formula."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from trainscale.analysis import cost
from trainscale.analysis.interval import STEPS, cell_intervals, stratum_of, t975
from trainscale.analysis.ranking import EQUIVALENCE, with_verdicts
from trainscale.measure.datawait import INPUT_BOUND_SHARE
from trainscale.plan.matrix import MATRIX_KEYS
from trainscale.plan.prices import Prices
from trainscale.plan.runspec import OUT_OF_PATH

#: A cell: every matrix value but the repeat.
CELL = list(MATRIX_KEYS)
#: What a cell shares with its N = 1 baseline (all of CELL but workers, nodes and tp: torch-tp
#: splits over all ranks, so its tp is N and its baseline the one-rank run at tp 1).
BASELINE = [k for k in CELL if k not in ("workers", "nodes", "tp")]
#: What a cell shares with the best single-process cell of any strategy.
SINGLE = BASELINE[1:]

#: scaling.csv metric -> runs.csv column; each gets _n, _mean, _std and _ci95 columns.
METRICS = {
    "throughput": "throughput",
    "throughput_per_worker": "throughput_per_worker",
    "first_epoch_seconds": "first_epoch_seconds",
    "steady_epoch_seconds": "steady_epoch_seconds",
    "first_epoch_overhead_seconds": None,  # first − steady, per run
    "test_accuracy": "test.accuracy",
    "time_to_accuracy_seconds": "time_to_accuracy_seconds",
    "peak_host_rss_bytes": "memory.peak_host_rss_bytes",
    "peak_device_bytes": "memory.peak_device_bytes",
    "data_wait_share": "data_wait_share",
    "mfu": "flops.mfu",
    "hfu": "flops.hfu",
    "tokens_per_second": "tokens_per_second",
    # per run from its record (trainscale.analysis.cost), so records of any age get them
    **{name: name for name in cost.FIGURES},
}
#: Metrics that are, run by run, a fixed multiple of the run's throughput or of its inverse
#: within a cell (the same samples per epoch, world size, seq_len and price): their 95% CI is
#: the throughput's relative half-width (trainscale.analysis.interval) times their mean, where
#: the cell's interval uses steps and repeats. Those a table lacks are passed over.
PROPORTIONAL = ("throughput", "throughput_per_worker", "tokens_per_second",
                "device_hours_per_million", "cost_per_million")  # fmt: skip


def ci95(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, std, CI half-width) of one sample, as docs/methods.md defines them."""
    x = np.asarray([v for v in values if v is not None and not pd.isna(v)], dtype=float)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan
    std = float(x.std(ddof=1)) if n > 1 else math.nan
    return float(x.mean()), std, float(t975(n) * std / math.sqrt(n)) if n > 1 else math.nan


#: Matrix axes added after the first tables were written, and the value their runs had.
LATER_AXES = OUT_OF_PATH


def with_axes(table: pd.DataFrame, prefix: str = "spec.") -> pd.DataFrame:
    """`table` with a column for every later matrix axis (seq_len 0: an image run; tp 1; no
    activation checkpointing; no offload) where a table made before the axis has none."""
    missing = {prefix + k: v for k, v in LATER_AXES.items() if prefix + k not in table}
    return table.assign(**missing) if missing else table


def _cells_of(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs table reduced to cell keys and the per-run metrics that scaling.csv averages."""
    runs = with_axes(runs)
    d = pd.DataFrame({k: runs[f"spec.{k}"] for k in CELL})
    d["world_size"] = runs["spec.world_size"]
    d["global_batch_size"] = runs.get("spec.global_batch_size", np.nan)
    d["per_worker_batch_size"] = runs.get("spec.per_worker_batch_size", np.nan)
    d["target_accuracy"] = runs.get("spec.target_accuracy", np.nan)
    d["status"] = runs["status"]
    d["oversubscribed"] = runs["oversubscribed"].fillna(False).astype(bool)
    # tf-mirrored without GPUs runs N *logical* CPU devices in one process: a code-path check
    logical = runs["device.logical"] if "device.logical" in runs else pd.Series(False, runs.index)
    d["logical"] = logical.fillna(False).astype(bool)
    ok = d["status"] == "ok"
    d["is_ok"] = ok
    for col in (
        "predicted_peak_bytes",
        "memory_error",
        "predicted_reserved_bytes",
        "memory_error_reserved",
        "predicted_host_bytes",
        "host_memory_error",
    ):
        d[col] = pd.to_numeric(runs.get(col, np.nan))  # fmt: skip
    d["predicted_method"] = runs.get("memory.predicted.method", pd.Series(None, runs.index))
    for col in ("price_key", "price_note", "currency"):
        d[col] = runs[col]
    for col in ("within_run_var", "within_run_blocks"):  # NaN in tables made before them
        d[col] = pd.to_numeric(runs.get(col, pd.Series(np.nan, runs.index)), errors="coerce")
    kind = runs["device.kind"] if "device.kind" in runs else pd.Series("", index=runs.index)
    d["stratum"] = [
        stratum_of(s, n, k if isinstance(k, str) else "")
        for s, n, k in zip(d["strategy"], d["world_size"], kind, strict=True)
    ]
    for name, col in METRICS.items():
        if col is None:
            v = pd.to_numeric(runs["first_epoch_seconds"], errors="coerce") - pd.to_numeric(
                runs["steady_epoch_seconds"], errors="coerce"
            )
        else:
            v = pd.to_numeric(runs[col], errors="coerce") if col in runs else np.nan
        d[name] = pd.Series(v, index=runs.index).where(ok)
    return d


def scaling_frame(
    runs: pd.DataFrame, prices: Prices | None = None, equivalence: float = EQUIVALENCE
) -> pd.DataFrame:
    """One row per cell (scaling.csv): counts, mean/std/CI of each metric, speedup, efficiency,
    what a million units cost (in device-hours, energy, and money at `prices`), and the
    ranking's verdicts (`trainscale.analysis.ranking.VERDICTS`; TOST at ±`equivalence`).

    docs/methods.md states every formula.
    """
    if not len(runs):
        return pd.DataFrame(columns=[*CELL, "world_size", "runs", "ok"])
    d = _cells_of(runs.join(cost.run_costs(runs, prices)))
    g = d.groupby(CELL, sort=True, dropna=False)
    out = g.agg(
        world_size=("world_size", "first"),
        global_batch_size=("global_batch_size", "first"),
        per_worker_batch_size=("per_worker_batch_size", "first"),
        target_accuracy=("target_accuracy", "first"),
        runs=("status", "size"),
        ok=("is_ok", "sum"),
        oversubscribed=("oversubscribed", "any"),
        logical=("logical", "any"),
        predicted_peak_bytes=("predicted_peak_bytes", "max"),  # whatever the runs' status
        memory_error=("memory_error", "mean"),  # over the runs that measured a device peak
        predicted_reserved_bytes=("predicted_reserved_bytes", "max"),
        memory_error_reserved=("memory_error_reserved", "mean"),
        predicted_host_bytes=("predicted_host_bytes", "max"),
        host_memory_error=("host_memory_error", "mean"),
        predicted_method=("predicted_method", "first"),
        price_key=("price_key", "first"),
        price_note=("price_note", "first"),
        currency=("currency", "first"),
    )
    out["statuses"] = _status_counts(d)
    out["failed"] = out["runs"] - out["ok"]
    stats = {}  # every metric's columns, joined at once (column by column fragments the frame)
    for name in METRICS:
        n = g[name].count()
        std = g[name].std(ddof=1)
        stats[f"{name}_n"] = n
        stats[f"{name}_mean"] = g[name].mean()
        stats[f"{name}_std"] = std
        stats[f"{name}_ci95"] = t975(n.to_numpy()) * std / np.sqrt(n.where(n > 0))
    for name in cost.FIGURES:  # the cell's figure, by the name docs/metrics.md defines
        stats[name] = stats[f"{name}_mean"]
    out = pd.concat([out, pd.DataFrame(stats)], axis=1)
    out = _with_intervals(out, cell_intervals(d, CELL)).reset_index().copy()
    out["input_bound"] = out["data_wait_share_mean"] > INPUT_BOUND_SHARE  # NaN (unknown): False
    out = _with_baselines(out)
    return with_verdicts(out, equivalence)


def _with_intervals(out: pd.DataFrame, intervals: pd.DataFrame) -> pd.DataFrame:
    """The cells' model columns, and the CI of each PROPORTIONAL metric by the model where the
    cell has it (its Student's t interval over repeats kept as `<metric>_ci95_repeats`)."""
    out = out.join(intervals.drop(columns="ci95_rel"))
    out["throughput_gmean"] = np.exp(out["throughput_log_mean"])  # what the verdicts test
    model = intervals["interval_method"] == STEPS
    for name in PROPORTIONAL:
        if f"{name}_mean" in out:
            out[f"{name}_ci95_repeats"] = out[f"{name}_ci95"]
            by_model = out[f"{name}_mean"] * intervals["ci95_rel"]
            out[f"{name}_ci95"] = by_model.where(model, out[f"{name}_ci95"])
    return out


def _status_counts(d: pd.DataFrame) -> pd.Series:
    """Per cell: "2 failed, 3 ok", the count of each status in the status's sort order."""
    n = d.groupby([*CELL, "status"], sort=True, dropna=False).size()
    text = n.astype(str) + " " + n.index.get_level_values("status").astype(str)
    return text.groupby(level=list(range(len(CELL))), sort=True, dropna=False).agg(", ".join)


def _with_baselines(cells: pd.DataFrame) -> pd.DataFrame:
    """Add baseline, speedup, efficiency and speedup_vs_single columns (docs/methods.md)."""
    c = cells
    single = c[(c["workers"] == 1) & (c["nodes"] == 1)]
    base = single[[*BASELINE, "ok", "statuses", "throughput_mean", "steady_epoch_seconds_mean"]]
    base = base.rename(
        columns={
            "ok": "base_ok_",
            "statuses": "base_statuses_",
            "throughput_mean": "baseline_throughput",
            "steady_epoch_seconds_mean": "baseline_steady_epoch_seconds",
        }
    )
    c = c.merge(base, on=BASELINE, how="left", validate="many_to_one")
    n = c["world_size"].astype(float)
    x, x1 = c["throughput_mean"], c["baseline_throughput"]
    t, t1 = c["steady_epoch_seconds_mean"], c["baseline_steady_epoch_seconds"]
    c["speedup"] = x / x1
    strong = c["batch_mode"] == "global"
    c["efficiency_kind"] = np.where(strong, "strong", "weak")
    c["strong_efficiency"] = (t1 / (n * t)).where(strong)
    c["weak_efficiency"] = (x / (n * x1)).where(~strong)
    c["efficiency"] = c["strong_efficiency"].where(strong, c["weak_efficiency"])

    best = single[single["throughput_mean"].notna()]
    if len(best):
        best = best.loc[best.groupby(SINGLE)["throughput_mean"].idxmax()]
    best = best[[*SINGLE, "strategy", "throughput_mean"]].rename(
        columns={"strategy": "single_best_strategy", "throughput_mean": "single_best_throughput"}
    )
    c = c.merge(best, on=SINGLE, how="left", validate="many_to_one")
    c["speedup_vs_single"] = c["throughput_mean"] / c["single_best_throughput"]

    no_n1 = " with the same model, dataset, scale, batch and precision in this study"
    choices = [
        "no ok run in this cell (" + c["statuses"].astype(str) + ")",
        "no N=1 run of " + c["strategy"].astype(str) + no_n1,
        "the N=1 cell of "
        + c["strategy"].astype(str)
        + " has no ok run ("
        + c["base_statuses_"].astype(str)
        + ")",
    ]
    conditions = [c["ok"] == 0, c["base_ok_"].isna(), c["base_ok_"] == 0]
    c["baseline_note"] = np.select(
        [x.to_numpy(dtype=bool) for x in conditions],
        [x.to_numpy(dtype=object) for x in choices],
        "",
    )
    return c.drop(columns=["base_ok_", "base_statuses_"])


def convergence_frame(epochs: pd.DataFrame) -> pd.DataFrame:
    """Per cell and epoch: n, mean, std and 95% CI of train loss (and test accuracy) over the
    cell's ok runs."""
    e = epochs[epochs["status"] == "ok"]
    if not len(e):
        return pd.DataFrame(columns=[*CELL, "world_size", "epoch"])
    g = e.groupby([*CELL, "epoch"], sort=True, dropna=False)
    out = g.agg(world_size=("world_size", "first"))
    for name in ("train_loss", "test_accuracy", "seconds"):
        v = pd.to_numeric(e[name], errors="coerce")
        gv = v.groupby([e[k] for k in [*CELL, "epoch"]], sort=True, dropna=False)
        n = gv.count()
        std = gv.std(ddof=1)
        out[f"{name}_n"] = n
        out[f"{name}_mean"] = gv.mean()
        out[f"{name}_ci95"] = t975(n.to_numpy()) * std / np.sqrt(n.where(n > 0))
    return out.reset_index()
