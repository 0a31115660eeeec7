"""Two per-strategy sections of report.html, each strategy at its largest world size per model
and data set: per-class test accuracy with the class names (seed 002's DeepSpeed CIFAR-10 run:
57 % overall, "car" 74 %, "cat" 36 %), and memory and utilisation side by side (seed 002's
table: peak device memory, mean device utilisation where measured, peak host RSS).

Both are computed from the runs table alone (runs.csv keeps each run's `test.confusion` as
JSON and `test.class_names` as text), so a report made from copied metrics files has them too.
At a strategy's largest world size every ok run is pooled: the confusion matrices are summed
over repeats and configurations (batch, precision, scale), so each class's accuracy counts
every test sample those runs scored; the peaks are the largest and the utilisation the mean
over those runs.
"""

from __future__ import annotations

import json

import pandas as pd

from trainscale.analysis.aggregate import Study, human
from trainscale.measure import classes
from trainscale.report.rows import mib, pct

#: Classes shown per table at most (a data set of more has the rest in runs.csv).
MAX_CLASSES = 40
_KEY = ["spec.model", "spec.dataset", "spec.strategy"]


def _largest(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs at the largest world size of their (model, data set, strategy)."""
    top = runs.groupby(_KEY)["spec.world_size"].transform("max")
    return runs[runs["spec.world_size"] == top]


def _names(text, k: int, dataset: str) -> list[str]:
    """A run's class names from runs.csv's text (space-separated, or JSON where a name has a
    space); the data set's own or the label numbers where they cannot be read back."""
    if isinstance(text, str):
        names = json.loads(text) if text.startswith("[") else text.split(" ")
        if len(names) == k:
            return [str(n) for n in names]
    known = classes.NAMES.get(dataset, ())
    return list(known) if len(known) == k else [str(i) for i in range(k)]


def per_class_groups(study: Study) -> list[dict]:
    """Per (model, data set): its class names and one row per strategy at its largest world
    size, with the pooled accuracy and each class's accuracy (formatted)."""
    runs = study.runs
    if not len(runs) or "test.confusion" not in runs:
        return []
    runs = runs[(runs["status"] == "ok") & runs["test.confusion"].notna()]
    if not len(runs):
        return []
    groups: dict[tuple[str, str], dict] = {}
    for (model, dataset, strategy), g in _largest(runs).groupby(_KEY, sort=True):
        matrices = [json.loads(c) for c in g["test.confusion"]]
        k = len(matrices[0])
        pooled = [[sum(m[i][j] for m in matrices) for j in range(k)] for i in range(k)]
        total = sum(map(sum, pooled))
        per_class = classes.per_class_accuracy(pooled)
        names = _names(g["test.class_names"].iloc[0] if "test.class_names" in g else None, k,
                       dataset)  # fmt: skip
        group = groups.setdefault(
            (model, dataset),
            {"model": model, "dataset": dataset, "classes": names[:MAX_CLASSES], "rows": [],
             "more": max(0, k - MAX_CLASSES)},
        )  # fmt: skip
        scored = [(v, n) for v, n in zip(per_class, names, strict=True) if v is not None]
        group["rows"].append(
            {
                "strategy": strategy,
                "n": int(g["spec.world_size"].iloc[0]),
                "runs": len(g),
                "accuracy": pct(sum(pooled[i][i] for i in range(k)) / total if total else None),
                "per_class": [pct(v) for v in per_class[:MAX_CLASSES]],
                "worst": min(scored)[1] if scored else "–",
            }
        )
    return list(groups.values())


def _max(g: pd.DataFrame, col: str):
    return g[col].max() if col in g and g[col].notna().any() else None


def _energy(g: pd.DataFrame) -> tuple[float, float] | None:
    """Mean energy per run over training, and per 1,000 samples trained (epochs × samples per
    epoch), over the runs that measured it; None where none did (no sensor)."""
    if "device.energy_joules" not in g:
        return None
    g = g[g["device.energy_joules"].notna()]
    if not len(g):
        return None
    joules = g["device.energy_joules"].astype(float)
    samples = g["spec.epochs"].astype(float) * g["data.train_samples"].astype(float)
    return float(joules.mean()), float((joules / samples * 1000).mean())


def resource_rows(study: Study) -> list[dict]:
    """Per (model, data set, strategy) at its largest world size: peak device memory and
    peak host RSS (the largest over its ok runs), mean device utilisation and mean energy per
    run and per 1,000 training samples (the means over the runs that measured them),
    formatted."""
    runs = study.runs
    if not len(runs):
        return []
    runs = runs[runs["status"] == "ok"]
    out = []
    for (model, dataset, strategy), g in _largest(runs).groupby(_KEY, sort=True):
        util = g["device.utilization_mean"].dropna() if "device.utilization_mean" in g else []
        energy = _energy(g)
        kinds = sorted(g["device.kind"].dropna().astype(str).unique()) if "device.kind" in g else []
        out.append(
            {
                "strategy": strategy,
                "model": model,
                "dataset": dataset,
                "n": int(g["spec.world_size"].iloc[0]),
                "runs": len(g),
                "device": ", ".join(kinds) or "–",
                "peak_device": mib(_max(g, "memory.peak_device_bytes")),
                "utilization": "–" if not len(util) else f"{human(util.mean())} %",
                "peak_rss": mib(_max(g, "memory.peak_host_rss_bytes")),
                "energy": "–" if energy is None else f"{human(energy[0])} J",
                "energy_per_ksample": "–" if energy is None else f"{human(energy[1])} J",
            }
        )
    return out


def context(study: Study) -> dict:
    """The template's `per_class` (empty when no run recorded a confusion) and `resources`."""
    return {"per_class": per_class_groups(study), "resources": resource_rows(study)}
