"""Study tables from metrics files: one row per run, one per cell, and the answers drawn from them.

Files are validated against the metrics schema when read (`trainscale.metrics.read`); a file
that is not valid JSON or breaks the schema is listed as invalid, never silently dropped, and
never stops the rest. Per-run figures (epoch times, throughput, ...) are defined in
`trainscale.metrics`; the per-cell figures of scaling.csv are defined here, each computed once:

- cell: every matrix value but the repeat (strategy, model, dataset, scale, batch_size,
  batch_mode, workers, nodes, precision). N = world size = workers × nodes.
- statistics over repeats: mean, sample standard deviation (n − 1) and the 95% confidence
  interval mean ± t(0.975, n − 1) · std / √n (Student's t) of each metric over the cell's ok
  runs that have it (failed, oom and timeout runs are counted, never averaged); with one such
  run the std and CI are empty.
- first-epoch overhead: first_epoch_seconds − steady_epoch_seconds of each run (what epoch 1's
  warm-up costs), then averaged like any other metric.
- baseline X(1), t1: the cell with the same strategy, model, dataset, scale, batch_size,
  batch_mode and precision and N = 1 (workers = nodes = 1). Strategies are never mixed: torch
  (one plain process) and torch-ddp are different strategies, so torch-ddp at N workers is
  compared with torch-ddp at N = 1. Without an ok baseline the values below are empty and
  `baseline_note` says why.
- speedup: S(N) = X(N) / X(1), X = mean steady throughput (samples/s over all workers).
- strong-scaling efficiency: E = t1 / (N · tN), t = mean steady epoch seconds; for batch_mode
  global, where the global batch is split over the workers and the work per epoch stays the same.
- weak-scaling efficiency: E = X(N) / (N · X(1)); for batch_mode per_worker, where every worker
  keeps its batch and the global batch grows with N.
- speedup_vs_single: X(N) / X1*, X1* the highest mean throughput of any strategy at N = 1 with
  the same model, dataset, scale, batch_size, batch_mode and precision (`single_best_strategy`).
- time to accuracy: mean over the cell's ok runs that reached target_accuracy
  (`time_to_accuracy_seconds_n` of `ok` did).
- peak memory: mean over the cell's ok runs of the per-process peak (max over ranks), i.e. per
  worker: host resident set size, and allocated device memory on GPU.
- fastest: per model, dataset and N, the cell with the highest mean throughput; the runner-up
  is the best cell of another strategy, and `distinct` says whether their 95% CIs are disjoint.
  Cells on logical CPU devices (`device.logical`) are never ranked: a code-path check. Predicted
  throughput (predictions.csv) is never ranked either.
- communication model (communication.csv): for every DDP-family cell (torch-ddp, torch-fsdp,
  deepspeed-zero0..3) with N > 1, the predicted communication seconds per optimizer step
  t_comm = v · 2(N − 1)/N · S / B. S = gradient bytes (parameters × 4; × 2 for DeepSpeed in
  bf16/fp16, whose gradients are half precision). B = the bus bandwidth (busbw at t_p50) that
  the all-reduce benchmark measured for the cell's backend, workers and nodes, interpolated
  linearly in log2(size) at S. v = 1 for torch-ddp and ZeRO-0/1/2 (ZeRO-1/2's reduce-scatter
  plus all-gather move the bytes of one all-reduce); v = 1.5 for torch-fsdp and ZeRO-3, which
  all-gather the parameters for the forward and again for the backward and reduce-scatter the
  gradients. Assumptions: a ring algorithm, the gradient sent as one message of S bytes
  (smaller buckets reach lower busbw), one reduction per optimizer step, and no overlap of
  communication with computation (DDP overlaps its buckets with the backward, so it can beat
  the model).
- measured step seconds: mean steady epoch seconds / optimizer steps per epoch, steps =
  (train samples // N) // per-worker batch, or the study's `steps_per_epoch` when smaller.
- communication share: t_comm / measured step seconds, the fraction of a step the model
  attributes to moving gradients (above 100 %: the benchmark's busbw is lower than training
  achieved, e.g. thanks to overlap).
- measured exposed communication: the mean over the cell's ok runs of metrics
  `communication.exposed_seconds_per_step` (step − the step with gradient synchronisation off)
  and of the no-sync step itself; exposed share = exposed / measured step seconds.
- network-bound efficiency: E_net = (t1/N) / (t1/N + steps · t_comm), t1 the steady epoch
  seconds of the same strategy at N = 1: the best scaling efficiency this network allows when
  computation scales perfectly and communication does not overlap it; compare with the
  measured efficiency beside it.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from trainscale import collectives, metrics
from trainscale.matrix import MATRIX_KEYS

#: Columns first in runs.csv, in this order; every other flattened field follows.
LEAD = [
    "run",
    "status",
    "spec.strategy",
    "spec.model",
    "spec.dataset",
    "spec.scale",
    "spec.batch_size",
    "spec.batch_mode",
    "spec.workers",
    "spec.nodes",
    "spec.world_size",
    "spec.precision",
    "spec.repeat",
    "throughput",
    "throughput_per_worker",
    "first_epoch_seconds",
    "steady_epoch_seconds",
    "test.accuracy",
    "test.loss",
    "time_to_accuracy_seconds",
    "memory.peak_host_rss_bytes",
    "memory.peak_device_bytes",
    "oversubscribed",
    "error",
]

#: A cell: every matrix value but the repeat.
CELL = list(MATRIX_KEYS)
#: What a cell shares with its N = 1 baseline (all of CELL but workers and nodes).
BASELINE = [k for k in CELL if k not in ("workers", "nodes")]
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
}

#: epochs.csv: one row per (run, epoch).
EPOCH_FIELDS = [
    "seconds",
    "samples",
    "samples_per_second",
    "train_loss",
    "test_accuracy",
    "test_loss",
]

#: Per-rank lists in metrics.json, written to runs.csv as space-separated values.
_PER_RANK = ("memory.per_rank_host_rss_bytes", "memory.per_rank_device_bytes")

#: Loading uses worker processes from this many files on (when jobs > 1).
PARALLEL_FROM = 400


# --------------------------------------------------------------------------------------------
# reading metrics files


def _read_one(path: str) -> tuple[dict | None, str | None]:
    try:
        return metrics.read(path), None
    except metrics.MetricsError as e:
        return None, str(e)


def _read_chunk(paths: Sequence[str]) -> list[tuple[dict | None, str | None]]:
    return [_read_one(p) for p in paths]


def load(paths: Iterable[str | Path], jobs: int = 1) -> tuple[list[dict], list[tuple[str, str]]]:
    """(valid records with their `run` id, [(path, why invalid)]), in the order of `paths`.

    Every file goes through `trainscale.metrics.read` (JSON + schema). With `jobs` > 1 and many
    files, the files are read by that many worker processes.
    """
    paths = [str(p) for p in paths]
    if jobs > 1 and len(paths) >= PARALLEL_FROM:
        metrics._validator()  # built once, inherited by forked workers
        size = math.ceil(len(paths) / (jobs * 4))
        chunks = [paths[i : i + size] for i in range(0, len(paths), size)]
        with ProcessPoolExecutor(jobs, mp_context=_mp_context()) as ex:
            results = [r for chunk in ex.map(_read_chunk, chunks) for r in chunk]
    else:
        results = _read_chunk(paths)
    records, invalid = [], []
    for p, (rec, why) in zip(paths, results, strict=True):
        if rec is None:
            invalid.append((p, why.removeprefix(f"{p}: ")))  # the path is listed beside it
            continue
        rec["run"] = run_id(Path(p))
        records.append(rec)
    return records, invalid


def _mp_context():
    import multiprocessing as mp

    return mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None


def find_metrics(runs_dir: str | Path) -> list[Path]:
    """Every metrics.json under `runs_dir` (e.g. results/<study>/runs copied from a cluster)."""
    return sorted(Path(runs_dir).rglob("metrics.json"))


def run_id(path: Path) -> str:
    """The run path (`strategy~…/repeat~N`) from a metrics file's location."""
    parts = path.parent.parts
    start = next((i for i, p in enumerate(parts) if p.startswith("strategy~")), len(parts) - 1)
    return "/".join(parts[start:])


