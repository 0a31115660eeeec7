"""The scaling card: a portable description of what one cluster does, from a study's results.

`results/<study>/scaling-card.json` (schema: workflow/schemas/scaling-card.schema.yaml) holds
the machine as the runs saw it, the all-reduce bus bandwidth by message size, the measured
throughput and scaling efficiency of every strategy × model × precision by N, and the failures.
`python -m trainscale.compare` compares two cards (cluster against cluster) the way it compares
two studies; in fact it turns every study folder into a card first, so both read the same
numbers. The per-cell figures are aggregate's (speedup, efficiency, means, 95% CI); one figure
is defined here:

- run throughput: the run's steady samples/s over all workers as metrics.json records it
  (`throughput`), cross-checked against the same record's epoch list (samples / seconds of
  epochs 2..E), its `steady_epoch_seconds` and `throughput_per_worker` × N. A record written by
  trainscale has them equal; when they differ by more than 1 % the file was edited or damaged,
  the cell gets a note naming the run, and the lowest reading is used (a regression check must
  not miss a slowdown because one field was left as it was).

`trainscale card FOLDER --out scaling-card.json` writes the card of any folder of
metrics files (e.g. runs copied back from a cluster); the `scaling_card` rule writes each
study's.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

import trainscale
from trainscale.analysis import aggregate
from trainscale.analysis.flags import cell_flags
from trainscale.compare.machine import machine, study_config
from trainscale.compare.sides import POOL
from trainscale.measure import collectives, metrics
from trainscale.plan import catalog

SCHEMA_ID = "trainscale.scaling-card/1"
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "scaling-card.schema.yaml"
#: A card's groups: strategy × model × precision, and what else must match to compare by N.
GROUP = [
    "strategy",
    "model",
    "precision",
    "dataset",
    "seq_len",
    "scale",
    "batch_size",
    "batch_mode",
    "activation_checkpointing",
    "offload",
    "memory_format",
    "compile",
    "grad_accum",
]
#: Readings of one run's throughput that may differ by this fraction before a note is raised.
CONSISTENT = 0.01


class CardError(ValueError):
    """A folder that cannot give a card (missing, no metrics files) or a card file that is not
    valid JSON or breaks the schema."""


@functools.cache
def _validator():
    import jsonschema

    return jsonschema.Draft202012Validator(yaml.safe_load(SCHEMA_PATH.read_text()))


def validate(card: dict, where: str = "scaling card") -> None:
    """Raise CardError listing the first places `card` breaks the scaling-card schema."""
    errors = sorted(_validator().iter_errors(card), key=lambda e: list(map(str, e.path)))
    if errors:
        msgs = [f"{'/'.join(map(str, e.path)) or '<top>'}: {e.message}" for e in errors[:5]]
        raise CardError(f"{where}: does not follow {SCHEMA_PATH.name}: " + "; ".join(msgs))


def read(path: str | Path) -> dict:
    """One card file, validated."""
    try:
        card = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CardError(f"{path}: not a readable scaling card ({e})") from e
    validate(card, str(path))
    return card


def is_card(path: Path) -> bool:
    """A .json file whose `schema` is the card's (any other JSON is not a card)."""
    if not path.is_file() or path.suffix != ".json":
        return False
    try:
        return json.loads(path.read_text()).get("schema") == SCHEMA_ID
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


# --------------------------------------------------------------------------------------------
# reading a folder


def run_throughput(rec: dict) -> tuple[float | None, str | None]:
    """(the run's throughput, a note when its readings disagree): see the module docstring."""
    readings = {"throughput": rec.get("throughput")}
    steady = rec.get("epochs", [])[1:]
    samples = sum(e["samples"] for e in steady)
    seconds = sum(e["seconds"] for e in steady)
    if steady and seconds > 0:
        readings["epochs 2..E"] = samples / seconds
    if steady and rec.get("steady_epoch_seconds"):
        readings["steady_epoch_seconds"] = samples / (rec["steady_epoch_seconds"] * len(steady))
    if rec.get("throughput_per_worker"):
        readings["throughput_per_worker × N"] = (
            rec["throughput_per_worker"] * rec["spec"]["world_size"]
        )
    found = {k: float(v) for k, v in readings.items() if v}
    if not found:
        return None, None
    low, high = min(found.values()), max(found.values())
    if high <= low * (1 + CONSISTENT):
        return low, None
    said = ", ".join(f"{k} {aggregate.human(v)}" for k, v in found.items())
    return low, f"inconsistent metrics in {rec.get('run', '?')}: {said} samples/s; lowest used"


def metrics_files(folder: Path) -> list[Path]:
    return aggregate.find_metrics(folder)


