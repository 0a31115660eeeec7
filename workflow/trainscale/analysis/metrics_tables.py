"""Metrics files to tables: find a study's metrics.json files, read and validate them
(`trainscale.measure.metrics.read`: the schema's msgspec types, its validators for a file they
refuse) in a process pool, and turn them into the runs table (one flat row per run) and the
epochs table (one row per run and epoch).

A file that is not valid JSON or breaks the schema is listed as invalid, never silently dropped,
and never stops the rest. The pool's workers build each chunk's tables themselves and send back
columns, not records: flattening is the only per-record work, and it runs in parallel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import json
import math
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import pandas as pd

from trainscale.analysis.cells import CELL
from trainscale.analysis.interval import within_variance
from trainscale.measure import metrics
from trainscale.plan.matrix import RunSpec

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


#: record blocks that are not runs.csv columns: epochs (epochs.csv), and the run's timeline
#: (where its time went outside the epochs: benchmarks/harness_overhead.py --breakdown)
NOT_FLATTENED = ("epochs", "timeline")

#: epochs.csv: one row per (run, epoch).
EPOCH_FIELDS = [
    "seconds",
    "samples",
    "samples_per_second",
    "train_loss",
    "test_accuracy",
    "test_loss",
    "data_wait_seconds",
    "data_wait_seconds_max",
]


_CELL_TEXT = ("strategy", "model", "dataset", "batch_mode", "precision", "activation_checkpointing",
              "offload", "memory_format")  # fmt: skip
#: dtypes of the cell columns, in every table that has them.
CELL_TYPES = {k: ("str" if k in _CELL_TEXT else "bool" if k == "compile" else "int64")
              for k in CELL}  # fmt: skip
#: dtypes of epochs.csv's columns.
EPOCH_TYPES = {
    "run": "str",
    "status": "str",
    **CELL_TYPES,
    "world_size": "int64",
    "repeat": "int64",
    "epoch": "int64",
    **dict.fromkeys(EPOCH_FIELDS, "float64"),
}

#: Reading uses worker processes from this many files on (when jobs > 1).
PARALLEL_FROM = 400
#: Files per task handed to a worker: small enough to balance two cores and bound each
#: worker's memory, large enough that sending back a chunk's tables costs little.
CHUNK = 1000

Invalid = list[tuple[str, str]]


@functools.cache
def _schema_types() -> dict[str, str]:
    """runs.csv column -> dtype, from the metrics schema's leaves and RunSpec's fields."""
    schema = metrics._schema()
    out: dict[str, str] = {"run": "str", "train_loss_last": "float64", "samples_trained": "float64"}
    out.update(
        predicted_peak_bytes="float64",
        memory_error="float64",
        predicted_reserved_bytes="float64",
        memory_error_reserved="float64",
        predicted_host_bytes="float64",
        host_memory_error="float64",
        within_run_var="float64",
        within_run_blocks="float64",
    )

    def walk(node: dict, prefix: str, required: bool) -> None:
        if "$ref" in node:
            node = {**schema["$defs"][node["$ref"].rsplit("/", 1)[1]], **node}
        kinds = node.get("type") or []
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if "properties" in node:
            for k, sub in node["properties"].items():
                walk(sub, f"{prefix}{k}.", required and k in node.get("required", ()))
            return
        name, nullable = prefix[:-1], "null" in kinds or not required
        if "array" in kinds or "string" in kinds or "enum" in node or "const" in node:
            out[name] = "str"
        elif "boolean" in kinds:
            out[name] = "boolean" if nullable else "bool"
        elif "number" in kinds or ("integer" in kinds and nullable):
            out[name] = "float64"  # integers that may be missing are floats, as CSV reads them

    walk(schema, "", True)
    out.pop("epochs", None)  # its own table
    for col in [c for c in out if c.startswith("timeline.")]:
        del out[col]  # not a table's: benchmarks/harness_overhead.py --breakdown reads it
    for f in dataclasses.fields(RunSpec):
        hint, col = str(f.type), f"spec.{f.name}"
        if col in out or hint.startswith(("Fault", "tuple")):
            out.setdefault(col, "str")  # betas: "0.9 0.999"
        elif hint.startswith("str"):
            out[col] = "str"
        elif hint == "bool":
            out[col] = "boolean"  # absent from files written before the field existed
        elif hint.startswith("float") or "None" in hint:
            out[col] = "float64"
    return out


def runs_types(columns: Iterable[str]) -> dict[str, str]:
    """The dtype of each runs column the schema or RunSpec types (framework versions, the ranks'
    variables and the container, null or its image and digest, are text)."""
    known = _schema_types()
    out = {}
    for c in columns:
        if c in known:
            out[c] = known[c]
        elif c.startswith(("env.frameworks.", "env.variables.", "env.container")):
            out[c] = "str"
    return out


def typed(df: pd.DataFrame, types: dict[str, str]) -> pd.DataFrame:
    """`df` with the dtypes `types` states for the columns it has."""
    cast = {c: t for c, t in types.items() if c in df.columns and df[c].dtype != t}
    return df.astype(cast) if cast else df


def find_metrics(runs_dir: str | Path) -> list[Path]:
    """Every metrics.json under `runs_dir` (e.g. results/<study>/runs copied from a cluster), in
    path order. os.scandir with the entries' cached types: a seventh of os.walk's time on
    10,000 runs (os.walk lists every directory's files and sub-directories first)."""
    return [Path(p) for p in metrics_paths(runs_dir)]


def metrics_paths(runs_dir: str | Path) -> list[str]:
    """`find_metrics` as strings, for a reader that opens them (a Path object per file was
    a tenth of reading 100,000 files' main-process time)."""
    found = list(_metrics_files(os.fspath(runs_dir)))
    found.sort(key=lambda p: p.split(os.sep))  # the order of sorted(Path, ...)
    return found


def has_metrics(runs_dir: str | Path) -> bool:
    """Whether any metrics.json lies under `runs_dir` (stops at the first one found)."""
    return next(_metrics_files(os.fspath(runs_dir)), None) is not None


def _metrics_files(top: str) -> Iterator[str]:
    """The metrics.json files under `top` (depth first, unordered; symbolic links to
    directories are not followed, as os.walk does not)."""
    stack = [top]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:  # unreadable or vanished, as os.walk skips it
            continue
        with entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.name == "metrics.json":
                    yield e.path


def run_id(path: str | Path) -> str:
    """The run path (`strategy~…/repeat~N`) from a metrics file's location: from its first
    folder named strategy~…, else its own folder's name."""
    folder = os.path.dirname(os.fspath(path))  # strings: 100,000 paths add up
    if folder.startswith("strategy~"):
        start = 0
    else:
        found = folder.find(os.sep + "strategy~")
        start = (found if found >= 0 else folder.rfind(os.sep)) + 1
    return folder[start:].replace(os.sep, "/")


def _read_valid(paths: Sequence[str]) -> tuple[list[dict], Invalid]:
    """(valid records with their `run` id, [(path, why invalid)]) of `paths`, in order."""
    records, invalid = [], []
    for p in paths:
        try:
            rec = metrics.read(p)
        except metrics.MetricsError as e:
            invalid.append((p, str(e).removeprefix(f"{p}: ")))  # the path is listed beside it
            continue
        rec["run"] = run_id(p)
        rec["spec"].setdefault("seq_len", 0)  # written before the axis: an image run
        rec["spec"].setdefault("tp", 1)  # written before the axis: no tensor parallelism
        records.append(rec)
    return records, invalid


def _tables_of(paths: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame, Invalid]:
    with gc_paused():
        records, invalid = _read_valid(paths)
        runs, epochs = runs_frame(records), epochs_frame(records)
        # typed here, in the workers, so the parent only joins the chunks
        return typed(runs, runs_types(runs.columns)), typed(epochs, EPOCH_TYPES), invalid


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block: parsed JSON and the tables made
    from it hold no reference cycles, yet the millions of objects they allocate set off full
    collections that walk every object alive again and again (a fifth of reading 100,000
    files). Reference counting still frees everything as usual."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def mp_context() -> multiprocessing.context.BaseContext | None:
    """fork where the platform has it: workers inherit the schema's checks and the imports."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork") if "fork" in methods else None


def _in_pool(
    func, paths: list[str], jobs: int, meanwhile: Callable[[], None] | None = None
) -> list:
    """func(chunk) for consecutive chunks of `paths`, in order, by `jobs` worker processes when
    there are enough files to repay starting them; `meanwhile` runs in this process while they
    read (after them, where this process reads alone)."""
    if jobs <= 1 or len(paths) < PARALLEL_FROM:
        parts = [func(paths)]
        if meanwhile:
            meanwhile()
        return parts
    from concurrent.futures import ProcessPoolExecutor

    metrics.build_checks()  # once here, inherited by the forked workers
    size = min(CHUNK, math.ceil(len(paths) / jobs))
    chunks = [paths[i : i + size] for i in range(0, len(paths), size)]
    with ProcessPoolExecutor(jobs, mp_context=mp_context()) as ex:
        parts = ex.map(func, chunks)  # every chunk handed out, the workers forked
        if meanwhile:
            meanwhile()
        return list(parts)


def load(paths: Iterable[str | Path], jobs: int = 1) -> tuple[list[dict], Invalid]:
    """(valid records with their `run` id, [(path, why invalid)]), in the order of `paths`, for
    callers that need whole records (the scaling card); tables come from `read_tables`."""
    parts = _in_pool(_read_valid, [str(p) for p in paths], jobs)
    return [r for recs, _ in parts for r in recs], [i for _, inv in parts for i in inv]


def read_tables(
    paths: Iterable[str | Path], jobs: int = 1, meanwhile: Callable[[], None] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, Invalid]:
    """(runs table, epochs table, invalid files) from metrics files, `jobs` processes reading,
    validating and tabulating chunks of them side by side; `meanwhile` runs in this process
    while they do."""
    with gc_paused():
        parts = _in_pool(_tables_of, [str(p) for p in paths], jobs, meanwhile)
        if len(parts) == 1:
            return parts[0]
        invalid = [i for p in parts for i in p[2]]
        runs, epochs = ([t[i] for t in parts if len(t[i])] or [parts[0][i]] for i in (0, 1))
        del parts
        # each chunk in the final column order first, so that the joined table is the only
        # copy (joining, then reordering its columns, held three copies of 100,000 runs)
        order = _column_order(dict.fromkeys(c for t in runs for c in t.columns))
        runs = [t if list(t.columns) == order else t.reindex(columns=order) for t in runs]
        runs = pd.concat(runs, ignore_index=True)  # each chunk let go as it is joined
        return runs, pd.concat(epochs, ignore_index=True), invalid


def _flatten(d: dict, prefix: str = "", out: dict | None = None, skip: Iterable = ()) -> dict:
    """Nested fields as dotted columns, but the top-level keys in `skip`. A list of numbers or
    names (per-rank figures, hosts) becomes its space-separated values; a list of lists or
    objects, its JSON text."""
    out = {} if out is None else out
    for k, v in d.items():
        if k in skip:
            continue
        kind = type(v)  # JSON's own types: exact checks are faster than isinstance
        if kind is dict:
            _flatten(v, f"{prefix}{k}.", out)  # an empty dict has no leaves: no column
        elif kind is list:  # an empty one is no value: CSV reads "" back as NA anyway
            nested = any(type(x) in (list, dict) for x in v)
            out[prefix + k] = None if not v else json.dumps(v) if nested else " ".join(map(str, v))
        else:
            out[prefix + k] = v
    return out


def memory_error(block: dict) -> tuple[int | None, float | None]:
    """(the predicted peak bytes per rank, measured ÷ predicted − 1): the error where a device
    peak was measured (torch.cuda.max_memory_allocated), None elsewhere."""
    predicted = (block.get("predicted") or {}).get("total_bytes")
    measured = block.get("peak_device_bytes")
    return predicted, measured / predicted - 1 if predicted and measured else None


def memory_errors(block: dict) -> dict:
    """The record's memory block as runs.csv's prediction columns: the allocated peak
    (`predicted_peak_bytes`, `memory_error` against peak_device_bytes), the reserved side
    (`predicted_reserved_bytes`: tensors, CUDA runtime and NCCL; `memory_error_reserved`
    against NVML's per-process peak), and the host (`predicted_host_bytes`,
    `host_memory_error` against the ranks' peak RSS): measured ÷ predicted − 1, None where
    either is missing."""
    p = block.get("predicted") or {}

    def error(predicted, measured):
        return measured / predicted - 1 if predicted and measured else None

    out = dict(zip(("predicted_peak_bytes", "memory_error"), memory_error(block), strict=True))
    out["predicted_reserved_bytes"] = p.get("reserved_bytes")
    out["memory_error_reserved"] = error(p.get("reserved_bytes"),
                                         block.get("peak_nvml_process_bytes"))  # fmt: skip
    out["predicted_host_bytes"] = p.get("host_bytes")
    out["host_memory_error"] = error(p.get("host_bytes"), block.get("peak_host_rss_bytes"))
    return out


def runs_frame(records: list[dict]) -> pd.DataFrame:
    """One flat row per run; the per-epoch list becomes `train_loss_last`, `epochs_done`,
    `samples_trained` (the samples of every epoch: what a run's energy is measured over),
    `within_run_var` and `within_run_blocks` (the variance of the log of its mean step time
    from its steady epochs' batch means, and how many: trainscale.analysis.interval)."""
    rows = []
    for rec in records:
        epochs = rec["epochs"]
        flat = _flatten(rec, skip=NOT_FLATTENED)
        flat["epochs_done"] = len(epochs)
        flat["train_loss_last"] = epochs[-1]["train_loss"] if epochs else None
        flat["samples_trained"] = sum(e["samples"] for e in epochs) if epochs else None
        flat["within_run_var"], flat["within_run_blocks"] = within_variance(epochs)
        flat.update(memory_errors(rec["memory"]))
        rows.append(flat)
    df = pd.DataFrame.from_records(rows) if rows else pd.DataFrame(columns=LEAD)
    return _lead_first(df)


def _lead_first(df: pd.DataFrame) -> pd.DataFrame:
    return df[_column_order(df.columns)]


def _column_order(columns: Iterable[str]) -> list[str]:
    """runs.csv's column order: LEAD, then every other column by name."""
    columns = list(columns)
    lead = [c for c in LEAD if c in columns]
    return lead + sorted(c for c in columns if c not in lead)


def epochs_frame(records: list[dict]) -> pd.DataFrame:
    """One row per (run, epoch): the cell, the repeat, the status and the epoch's measurements.
    Built a column at a time (a list of rows took pandas twice as long to turn into columns)."""
    spec_keys = [*CELL, "world_size", "repeat"]
    names = ["run", "status", *spec_keys, "epoch", *EPOCH_FIELDS]
    columns: dict[str, list] = {c: [] for c in names}
    for rec in records:
        epochs = rec["epochs"]
        n = len(epochs)
        if not n:
            continue
        spec = rec["spec"]
        columns["run"] += [rec["run"]] * n
        columns["status"] += [rec["status"]] * n
        for k in spec_keys:
            columns[k] += [spec[k]] * n
        columns["epoch"] += [e["epoch"] for e in epochs]
        for f in EPOCH_FIELDS:
            columns[f] += [e.get(f) for e in epochs]
    return pd.DataFrame(columns)


def default_jobs() -> int:
    """Worker processes for reading: the CPUs this process may use, at most 8."""
    try:
        return max(1, min(len(os.sched_getaffinity(0)), 8))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, min(os.cpu_count() or 1, 8))