def _flatten(d: dict, prefix: str = "", out: dict | None = None) -> dict:
    out = {} if out is None else out
    for k, v in d.items():
        if isinstance(v, dict):
            _flatten(v, f"{prefix}{k}.", out)  # an empty dict has no leaves: no column
        else:
            out[f"{prefix}{k}"] = v
    return out


def runs_frame(records: list[dict]) -> pd.DataFrame:
    """One flat row per run; the per-epoch list becomes `train_loss_last` and `epochs_done`."""
    rows = []
    for rec in records:
        flat = _flatten({k: v for k, v in rec.items() if k != "epochs"})
        flat["epochs_done"] = len(rec["epochs"])
        flat["train_loss_last"] = rec["epochs"][-1]["train_loss"] if rec["epochs"] else None
        rows.append(flat)
    df = pd.DataFrame.from_records(rows) if rows else pd.DataFrame(columns=LEAD)
    for c in ("spec.betas", "env.hostnames", "env.rank_hosts", *_PER_RANK):
        if c in df:
            df[c] = df[c].map(lambda v: " ".join(map(str, v)) if isinstance(v, list) else v)
    lead = [c for c in LEAD if c in df.columns]
    return df[lead + sorted(c for c in df.columns if c not in lead)]


def epochs_frame(records: list[dict]) -> pd.DataFrame:
    """One row per (run, epoch): the cell, the repeat, the status and the epoch's measurements."""
    cols = ["run", "status", *CELL, "world_size", "repeat", "epoch", *EPOCH_FIELDS]
    rows = []
    for rec in records:
        s = rec["spec"]
        head = [rec["run"], rec["status"], *(s[k] for k in CELL), s["world_size"], s["repeat"]]
        for e in rec["epochs"]:
            rows.append([*head, e["epoch"], *(e.get(f) for f in EPOCH_FIELDS)])
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------------------------
# statistics