def collective_files(folder: Path) -> list[Path]:
    """Benchmark JSON files: under a `collectives` folder inside `folder`, or beside it when
    `folder` is a study's `runs` folder."""
    roots = [folder]
    if folder.name == "runs":
        roots.append(folder.parent / "collectives")
    found = set()
    for root in roots:
        for p in root.rglob("*.json"):
            if "collectives" in p.relative_to(root.parent).parts[:-1]:
                found.add(p)
    return sorted(found)


def _collective(path: Path) -> tuple[dict | None, dict | None]:
    """(card entry, None) for a usable benchmark file, (None, failure) for any other."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raw, why = {}, f"not readable JSON ({e})"
    else:
        status = raw.get("status", "ok")  # files from before `status` existed are ok
        why = None if status == "ok" else f"{status}: {raw.get('error') or 'no error recorded'}"
    if why is None:
        try:
            rec = collectives.read(path)
        except ValueError as e:
            why = str(e)
    if why is not None:
        fail = {k: raw.get(k) for k in ("backend", "workers", "nodes")}
        return None, {"file": str(path), **fail, "error": why}
    hosts = rec.get("rank_hosts") or rec.get("env", {}).get("hostnames") or []
    return {
        "backend": rec["backend"],
        "workers": rec["workers"],
        "nodes": rec["nodes"],
        "world_size": rec["world_size"],
        "device": str(rec.get("device", {}).get("name") or rec.get("device", {}).get("kind")),
        "hosts": sorted(set(map(str, hosts))),
        "sizes": [
            {
                "bytes": int(s["bytes"]),
                "p50_seconds": float(s["p50_seconds"]),
                "busbw_bytes_per_second": float(s["busbw_bytes_per_second"]),
            }
            for s in rec["sizes"]
        ],
    }, None


def _num(v) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def _points(records: list[dict], notes: dict[tuple, list[str]]) -> list[dict]:
    """scaling: aggregate's cell table, grouped by GROUP, one point per (workers, nodes)."""
    cells = aggregate.scaling_frame(aggregate.runs_frame(records))
    values, statuses, devices = _by_cell(records)
    groups: dict[tuple, dict] = {}
    for c in cells.sort_values([*GROUP, "nodes", "workers", "tp"]).itertuples(index=False):
        key = tuple(getattr(c, k) for k in aggregate.CELL)
        g = groups.setdefault(
            tuple(getattr(c, k) for k in GROUP),
            {**{k: _plain(getattr(c, k)) for k in GROUP}, "by_n": [], "prediction": None},
        )
        point = _point(c, values.get(key, []), statuses.get(key, {}), _cell_notes(c, notes))
        if key in devices:
            point["device"] = devices[key]
        g["by_n"].append(point)
    return list(groups.values())


def _by_cell(records: list[dict]) -> tuple[dict[tuple, list], dict[tuple, Counter], dict]:
    """Per cell key: its ok runs' throughputs, its runs by status, and the device of its
    first ok run (kind, name, threads_per_worker)."""
    values: dict[tuple, list[float]] = {}
    statuses: dict[tuple, Counter] = {}
    devices: dict[tuple, dict] = {}
    for r in records:
        statuses.setdefault(_key(r), Counter())[r["status"]] += 1
        if r["status"] == "ok" and r["throughput"]:
            values.setdefault(_key(r), []).append(r["throughput"])
            device = {k: r["device"].get(k) for k in ("kind", "name")}
            device["threads_per_worker"] = r["spec"].get("threads_per_worker")
            devices.setdefault(_key(r), device)
    return values, statuses, devices


def _cell_notes(c: Any, notes: dict[tuple, list[str]]) -> list[str]:
    """A cell's notes: its baseline's, its runs' (inconsistent metrics), its strategy's
    results note and its flags'."""
    cell_notes = list(notes.get(tuple(getattr(c, k) for k in aggregate.CELL), []))
    if c.baseline_note:
        cell_notes.insert(0, c.baseline_note)
    row = catalog.STRATEGIES.get(c.strategy)
    if row and row.results_note:  # e.g. tf-ps: asynchronous training
        cell_notes.append(row.results_note)
    return cell_notes + [f.note for f in cell_flags(c)]


def _point(c: Any, xs: list[float], statuses: Counter, notes: list[str]) -> dict:
    """A card point from a row of aggregate's cell table (`itertuples`)."""
    return {
        "workers": int(c.workers),
        "nodes": int(c.nodes),
        "world_size": int(c.world_size),
        "tp": int(c.tp),
        "runs": int(c.runs),
        "ok": int(c.ok),
        "statuses": dict(statuses),
        "throughput": {
            "values": xs,
            "n": len(xs),
            "mean": _num(c.throughput_mean),
            "ci95": _num(c.throughput_ci95),
            "per_worker_mean": _num(c.throughput_per_worker_mean),
            "interval": c.interval_method or None,
            "log_mean": _num(c.throughput_log_mean),
            "log_var": _num(c.throughput_log_var),
            "df": _num(c.interval_df),
            **{k: _num(getattr(c, k)) for k in POOL},
        },
        "speedup": _num(c.speedup),
        "efficiency": _num(c.efficiency),
        "efficiency_kind": str(c.efficiency_kind),
        "test_accuracy": _num(c.test_accuracy_mean),
        "peak_host_rss_bytes": _num(c.peak_host_rss_bytes_mean),
        "peak_device_bytes": _num(c.peak_device_bytes_mean),
        "notes": notes,
    }


