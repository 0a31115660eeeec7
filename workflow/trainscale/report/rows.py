"""The report's tables as rows of formatted text: every number a person reads in report.html
(summary, scaling table, communication, failed runs, environment), already formatted.

report.html lists at most MAX_CELLS cells and MAX_RUNS failed runs or invalid files, and says
how many more the CSV files hold: a study of 100,000 runs stays a page a person can read.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import yaml

from trainscale.analysis import aggregate, repeats
from trainscale.analysis.aggregate import Study, human, rate
from trainscale.analysis.flags import INPUT_BOUND, cell_flags
from trainscale.analysis.interval import REPEATS
from trainscale.analysis.settle import resolves
from trainscale.analysis.summary import failed_parts
from trainscale.plan import catalog
from trainscale.plan.preflight import hf_models

#: Rows of the scaling and communication tables in report.html at most (one per cell).
MAX_CELLS = 500
#: Failed runs and invalid files listed in report.html at most (one per run).
MAX_RUNS = 100

# --------------------------------------------------------------------------------------------
# numbers for people


def cell_note(r) -> str:
    """A table row's note: why its baseline is what it is, and what its strategy's results
    need beside them (the catalog's `results_note`: tf-ps is asynchronous)."""
    notes = [r.baseline_note if isinstance(r.baseline_note, str) else ""]
    row = catalog.STRATEGIES.get(r.strategy)
    notes.append(row.results_note if row else "")
    if getattr(r, "predicted_method", None) == "model-states":
        notes.append("predicted memory: model states only (no activations)")
    if getattr(r, "interval_method", "") == REPEATS:
        notes.append("throughput CI over repeats only: records without step times")
    return "; ".join(n for n in notes if n)


def na(v) -> bool:
    return v is None or (not isinstance(v, str) and pd.isna(v))


def with_ci(mean, ci, unit: str = "") -> str:
    """`12,700 ± 340 samples/s`: 3 significant digits, the 95% CI half-width when there is one."""
    if na(mean):
        return "–"
    s = human(mean)
    if not na(ci):
        s += f" ± {human(ci)}"
    return f"{s} {unit}".rstrip()


def mib(v, ci=None) -> str:
    if na(v):
        return "–"
    if v >= 2**30:
        return with_ci(v / 2**30, None if na(ci) else ci / 2**30, "GiB")
    return with_ci(v / 2**20, None if na(ci) else ci / 2**20, "MiB")


def signed_pct(v) -> str:
    """A relative error for people: +8.8 %, −3.1 % (– where there is none)."""
    return "–" if na(v) else f"{'+' if v >= 0 else '−'}{human(abs(100 * v))} %"


def memory_errors(r) -> str:
    """A cell's memory errors for people: against the allocated peak, and where NVML measured
    the process, against the reserved side (tensors, CUDA runtime, NCCL): "+0.5 % (+2 %
    reserved)"."""
    allocated = signed_pct(getattr(r, "memory_error", None))
    reserved = getattr(r, "memory_error_reserved", None)
    return allocated if na(reserved) else f"{allocated} ({signed_pct(reserved)} reserved)"


def pct(v) -> str:
    return "–" if na(v) else f"{human(100 * v)} %"


def ratio(v) -> str:
    return "–" if na(v) else f"{human(v)}×"


# --------------------------------------------------------------------------------------------
# context


def knobs(r) -> str:
    """A cell's activation checkpointing and offload (plan.knobs), or "–" without either."""
    ckpt = getattr(r, "activation_checkpointing", "none")
    offload = getattr(r, "offload", "none")
    out = [f"checkpointing {ckpt}"] if isinstance(ckpt, str) and ckpt != "none" else []
    out += [f"offload {offload}"] if isinstance(offload, str) and offload != "none" else []
    return ", ".join(out) or "–"


def _cell_label(r) -> str:
    mode = "per-worker" if r.batch_mode == "per_worker" else "global"
    extra = "" if knobs(r) == "–" else f", {knobs(r)}"
    return f"batch {r.batch_size} {mode}, scale {r.scale}, {r.precision}{extra}"


def could_be(r) -> str:
    """A summary row's answer as a set: "at 95 %, one of {a, b}; this study resolves
    differences of ≥ 18 %; 6 repeats would resolve ≥ 5 %" (a row of `Study.fastest`)."""
    if not isinstance(r.runner_up, str):
        return "–"
    return f"one of {{{r.could_be}}}; {resolves(r.mdd_rel, r.repeats_for_5pct)}"


def summary_rows(study: Study) -> list[dict]:
    rows = []
    taken = repeats.panel_lines(study.scaling)  # a study with repeats {min, max}
    for r in study.fastest.itertuples(index=False):
        runner = "no other strategy ran at this N"
        seq_len = getattr(r, "seq_len", 0)
        if isinstance(r.runner_up, str):
            other, _, unit = rate(r.runner_up_throughput, 0.0, seq_len)
            runner = f"{r.runner_up} ({human(other)} {unit}): {pct(r.margin)} ahead"
            runner += ", slower (95 %)" if r.distinct else ", could be the fastest"
        eff = f"{pct(r.efficiency)} {r.efficiency_kind}" if not na(r.efficiency) else "–"
        rows.append(
            {
                "model": r.model,
                "dataset": r.dataset,
                "n": int(r.world_size),
                "strategy": r.strategy,
                "config": _cell_label(r) + (f", {r.nodes} nodes" if r.nodes != 1 else ""),
                "throughput": with_ci(*rate(r.throughput_mean, r.throughput_ci95, seq_len)),
                "speedup": ratio(r.speedup),
                "efficiency": eff,
                "mfu": pct(getattr(r, "mfu_mean", None)),
                "vs_single": ratio(r.speedup_vs_single),
                "note": cell_note(r),
                "runner_up": runner,
                "could_be": could_be(r),
                "flags": cell_flags(r),
                "runs": f"{r.ok}/{r.runs}",
                "repeats": taken.get((r.model, r.dataset, r.world_size), ""),
            }
        )
    return rows


def _kind(builder: str, kwargs: str | None) -> str:
    """A user's model by its builder; a Hugging Face one by its architecture and config."""
    if builder != hf_models.BUILDER:
        return f"user model ({builder})"
    kw = json.loads(kwargs)
    return f"Hugging Face {kw['architecture']} (config {kw['name'].removeprefix('hf:')})"


def model_rows(study: Study) -> list[dict]:
    """One row per model and data set of the study: built-in or the user's own (with its
    builder's name), what it eats, its parameters and FLOPs per training sample, as its
    first ok run recorded them."""
    r = study.runs
    if not len(r) or "status" not in r:
        return []
    ok = r[r["status"] == "ok"]
    out = []
    for (model, dataset), g in ok.groupby(["spec.model", "spec.dataset"], sort=True):
        first = g.iloc[0]
        builder = first.get("spec.own_model.torch")
        own = isinstance(builder, str) and bool(builder)
        seq_len = first.get("spec.seq_len", 0)
        n = first.get("model.params")
        params = "–" if na(n) else f"{int(n):,}"
        out.append(
            {
                "model": model,
                "dataset": dataset,
                "kind": _kind(builder, first.get("spec.own_model.kwargs")) if own
                else "built-in",
                "input": f"tokens, seq_len {int(seq_len)}" if seq_len and not na(seq_len)
                else "images",
                "params": params,
                "flops": human(first.get("flops.per_sample")),
            }
        )  # fmt: skip
    return out


#: The scaling table's order: by what the cells share, then by N within a strategy.
SCALING_ORDER = ["model", "dataset", "scale", "batch_size", "batch_mode", "precision", "strategy",
                 "nodes", "world_size"]  # fmt: skip


def scaling_rows(study: Study) -> list[dict]:
    """Every cell's row of the scaling table, in SCALING_ORDER."""
    s = study.scaling
    if not len(s):
        return []
    ordered = s.sort_values(SCALING_ORDER, kind="stable")
    return [scaling_row(r) for r in ordered.itertuples(index=False)]


def scaling_row(r: Any) -> dict[str, object]:
    """A row of scaling.csv (`itertuples`) as the scaling table shows it."""
    seq_len = getattr(r, "seq_len", 0)  # token data: throughput in tokens/s
    tta = "–"
    if not na(r.time_to_accuracy_seconds_mean) or not na(r.target_accuracy):
        reached = int(r.time_to_accuracy_seconds_n)
        tta = (
            with_ci(r.time_to_accuracy_seconds_mean, r.time_to_accuracy_seconds_ci95, "s")
            + f" ({reached}/{r.ok} reached)"
        )
    eff = "–" if na(r.efficiency) else f"{pct(r.efficiency)} {r.efficiency_kind}"
    input_bound = bool(getattr(r, "input_bound", False))
    return {
        "strategy": r.strategy,
        "model": r.model,
        "dataset": r.dataset,
        "scale": r.scale,
        "batch": f"{r.batch_size} {r.batch_mode.replace('_', '-')}",
        "n": f"{r.world_size}" + (f" ({r.workers}×{r.nodes})" if r.nodes > 1 else ""),
        "precision": r.precision,
        "knobs": knobs(r),
        "runs": f"{r.ok}/{r.runs}",
        "statuses": r.statuses,
        "throughput": with_ci(*rate(r.throughput_mean, r.throughput_ci95, seq_len)),
        "per_worker": with_ci(*rate(r.throughput_per_worker_mean, float("nan"), seq_len)),
        "epoch1": with_ci(r.first_epoch_seconds_mean, r.first_epoch_seconds_ci95),
        "steady": with_ci(r.steady_epoch_seconds_mean, r.steady_epoch_seconds_ci95),
        "overhead": with_ci(
            r.first_epoch_overhead_seconds_mean, r.first_epoch_overhead_seconds_ci95
        ),
        "speedup": ratio(r.speedup),
        "efficiency": eff,
        "vs_single": ratio(r.speedup_vs_single)
        + (
            f" ({r.single_best_strategy})"
            if isinstance(r.single_best_strategy, str) and not na(r.speedup_vs_single)
            else ""
        ),
        "mfu": pct(getattr(r, "mfu_mean", None)),
        "hfu": pct(getattr(r, "hfu_mean", None)),
        "accuracy": with_ci(r.test_accuracy_mean, r.test_accuracy_ci95),
        "tta": tta,
        "rss": mib(r.peak_host_rss_bytes_mean, r.peak_host_rss_bytes_ci95),
        "device": mib(r.peak_device_bytes_mean, r.peak_device_bytes_ci95),
        "predicted": mib(getattr(r, "predicted_peak_bytes", None)),
        "memory_error": memory_errors(r),
        "note": cell_note(r),
        "data_wait": pct(getattr(r, "data_wait_share_mean", None)),
        "input_bound": input_bound,
        "flags": [*cell_flags(r), *([INPUT_BOUND] if input_bound else [])],
        "failed": int(r.failed) > 0,
    }


def _seconds(v) -> str:
    if na(v):
        return "–"
    return f"{human(v * 1e3)} ms" if v < 1 else f"{human(v)} s"


def n_measured_collectives(study: Study) -> int:
    c = study.collectives
    return 0 if c is None else len(aggregate.measured_collectives(c))


def failed_collective_rows(study: Study) -> list[dict]:
    """All-reduce benchmarks that could not run, with why (recorded, never silently absent)."""
    c = study.collectives
    if c is None:
        return []
    return [
        {
            "backend": r.backend,
            "shape": f"{r.workers} workers × {r.nodes} node(s)",
            "first": str(r.error).splitlines()[0],
            "error": str(r.error),
        }
        for r in aggregate.failed_collectives(c).itertuples(index=False)
    ]


def communication_rows(study: Study) -> list[dict]:
    c = study.communication
    if c is None or not len(c):
        return []
    rows = []
    for r in c.sort_values(["model", "dataset", "strategy", "world_size"]).itertuples(index=False):
        rows.append(
            {
                "strategy": r.strategy,
                "model": r.model,
                "dataset": r.dataset,
                "batch": f"{r.batch_size} {r.batch_mode.replace('_', '-')}",
                "n": f"{r.world_size}" + (f" ({r.workers}×{r.nodes})" if r.nodes > 1 else ""),
                "precision": r.precision,
                "backend": r.backend,
                "gradient": mib(r.gradient_bytes),
                "volume": f"{r.allreduce_volume:g}",
                "busbw": "–"
                if na(r.busbw_bytes_per_second)
                else f"{human(r.busbw_bytes_per_second / 1e9)} GB/s",
                "predicted": _seconds(r.predicted_comm_seconds),
                "measured": _seconds(r.measured_step_seconds),
                "share": pct(r.comm_share),
                "efficiency": pct(r.efficiency),
                "bound": pct(r.network_bound_efficiency),
                "compute": _seconds(getattr(r, "measured_compute_seconds", None)),
                "exposed": _seconds(getattr(r, "measured_exposed_seconds", None)),
                "exposed_share": pct(getattr(r, "exposed_share", None)),
                "exposed_method": str(getattr(r, "exposed_method", "") or ""),
                "note": _comm_note(r),
            }
        )
    return rows


def _comm_note(r) -> str:
    """The row's note, with a tensor-parallel cell's activation traffic per step first."""
    note = r.note if isinstance(r.note, str) else ""
    tp_bytes = getattr(r, "tp_bytes", None)
    if tp_bytes is None or na(tp_bytes):
        return note
    return f"tensor-parallel traffic {mib(tp_bytes)} per step; {note}".rstrip("; ")


def failed_rows(study: Study) -> list[dict]:
    """The first MAX_RUNS failed runs (by run path), with their errors."""
    runs = study.runs
    if not len(runs):
        return []
    failed = runs[runs["status"] != "ok"].sort_values("run").head(MAX_RUNS)
    rows = []
    for _, r in failed.iterrows():
        err = r["error"] if isinstance(r["error"], str) else ""
        lines = err.strip().splitlines()
        rows.append(
            {
                "run": r["run"],
                "status": r["status"],
                "first": lines[0] if lines else "",
                "error": err.strip(),
                "flags": cell_flags(r),  # a run's: oversubscribed
            }
        )
    return rows


def failed_part_rows(study: Study) -> list[dict]:
    """The measurements after training that failed in runs that kept their training record
    (summary.failed_parts), at most MAX_RUNS."""
    parts = failed_parts(study.runs)[:MAX_RUNS]
    return [{"run": run, "part": part, "error": error} for run, part, error in parts]


def _values(series: pd.Series, split: bool = False) -> str:
    """`a (3 runs); b (1 run)`: the distinct values of a column with their run counts."""
    vals = series.dropna().astype(str)
    if split:
        vals = vals.str.split().explode().dropna()
    counts = vals.value_counts(sort=False)  # counted by pandas: 100,000 runs, one pass
    if not len(counts):
        return "–"
    if len(counts) == 1:
        return str(counts.index[0])
    return "; ".join(f"{v} ({n} run{'s' if n != 1 else ''})" for v, n in sorted(counts.items()))


def environment(study: Study) -> list[tuple[str, str]]:
    r = study.runs
    if not len(r):
        return []
    out = [("hosts", _values(r.get("env.hostnames", pd.Series(dtype=object)), split=True))]
    dev = r.get("device.kind", pd.Series(dtype=object)).fillna("?").astype(str)
    name = r.get("device.name", pd.Series(dtype=object)).fillna("?").astype(str)
    count = r.get("device.count", pd.Series(dtype=object))
    count = count.map(lambda v: "?" if na(v) else str(int(v)))
    ok = r["status"] == "ok"
    devices = dev + " · " + name + " · " + count + " per run"
    out.append(("devices (ok runs)", _values(devices[ok])))
    for label, col in (
        ("CPUs per node", "env.cpu_count"),
        ("python", "env.python"),
        ("trainscale", "env.trainscale"),
        ("CUDA", "env.cuda"),
        ("driver", "env.driver"),
    ):
        if col in r and r[col].notna().any():
            v = r[col]
            if col == "env.cpu_count":
                v = v.dropna().astype(int)
            out.append((label, _values(v)))
    for col in sorted(c for c in r.columns if c.startswith("env.frameworks.")):
        out.append((col.removeprefix("env.frameworks."), _values(r[col])))
    out += _software(r)
    if "env.slurm_job_id" in r and r["env.slurm_job_id"].notna().any():
        out.append(("SLURM jobs", str(r["env.slurm_job_id"].nunique())))
    if "launch.mode" in r:
        out.append(("launch mode", _values(r["launch.mode"])))
    if "env.start_utc" in r:
        out.append(("runs between", f"{r['env.start_utc'].min()} and {r['env.end_utc'].max()}"))
    return out


def _software(r: pd.DataFrame) -> list[tuple[str, str]]:
    """The container, NCCL and each variable the ranks saw (env.variables: NCCL_*, CUDA_*,
    ..., config `env`), where the records have them; a run without a container counts as
    `none` beside those with one."""
    out = []
    if "env.container.image" in r and r["env.container.image"].notna().any():
        parts = [r.get(f"env.container.{k}", pd.Series(index=r.index, dtype=object))
                 for k in ("runtime", "image", "digest")]  # fmt: skip
        image = parts[0].fillna("?") + " · " + parts[1].fillna("?") + " · "
        image = (image + parts[2].fillna("no digest")).where(parts[1].notna(), "none")
        out.append(("container", _values(image)))
    # env.nccl: {version, transport}; a version string in records before issue 69
    for col, name in (("env.nccl", "NCCL"), ("env.nccl.version", "NCCL"),
                      ("env.nccl.transport", "NCCL transport")):  # fmt: skip
        if col in r and r[col].notna().any():
            out.append((name, _values(r[col])))
    for col in sorted(c for c in r.columns if c.startswith("env.variables.")):
        out.append((col.removeprefix("env.variables."), _values(r[col])))
    return out


def spec_values(study: Study) -> str:
    """The study config as the runs' specs show it (when no config file is given)."""
    r = study.runs
    cols = sorted(c for c in r.columns if c.startswith("spec."))
    seen = {}
    for c in cols:
        vals = _distinct_text(r[c])
        seen[c.removeprefix("spec.")] = vals[0] if len(vals) == 1 else vals
    return yaml.safe_dump(seen, sort_keys=True, allow_unicode=True)


def _distinct_text(column: pd.Series) -> list[str]:
    """The distinct values of a column as text, sorted; each value's own str (1 and 1.0 are
    two), read from its distinct values, not from 100,000 runs one by one."""
    column = column.dropna()
    if column.dtype == object:  # mixed types: 1 and 1.0 are one value to unique()
        column = column.astype(str)
    return sorted({str(v) for v in column.unique()})