def t975(n: np.ndarray | pd.Series | int) -> np.ndarray | float:
    """Student's t quantile t(0.975, n − 1) for samples of size n (NaN where n < 2)."""
    from scipy.special import stdtrit

    n = np.asarray(n, dtype=float)
    out = np.full(n.shape, np.nan)
    ok = n >= 2
    out[ok] = stdtrit(n[ok] - 1, 0.975)
    return out if out.ndim else float(out)


def ci95(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, std, CI half-width) of one sample, by the formulas in the module docstring."""
    x = np.asarray([v for v in values if v is not None and not pd.isna(v)], dtype=float)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan
    std = float(x.std(ddof=1)) if n > 1 else math.nan
    return float(x.mean()), std, float(t975(n) * std / math.sqrt(n)) if n > 1 else math.nan


def _cells_of(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs table reduced to cell keys and the per-run metrics that scaling.csv averages."""
    d = pd.DataFrame({k: runs[f"spec.{k}"] for k in CELL})
    d["world_size"] = runs["spec.world_size"]
    d["global_batch_size"] = runs.get("spec.global_batch_size", np.nan)
    d["per_worker_batch_size"] = runs.get("spec.per_worker_batch_size", np.nan)
    d["target_accuracy"] = runs.get("spec.target_accuracy", np.nan)
    d["status"] = runs["status"]
    d["oversubscribed"] = runs["oversubscribed"].fillna(False).astype(bool)
    # tf-mirrored without GPUs runs N *logical* CPU devices in one process: a code-path check
    logical = runs["device.logical"] if "device.logical" in runs else pd.Series(False, runs.index)
    d["logical"] = logical.map(lambda v: v is True or str(v).lower() == "true")
    ok = d["status"] == "ok"
    for name, col in METRICS.items():
        if col is None:
            v = pd.to_numeric(runs["first_epoch_seconds"], errors="coerce") - pd.to_numeric(
                runs["steady_epoch_seconds"], errors="coerce"
            )
        else:
            v = pd.to_numeric(runs[col], errors="coerce") if col in runs else np.nan
        d[name] = pd.Series(v, index=runs.index).where(ok)
    return d


