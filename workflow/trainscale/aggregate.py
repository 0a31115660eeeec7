"""Study tables from metrics files: one row per run (runs.csv) and a first text summary.

Files are validated against the metrics schema when read; a file that is not valid JSON or
breaks the schema is listed as invalid, never silently dropped, and never stops the rest.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from trainscale import metrics

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


def load(paths: Iterable[str | Path]) -> tuple[list[dict], list[tuple[str, str]]]:
    """(valid records with their `run` id, [(path, why invalid)])."""
    records, invalid = [], []
    for p in paths:
        try:
            rec = metrics.read(p)
        except metrics.MetricsError as e:
            invalid.append((str(p), str(e)))
            continue
        rec["run"] = run_id(Path(p))
        records.append(rec)
    return records, invalid


def run_id(path: Path) -> str:
    """The run path (`strategy~…/repeat~N`) from a metrics file's location."""
    parts = path.parent.parts
    start = next((i for i, p in enumerate(parts) if p.startswith("strategy~")), len(parts) - 1)
    return "/".join(parts[start:])


def runs_frame(records: list[dict]) -> pd.DataFrame:
    """One flat row per run; the per-epoch list becomes `train_loss_last` and `epochs_done`."""
    rows = []
    for rec in records:
        flat = {k: v for k, v in rec.items() if k != "epochs"}
        flat["epochs_done"] = len(rec["epochs"])
        flat["train_loss_last"] = rec["epochs"][-1]["train_loss"] if rec["epochs"] else None
        rows.append(flat)
    df = pd.json_normalize(rows) if rows else pd.DataFrame(columns=LEAD)
    for c in ("spec.betas", "env.hostnames"):
        if c in df:
            df[c] = df[c].map(lambda v: " ".join(map(str, v)) if isinstance(v, list) else v)
    lead = [c for c in LEAD if c in df.columns]
    return df[lead + sorted(c for c in df.columns if c not in lead)]


def summary_text(df: pd.DataFrame, invalid: list[tuple[str, str]], study: str) -> str:
    """A first plain-text answer: every run's speed and accuracy, and what failed."""
    lines = [f"trainscale study {study!r}: {len(df)} runs"]
    if len(df):
        counts = df["status"].value_counts().to_dict()
        lines[0] += " (" + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ")"
    ok = df[df["status"] == "ok"] if len(df) else df
    if len(ok):
        keys = [
            "spec.model",
            "spec.dataset",
            "spec.world_size",
            "spec.batch_size",
            "spec.batch_mode",
            "spec.strategy",
        ]
        table = ok.sort_values([*keys, "spec.repeat"])
        lines.append("")
        lines.append(
            f"{'strategy':<16}{'model':<14}{'dataset':<19}{'N':>3}{'batch':>7} {'mode':<11}"
            f"{'samples/s':>11}{'epoch1 s':>10}{'steady s':>10}{'test acc':>9}{'RSS MiB':>9}"
        )
        for _, r in table.iterrows():
            acc = "n/a" if pd.isna(r["test.accuracy"]) else f"{r['test.accuracy']:.3f}"
            flag = "  oversubscribed" if r["oversubscribed"] else ""
            lines.append(
                f"{r['spec.strategy']:<16}{r['spec.model']:<14}{r['spec.dataset']:<19}"
                f"{r['spec.world_size']:>3}{r['spec.batch_size']:>7} {r['spec.batch_mode']:<11}"
                f"{r['throughput']:>11,.0f}{r['first_epoch_seconds']:>10.3f}"
                f"{r['steady_epoch_seconds']:>10.3f}{acc:>9}"
                f"{r['memory.peak_host_rss_bytes'] / 2**20:>9,.0f}{flag}"
            )
        best = table.loc[
            table.groupby(["spec.model", "spec.dataset", "spec.world_size"])["throughput"].idxmax()
        ]
        lines.append("")
        lines.append("fastest (per run):")
        for _, r in best.iterrows():
            lines.append(
                f"  {r['spec.model']} on {r['spec.dataset']} with {r['spec.world_size']} "
                f"worker(s): {r['spec.strategy']} at {r['throughput']:,.0f} samples/s"
            )
    failed = df[df["status"] != "ok"] if len(df) else df
    if len(failed):
        lines.append("")
        lines.append("failed runs:")
        for _, r in failed.iterrows():
            first = str(r["error"]).strip().splitlines()[0] if r["error"] else ""
            lines.append(f"  [{r['status']}] {r['run']}: {first}")
    if invalid:
        lines.append("")
        lines.append("invalid metrics files (not counted):")
        lines.extend(f"  {p}: {why}" for p, why in invalid)
    return "\n".join(lines) + "\n"


def write_runs_table(
    paths: Iterable[str | Path], csv: str | Path, summary: str | Path, study: str
) -> pd.DataFrame:
    """runs.csv and summary.txt from the study's metrics files."""
    records, invalid = load(paths)
    for p, why in invalid:
        print(f"trainscale: invalid metrics file {p}: {why}", file=sys.stderr)
    df = runs_frame(records)
    Path(csv).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(csv, index=False)
    Path(summary).write_text(summary_text(df, invalid, study))
    return df