def _key(rec: dict) -> tuple:
    return tuple(rec["spec"][k] for k in aggregate.CELL)


def _plain(v):
    """numpy scalars -> Python ones (json cannot write numpy's int64)."""
    return v.item() if hasattr(v, "item") else v


def build(folder: str | Path) -> dict:
    """The card of every metrics file (and all-reduce benchmark) under `folder`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CardError(f"{folder}: no such folder")
    paths = metrics_files(folder)
    if not paths:
        raise CardError(
            f"{folder}: no metrics.json under this folder; give a study's results folder "
            "(results/<study>), a folder of runs, or a scaling-card.json"
        )
    default = folder.resolve().name if folder.name != "runs" else folder.resolve().parent.name
    return from_files(paths, collective_files(folder), str(folder), default)


def from_files(
    metrics_paths: list[Path], collective_paths: list[Path], source: str, default_name: str
) -> dict:
    """The card of these metrics files and benchmark files, validated against its schema."""
    records, invalid = aggregate.load(metrics_paths)
    notes: dict[tuple, list[str]] = {}
    checked = []
    for rec in records:
        rec = copy.deepcopy(rec)
        if rec["status"] == "ok":
            x, note = run_throughput(rec)
            rec["throughput"] = x
            rec["throughput_per_worker"] = x / rec["spec"]["world_size"] if x else None
            if note:
                notes.setdefault(_key(rec), []).append(note)
        checked.append(rec)
    coll, coll_failures = [], []
    for p in collective_paths:
        entry, failure = _collective(Path(p))
        (coll if entry else coll_failures).append(entry or failure)
    name = aggregate.study_name(aggregate.runs_frame(records), default_name)
    card = {
        "schema": SCHEMA_ID,
        "study": name,
        "source": source,
        "created_utc": metrics.utc_now(),
        "trainscale": trainscale.__version__,
        "machine": machine(checked, coll),
        "config": study_config(checked),
        "collectives": coll,
        "scaling": _points(checked, notes) if checked else [],
        "failures": {
            "runs": [
                {"run": r["run"], "status": r["status"], "error": r.get("error") or ""}
                for r in checked
                if r["status"] != "ok"
            ],
            "collectives": coll_failures,
            "invalid": [{"path": p, "error": why} for p, why in invalid],
        },
    }
    _add_predictions(card, records, collective_paths)
    validate(card, f"scaling card of {source}")
    return card


def _add_predictions(card: dict, records: list[dict], collective_paths: list[Path]) -> None:
    """Each group's fitted step-time model (trainscale.analysis.predict: c0, c1, t_fixed, overlap
    and how they were fitted), what another cluster's prediction can start from; null where the
    model does not cover the strategy or the runs do not fit it. Never a measurement."""
    from trainscale.analysis import predict

    try:
        coll = aggregate.collectives_frame(collective_paths)
    except (OSError, ValueError):
        coll = aggregate.collectives_frame([])
    try:
        fitted = predict.fitted_parameters(aggregate.runs_frame(records), coll, {})
    except (ValueError, KeyError):
        return
    by_group = {tuple(_plain(f[k]) for k in GROUP): f for f in fitted}
    for g in card["scaling"]:
        f = by_group.get(tuple(g[k] for k in GROUP))
        if f:
            g["prediction"] = {
                k: (_plain(f[k]) if k != "notes" else [str(n) for n in f[k]])
                for k in ("c0", "c1", "t_fixed", "overlap", "notes")
            }


def load(source: str | Path) -> dict:
    """A card from a card file, or built from a folder of metrics files."""
    source = Path(source)
    if source.is_file():
        if not is_card(source):
            raise CardError(
                f'{source}: not a scaling card (no "schema": "{SCHEMA_ID}"); give a '
                "study's results folder, a folder of runs, or a scaling-card.json"
            )
        return read(source)
    return build(source)


def write(card: dict, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(card, indent=1, sort_keys=False) + "\n")
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None, prog: str = "trainscale card") -> int:
    """`trainscale card FOLDER --out FILE`: the scaling card of a folder of metrics files."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Write the scaling card of a folder of metrics files "
        "(a study's results folder or runs gathered from elsewhere).",
    )
    p.add_argument("folder", type=Path, help="a study's results folder or a folder of runs")
    p.add_argument("--out", type=Path, required=True, help="where to write scaling-card.json")
    a = p.parse_args(argv)
    try:
        card = build(a.folder)
    except CardError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    write(card, a.out)
    print(f"{prog}: wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