def scaling_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (scaling.csv): counts, mean/std/CI of each metric, speedup, efficiency.

    Every formula is stated in this module's docstring.
    """
    if not len(runs):
        return pd.DataFrame(columns=[*CELL, "world_size", "runs", "ok"])
    d = _cells_of(runs)
    g = d.groupby(CELL, sort=True, dropna=False)
    out = g.agg(
        world_size=("world_size", "first"),
        global_batch_size=("global_batch_size", "first"),
        per_worker_batch_size=("per_worker_batch_size", "first"),
        target_accuracy=("target_accuracy", "first"),
        runs=("status", "size"),
        ok=("status", lambda s: int((s == "ok").sum())),
        statuses=("status", _status_counts),
        oversubscribed=("oversubscribed", "any"),
        logical=("logical", "any"),
    )
    out["failed"] = out["runs"] - out["ok"]
    for name in METRICS:
        n = g[name].count()
        std = g[name].std(ddof=1)
        out[f"{name}_n"] = n
        out[f"{name}_mean"] = g[name].mean()
        out[f"{name}_std"] = std
        out[f"{name}_ci95"] = t975(n.to_numpy()) * std / np.sqrt(n.where(n > 0))
    out = out.reset_index()
    out = _with_baselines(out)
    return out


def _status_counts(s: pd.Series) -> str:
    c = s.value_counts()
    return ", ".join(f"{n} {st}" for st, n in sorted(c.items()))


def _with_baselines(cells: pd.DataFrame) -> pd.DataFrame:
    """Add baseline, speedup, efficiency and speedup_vs_single columns (see module docstring)."""
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

    notes = []
    for r in c.itertuples(index=False):
        if r.ok == 0:
            notes.append(f"no ok run in this cell ({r.statuses})")
        elif pd.isna(r.base_ok_):
            notes.append(
                f"no N=1 run of {r.strategy} with the same model, dataset, scale, batch and "
                "precision in this study"
            )
        elif r.base_ok_ == 0:
            notes.append(f"the N=1 cell of {r.strategy} has no ok run ({r.base_statuses_})")
        else:
            notes.append("")
    c["baseline_note"] = notes
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


def fastest(scaling: pd.DataFrame) -> pd.DataFrame:
    """Per model, dataset and N: the fastest cell, its efficiency, and the best other strategy."""
    cols = ["model", "dataset", "world_size"]
    s = scaling[scaling["throughput_mean"].notna()] if len(scaling) else scaling
    if "logical" in s and len(s):  # logical CPU devices: a code-path check, never "fastest"
        s = s[~s["logical"].astype(bool)]
    if not len(s):
        return pd.DataFrame(columns=[*cols, "strategy"])
    s = s.sort_values("throughput_mean", ascending=False, kind="stable")
    rows = []
    for key, grp in s.groupby(cols, sort=True):
        win = grp.iloc[0]
        others = grp[grp["strategy"] != win["strategy"]]
        row = dict(zip(cols, key, strict=True))
        row.update(
            {
                k: win[k]
                for k in (
                    "strategy",
                    "scale",
                    "batch_size",
                    "batch_mode",
                    "workers",
                    "nodes",
                    "precision",
                    "throughput_mean",
                    "throughput_ci95",
                    "speedup",
                    "efficiency",
                    "efficiency_kind",
                    "speedup_vs_single",
                    "baseline_note",
                    "oversubscribed",
                    "logical",
                    "ok",
                    "runs",
                )
            }
        )
        if len(others):
            ru = others.iloc[0]
            row["runner_up"] = ru["strategy"]
            row["runner_up_throughput"] = ru["throughput_mean"]
            row["margin"] = win["throughput_mean"] / ru["throughput_mean"] - 1
            lo = win["throughput_mean"] - win["throughput_ci95"]
            hi = ru["throughput_mean"] + ru["throughput_ci95"]
            row["distinct"] = bool(lo > hi) if not (pd.isna(lo) or pd.isna(hi)) else None
        else:
            row.update(runner_up=None, runner_up_throughput=np.nan, margin=np.nan, distinct=None)
        rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# the all-reduce benchmark and the communication model

#: collectives.csv: one row per (backend, workers, nodes, message size); a benchmark that
#: could not run is one row with status `failed`, its error and no size.
COLLECTIVE_COLUMNS = [
    "status",
    "error",
    "backend",
    "workers",
    "nodes",
    "world_size",
    "bytes",
    "iters",
    "p50_seconds",
    "p95_seconds",
    "algbw_bytes_per_second",
    "busbw_bytes_per_second",
    "busbw_p95_bytes_per_second",
]

#: DDP-family strategies -> traffic of one optimizer step in all-reduces of the gradient (v).
COMM_VOLUME = {
    "torch-ddp": 1.0,
    "torch-fsdp": 1.5,
    "deepspeed-zero0": 1.0,
    "deepspeed-zero1": 1.0,
    "deepspeed-zero2": 1.0,
    "deepspeed-zero3": 1.5,
    "lightning-ddp": 1.0,
}


def collectives_frame(paths: Iterable[str | Path]) -> pd.DataFrame:
    """collectives.csv from the benchmark's JSON files (trainscale.collectives)."""
    rows = []
    for p in paths:
        rec = collectives.read(p)
        head = {k: rec[k] for k in ("backend", "workers", "nodes", "world_size")}
        head.update(status=rec.get("status", "ok"), error=rec.get("error"))
        if head["status"] != "ok":
            rows.append(head)
        for r in rec["sizes"]:
            rows.append({**head, "iters": len(r["seconds"]), **r})
    return pd.DataFrame(rows, columns=COLLECTIVE_COLUMNS)


