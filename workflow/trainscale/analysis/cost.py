"""What a run's training costs per million units of work: device-hours, money and energy.

A unit is a token on token data (a GPT's windows of seq_len ids) and a sample elsewhere, as in
tokens/s and samples/s. Each figure is computed per run from its record, so records written
before this module get them too, then averaged over a cell's ok runs with a 95% CI like every
metric of scaling.csv (`trainscale.analysis.cells`); the definitions are the terms "device
hours per million", "cost per million" and "energy per million" of docs/methods.md (the
report's Methods).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainscale.plan.prices import CPU_KEY, Prices

#: Units in a million, seconds in an hour, joules in a kilowatt-hour.
MILLION, HOUR, KWH = 1e6, 3600.0, 3.6e6
#: The Cost table's groups.
GROUP = ["model", "dataset", "world_size"]
#: The per-run figures (runs' columns, then scaling.csv's metrics).
FIGURES = ("device_hours_per_million", "cost_per_million", "kwh_per_million")


def _column(runs: pd.DataFrame, name: str, default: object = np.nan) -> pd.Series:
    return runs[name] if name in runs else pd.Series(default, index=runs.index)


def run_costs(runs: pd.DataFrame, prices: Prices | None) -> pd.DataFrame:
    """Per run (runs' index): FIGURES, `price_key` (the cost.device_hour key that priced it),
    `price_note` (why it has no money figure, "" where it has or no prices are given) and
    `currency` (config cost.currency; None without prices)."""
    num = lambda name: pd.to_numeric(_column(runs, name), errors="coerce")  # noqa: E731
    seq = num("spec.seq_len").fillna(0)
    per_sample = seq.where(seq > 0, 1.0)  # units in one sample: its tokens, or the sample
    devices = num("spec.world_size")
    units_per_second = num("throughput") * per_sample
    device_hours = devices * MILLION / units_per_second / HOUR
    units_trained = num("samples_trained") * per_sample
    out = pd.DataFrame(index=runs.index)
    out["device_hours_per_million"] = device_hours.where(units_per_second > 0)
    out["kwh_per_million"] = (num("device.energy_joules") / units_trained * MILLION / KWH).where(
        units_trained > 0
    )
    out["cost_per_million"] = np.nan
    out["price_key"] = None
    out["price_note"] = ""
    out["currency"] = None
    if prices is None:
        return out
    kinds = _column(runs, "device.kind", None).astype(object)
    names = _column(runs, "device.name", None).astype(object)
    threads = num("spec.threads_per_worker").fillna(1)
    named = [
        (kind if isinstance(kind, str) else None, name if isinstance(name, str) else None)
        for kind, name in zip(kinds, names, strict=True)
    ]
    matched = {device: prices.match(*device) for device in set(named)}  # once per device
    out["price_key"] = [matched[d][0] for d in named]
    out["price_note"] = [matched[d][1] for d in named]
    hourly = out["price_key"].map(lambda k: prices.device_hour.get(k, np.nan) if k else np.nan)
    per_device = hourly.astype(float) * threads.where(out["price_key"] == CPU_KEY, 1.0)
    out["cost_per_million"] = device_hours * per_device
    out["currency"] = prices.currency
    return out


def cost_table(scaling: pd.DataFrame) -> pd.DataFrame:
    """The report's Cost table: per model, dataset and N, every cell with a device-hour figure,
    the cheapest first (cost per million where priced, else device-hours per million), with
    `hours_per_million` (wall time per million units at the cell's mean throughput) and
    `cheapest` (True for each group's first)."""
    if not len(scaling) or "device_hours_per_million_mean" not in scaling:
        return pd.DataFrame(columns=["model", "dataset", "world_size", "strategy"])
    d = scaling[scaling["device_hours_per_million_mean"].notna()].copy()
    d["hours_per_million"] = d["device_hours_per_million_mean"] / d["world_size"]
    by = _by(d)
    order = d[by].fillna(np.inf)
    d = d.assign(_order=order).sort_values([*GROUP, "_order"], kind="stable")
    d["cheapest"] = ~d.duplicated(GROUP)
    return d.drop(columns="_order").reset_index(drop=True)


def _by(cells: pd.DataFrame) -> str:
    """What "cheapest" means: cost per million where any cell is priced, else device-hours."""
    priced = "cost_per_million_mean" in cells and cells["cost_per_million_mean"].notna().any()
    return "cost_per_million_mean" if priced else "device_hours_per_million_mean"


def pareto(points: pd.DataFrame, x: str, y: str) -> pd.Series:
    """Whether each point is on the Pareto front of (x, y), both lower-is-better: no other
    point is at most as high in both and lower in one."""
    p = points[[x, y]].to_numpy(float)
    on = np.ones(len(p), dtype=bool)
    for i, (xi, yi) in enumerate(p):
        if not np.isfinite([xi, yi]).all():
            on[i] = False
            continue
        other = (p[:, 0] <= xi) & (p[:, 1] <= yi) & ((p[:, 0] < xi) | (p[:, 1] < yi))
        on[i] = not other.any()
    return pd.Series(on, index=points.index)


def cheapest_and_fastest(scaling: pd.DataFrame) -> pd.DataFrame:
    """Per model and dataset, over every N: the cheapest cell (lowest cost per million where
    priced, else device-hours per million) and the fastest (highest mean throughput), each as
    "strategy at N=n", with `differ` where they are not the same cell."""
    cols = ["model", "dataset", "cheapest", "cheapest_value", "by", "fastest", "differ"]
    t = cost_table(scaling)
    if not len(t) or "logical" in t and t["logical"].all():
        return pd.DataFrame(columns=cols)
    t = t[~t["logical"].astype(bool)] if "logical" in t else t
    by = _by(t)
    rows = []
    for (model, dataset), g in t.groupby(["model", "dataset"], sort=True):
        priced = g[g[by].notna()]
        if not len(priced):
            continue
        cheap = priced.loc[priced[by].idxmin()]
        fast = g.loc[g["throughput_mean"].idxmax()]
        name = lambda r: f"{r['strategy']} at N={int(r['world_size'])}"  # noqa: E731
        rows.append([model, dataset, name(cheap), float(cheap[by]), by.removesuffix("_mean"),
                     name(fast), cheap.name != fast.name])  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def currency(scaling: pd.DataFrame) -> str:
    """The prices' currency (config cost.currency), "" where no cell was priced."""
    c = scaling["currency"].dropna() if "currency" in scaling else []
    return str(c.iloc[0]) if len(c) else ""


def units(seq_len: float | None) -> str:
    """What a cell's million counts: tokens on token data (seq_len > 0), else samples."""
    return "tokens" if seq_len and not pd.isna(seq_len) and seq_len > 0 else "samples"


def price_warnings(scaling: pd.DataFrame) -> list[str]:
    """The devices no price applied to, once each (scaling.csv `price_note`)."""
    if "price_note" not in scaling:
        return []
    notes = scaling["price_note"].dropna().astype(str)
    return sorted({n for n in notes if n})