def measured_collectives(coll: pd.DataFrame) -> pd.DataFrame:
    """The rows of collectives.csv that hold timings (not the benchmarks that failed)."""
    return coll[coll["status"] == "ok"] if "status" in coll and len(coll) else coll


def failed_collectives(coll: pd.DataFrame) -> pd.DataFrame:
    """One row per benchmark that could not run, with its error."""
    if "status" not in coll or not len(coll):
        return coll.iloc[0:0]
    return coll[coll["status"] != "ok"]


def busbw_at(table: pd.DataFrame, size: float) -> float:
    """Bus bandwidth at `size` bytes: linear in log2(size) between the measured sizes (the
    nearest end outside them)."""
    t = table.sort_values("bytes")
    x = np.log2(t["bytes"].to_numpy(dtype=float))
    return float(np.interp(np.log2(size), x, t["busbw_bytes_per_second"].to_numpy(dtype=float)))


def gradient_bytes(strategy: str, precision: str, params: float) -> float:
    """S: bytes of one gradient (half precision under DeepSpeed bf16/fp16, fp32 otherwise)."""
    half = strategy.startswith("deepspeed-") and precision in ("bf16", "fp16")
    return params * (2 if half else 4)


COMM_COLUMNS = [
    *CELL,
    "world_size",
    "backend",
    "params",
    "gradient_bytes",
    "allreduce_volume",
    "busbw_bytes_per_second",
    "predicted_comm_seconds",
    "steps_per_epoch",
    "measured_step_seconds",
    "comm_share",
    "efficiency",
    "network_bound_efficiency",
    "measured_compute_seconds",
    "measured_exposed_seconds",
    "exposed_share",
    "exposed_method",
    "note",
]


def communication_frame(
    scaling: pd.DataFrame, runs: pd.DataFrame, coll: pd.DataFrame
) -> pd.DataFrame:
    """communication.csv: the communication model of every DDP-family cell with N > 1 (see the
    module docstring for every formula)."""
    if not len(scaling) or not len(runs):
        return pd.DataFrame(columns=COMM_COLUMNS)
    cells = scaling[
        scaling["strategy"].isin(list(COMM_VOLUME))
        & (scaling["world_size"] > 1)
        & (scaling["ok"] > 0)
    ]
    ok = runs[runs["status"] == "ok"]
    per_cell = ok.groupby([f"spec.{k}" for k in CELL], dropna=False).first()
    exposed = _exposed_by_cell(ok)
    rows = []
    for c in cells.itertuples(index=False):
        key = tuple(getattr(c, k) for k in CELL)
        r = per_cell.loc[key]
        n = int(c.world_size)
        backend = "nccl" if r.get("device.kind") == "cuda" else "gloo"
        params = float(r["model.params"])
        size = gradient_bytes(c.strategy, c.precision, params)
        steps = (int(r["data.train_samples"]) // n) // int(r["spec.per_worker_batch_size"])
        limit = r.get("spec.steps_per_epoch")
        if limit is not None and not pd.isna(limit):
            steps = min(steps, int(limit))
        step_s = c.steady_epoch_seconds_mean / steps
        row = {k: getattr(c, k) for k in CELL}
        row.update(
            world_size=n,
            backend=backend,
            params=params,
            gradient_bytes=size,
            allreduce_volume=COMM_VOLUME[c.strategy],
            steps_per_epoch=steps,
            measured_step_seconds=step_s,
            efficiency=c.efficiency,
            note="",
            **exposed.get(key, {}),
        )
        if pd.notna(row.get("measured_exposed_seconds", np.nan)):
            row["exposed_share"] = row["measured_exposed_seconds"] / step_s
        same = (
            coll[
                (coll["backend"] == backend)
                & (coll["workers"] == c.workers)
                & (coll["nodes"] == c.nodes)
            ]
            if len(coll)
            else coll
        )
        sub = measured_collectives(same)
        if not len(sub):
            failed = failed_collectives(same)
            why = (
                f"its run failed: {str(failed['error'].iloc[0]).splitlines()[0]}"
                if len(failed)
                else "collectives.enabled false, or its run failed"
            )
            row["note"] = (
                f"no all-reduce benchmark for {backend}, {c.workers} workers × {c.nodes} nodes "
                f"({why})"
            )
            rows.append(row)
            continue
        bw = busbw_at(sub, size)
        t_comm = COMM_VOLUME[c.strategy] * collectives.bus_factor(n) * size / bw
        t1 = c.baseline_steady_epoch_seconds
        ideal = t1 / n
        row.update(
            busbw_bytes_per_second=bw,
            predicted_comm_seconds=t_comm,
            comm_share=t_comm / step_s,
            network_bound_efficiency=ideal / (ideal + steps * t_comm),
        )
        notes = [f"no network-bound efficiency: {c.baseline_note}"] if pd.isna(t1) else []
        if size > sub["bytes"].max():
            notes.append(
                f"busbw at S read at {int(sub['bytes'].max())} bytes, the largest size measured "
                "(the benchmark was cut short by collectives.max_bytes)"
            )
        row["note"] = "; ".join(notes)
        rows.append(row)
    return pd.DataFrame(rows, columns=COMM_COLUMNS)


def _exposed_by_cell(ok: pd.DataFrame) -> dict[tuple, dict]:
    """Per cell: mean no-sync step and exposed communication over its ok runs, and the method
    (metrics `communication.*`, trainscale/runners/exposed.py)."""
    cols = ("communication.compute_seconds_per_step", "communication.exposed_seconds_per_step")
    if not len(ok) or cols[1] not in ok:
        return {}
    out = {}
    for key, g in ok.groupby([f"spec.{k}" for k in CELL], dropna=False):
        methods = g.get("communication.method", pd.Series(dtype=object)).dropna().unique()
        note = g.get("communication.note", pd.Series(dtype=object)).dropna().unique()
        out[key] = {
            "measured_compute_seconds": pd.to_numeric(g[cols[0]], errors="coerce").mean(),
            "measured_exposed_seconds": pd.to_numeric(g[cols[1]], errors="coerce").mean(),
            "exposed_method": ", ".join(map(str, methods))
            or ("not measured: " + str(note[0]) if len(note) else ""),
        }
    return out


def read_collectives(path: str | Path | None) -> pd.DataFrame:
    if not path or not Path(path).exists():
        return pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    return pd.read_csv(path, dtype={"status": object, "error": object})


def read_communication(path: str | Path | None) -> pd.DataFrame:
    if not path or not Path(path).exists():
        return pd.DataFrame(columns=COMM_COLUMNS)
    df = pd.read_csv(path, dtype={"note": object, "exposed_method": object})
    return df.fillna({"note": "", "exposed_method": ""})


# --------------------------------------------------------------------------------------------
# the whole study


@dataclass
class Study:
    """A study's tables: runs (one row per run), epochs, scaling (one row per cell), invalid."""

    name: str
    runs: pd.DataFrame
    epochs: pd.DataFrame
    scaling: pd.DataFrame
    invalid: list[tuple[str, str]] = field(default_factory=list)
    collectives: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    )
    communication: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=COMM_COLUMNS))

    @property
    def convergence(self) -> pd.DataFrame:
        if not hasattr(self, "_convergence"):
            self._convergence = convergence_frame(self.epochs)
        return self._convergence

    @property
    def fastest(self) -> pd.DataFrame:
        if not hasattr(self, "_fastest"):
            self._fastest = fastest(self.scaling)
        return self._fastest

    def write(self, out: str | Path) -> None:
        """runs.csv, epochs.csv, scaling.csv, invalid.csv and summary.txt into `out`."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.runs.to_csv(out / "runs.csv", index=False)
        self.epochs.to_csv(out / "epochs.csv", index=False)
        self.scaling.to_csv(out / "scaling.csv", index=False)
        write_invalid(self.invalid, out / "invalid.csv")
        self.collectives.to_csv(out / "collectives.csv", index=False)
        self.communication.to_csv(out / "communication.csv", index=False)
        (out / "summary.txt").write_text(
            summary_text(self.runs, self.invalid, self.name, self.scaling)
        )


def study_name(runs: pd.DataFrame, default: str = "study") -> str:
    names = runs["spec.study"].dropna().unique() if "spec.study" in runs else []
    return ", ".join(sorted(map(str, names))) or default


def build(
    paths: Iterable[str | Path], name: str | None = None, jobs: int = 1, default_name: str = "study"
) -> Study:
    """Read and validate metrics files and compute every table."""
    records, invalid = load(paths, jobs=jobs)
    for p, why in invalid:
        print(f"trainscale: invalid metrics file {p}: {why}", file=sys.stderr)
    runs = runs_frame(records)
    return Study(
        name=name or study_name(runs, default_name),
        runs=runs,
        epochs=epochs_frame(records),
        scaling=scaling_frame(runs),
        invalid=invalid,
    )


def read_study(
    runs_csv: str | Path,
    epochs_csv: str | Path | None = None,
    scaling_csv: str | Path | None = None,
    invalid_csv: str | Path | None = None,
    name: str | None = None,
    collectives_csv: str | Path | None = None,
    communication_csv: str | Path | None = None,
) -> Study:
    """A Study from the CSV files the workflow wrote (scaling is recomputed when not given)."""
    runs = read_runs(runs_csv)
    epochs = pd.read_csv(epochs_csv) if epochs_csv else epochs_frame([])
    scaling = read_scaling(scaling_csv) if scaling_csv else scaling_frame(runs)
    invalid = read_invalid(invalid_csv) if invalid_csv else []
    return Study(
        name or study_name(runs),
        runs,
        epochs,
        scaling,
        invalid,
        collectives=read_collectives(collectives_csv),
        communication=read_communication(communication_csv),
    )


def read_scaling(path: str | Path) -> pd.DataFrame:
    text = ("baseline_note", "statuses")
    df = pd.read_csv(path, dtype=dict.fromkeys(text, object))
    for c in text:
        if c in df:
            df[c] = df[c].fillna("")
    return df


def read_runs(path: str | Path) -> pd.DataFrame:
    df = pd.read_csv(path, dtype={"error": object, "run": object, "spec.study": object})
    if "oversubscribed" in df:
        df["oversubscribed"] = df["oversubscribed"].map(
            lambda v: v if isinstance(v, bool) else str(v).lower() == "true"
        )
    return df


def write_invalid(invalid: list[tuple[str, str]], path: str | Path) -> None:
    pd.DataFrame(invalid, columns=["path", "error"]).to_csv(path, index=False)


def read_invalid(path: str | Path) -> list[tuple[str, str]]:
    df = pd.read_csv(path, dtype=object, keep_default_na=False)
    return list(df[["path", "error"]].itertuples(index=False, name=None))


# --------------------------------------------------------------------------------------------
# text summary


def human(v: float | None, unit: str = "", digits: int = 3) -> str:
    """A number for people: `digits` significant digits, thousands separators, a unit."""
    if v is None or pd.isna(v):
        return "n/a"
    v = float(v)
    if v == 0:
        s = "0"
    else:
        mag = math.floor(math.log10(abs(v)))
        r = round(v, digits - 1 - mag)
        if abs(r) >= 10 ** (digits - 1):
            s = f"{r:,.0f}"
        else:
            s = f"{r:.{max(digits - 1 - math.floor(math.log10(abs(r))), 0)}f}"
    return f"{s} {unit}".rstrip() if unit else s


def summary_text(
    df: pd.DataFrame,
    invalid: list[tuple[str, str]],
    study: str,
    scaling: pd.DataFrame | None = None,
) -> str:
    """Plain-text answers: fastest strategy per model and N with its efficiency, every cell's
    mean ± 95% CI, and what failed or was invalid."""
    scaling = scaling_frame(df) if scaling is None else scaling
    lines = [f"trainscale study {study!r}: {len(df)} runs in {len(scaling)} cells"]
    if len(df):
        counts = df["status"].value_counts().to_dict()
        lines[0] += " (" + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ")"
    fast = fastest(scaling)
    if len(fast):
        lines += ["", "fastest strategy per model, dataset and N (mean of repeats ± 95% CI):"]
        for r in fast.itertuples(index=False):
            eff = (
                f"{r.efficiency_kind} efficiency {human(100 * r.efficiency)} %"
                if pd.notna(r.efficiency)
                else f"efficiency n/a: {r.baseline_note}"
            )
            ci = f" ± {human(r.throughput_ci95)}" if pd.notna(r.throughput_ci95) else ""
            ahead = ""
            if isinstance(r.runner_up, str):
                ahead = f"; {human(100 * r.margin)} % ahead of {r.runner_up}"
                if r.distinct is False:
                    ahead += " (CIs overlap)"
            flag = " [oversubscribed]" if r.oversubscribed else ""
            flag += " [logical CPU devices: a code-path check, not a speed-up]" if r.logical else ""
            lines.append(
                f"  {r.model} on {r.dataset}, N={r.world_size}: {r.strategy} "
                f"(batch {r.batch_size} {r.batch_mode}, scale {r.scale}, {r.precision}) "
                f"{human(r.throughput_mean)}{ci} samples/s, {eff}{ahead}{flag}"
            )
    logical = scaling[(scaling["ok"] > 0) & scaling["logical"].astype(bool)] if len(fast) else fast
    if len(logical):
        lines += ["", "not ranked (logical CPU devices: a code-path check, not a speed-up):"]
        lines += [
            f"  {r.strategy} {r.model} on {r.dataset}, N={r.world_size}, batch {r.batch_size} "
            f"{r.batch_mode}: {human(r.throughput_mean)} samples/s"
            for r in logical.itertuples(index=False)
        ]
    ok = scaling[scaling["ok"] > 0] if len(scaling) else scaling
    if len(ok):
        lines += [
            "",
            f"{'strategy':<16}{'model':<14}{'dataset':<19}{'scale':>5}{'N':>4}{'batch':>7} "
            f"{'mode':<11}{'ok':>5}{'samples/s':>11}{'± CI':>9}{'epoch1 s':>10}{'steady s':>10}"
            f"{'speedup':>9}{'eff %':>7}{'test acc':>9}{'RSS MiB':>9}",
        ]
        for r in ok.itertuples(index=False):
            flag = "  oversubscribed" if r.oversubscribed else ""
            flag += "  logical devices" if r.logical else ""
            eff = human(100 * r.efficiency) if pd.notna(r.efficiency) else "n/a"
            lines.append(
                f"{r.strategy:<16}{r.model:<14}{r.dataset:<19}{r.scale:>5}{r.world_size:>4}"
                f"{r.batch_size:>7} {r.batch_mode:<11}{f'{r.ok}/{r.runs}':>5}"
                f"{human(r.throughput_mean):>11}{human(r.throughput_ci95):>9}"
                f"{human(r.first_epoch_seconds_mean):>10}{human(r.steady_epoch_seconds_mean):>10}"
                f"{human(r.speedup):>9}{eff:>7}{human(r.test_accuracy_mean):>9}"
                f"{human(r.peak_host_rss_bytes_mean / 2**20):>9}{flag}"
            )
    notes = scaling[(scaling["ok"] > 0) & (scaling["baseline_note"] != "")] if len(ok) else ok
    if len(notes):
        lines += ["", "no speedup/efficiency for:"]
        for r in notes.itertuples(index=False):
            lines.append(
                f"  {r.strategy} {r.model} {r.dataset} N={r.world_size} batch "
                f"{r.batch_size} {r.batch_mode}: {r.baseline_note}"
            )
    failed = df[df["status"] != "ok"] if len(df) else df
    if len(failed):
        lines += ["", "failed runs:"]
        for _, r in failed.iterrows():
            err = r["error"] if isinstance(r["error"], str) else ""
            first = err.strip().splitlines()[0] if err.strip() else ""
            lines.append(f"  [{r['status']}] {r['run']}: {first}")
    if invalid:
        lines += ["", "invalid metrics files (not counted):"]
        lines.extend(f"  {p}: {why}" for p, why in invalid)
    return "\n".join(lines) + "\n"


def write_runs_table(
    paths: Iterable[str | Path], csv: str | Path, summary: str | Path, study: str
) -> pd.DataFrame:
    """runs.csv and summary.txt from metrics files (the first aggregation; kept for callers)."""
    records, invalid = load(paths)
    for p, why in invalid:
        print(f"trainscale: invalid metrics file {p}: {why}", file=sys.stderr)
    df = runs_frame(records)
    Path(csv).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(csv, index=False)
    Path(summary).write_text(summary_text(df, invalid, study))
    return df


def default_jobs() -> int:
    try:
        return max(1, min(len(os.sched_getaffinity(0)), 8))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, min(os.cpu_count() or 1, 8))
