"""The report's Cost section: per model, dataset and N, what a million tokens or samples cost
each cell in device-hours, energy and (where config `cost` gives prices) money, the cheapest
first; which cell is cheapest where it is not the fastest; and the devices no price applied
to. docs/methods.md defines the figures."""

from __future__ import annotations

from trainscale.analysis import cost
from trainscale.analysis.aggregate import Study, human
from trainscale.analysis.flags import cell_flags
from trainscale.analysis.summary import cheapest_value
from trainscale.report.rows import MAX_CELLS, _cell_label, na, with_ci


def cost_rows(study: Study) -> list[dict]:
    """The Cost table's rows (trainscale.analysis.cost.cost_table), formatted."""
    money = cost.currency(study.scaling)
    rows = []
    for r in cost.cost_table(study.scaling).itertuples(index=False):
        rows.append(
            {
                "model": r.model,
                "dataset": r.dataset,
                "n": int(r.world_size),
                "strategy": r.strategy,
                "config": _cell_label(r),
                "hours": human(r.hours_per_million),
                "device_hours": with_ci(
                    r.device_hours_per_million_mean, r.device_hours_per_million_ci95
                ),
                "cost": with_ci(r.cost_per_million_mean, r.cost_per_million_ci95, money)
                if not na(r.cost_per_million_mean)
                else "–",
                "kwh": with_ci(r.kwh_per_million_mean, r.kwh_per_million_ci95),
                "cheapest": bool(r.cheapest),
                "flags": cell_flags(r),
                "runs": f"{r.ok}/{r.runs}",
            }
        )
    return rows


def cheapest_lines(study: Study) -> list[str]:
    """ "gpt-nano on shakespeare: the cheapest cell is torch-ddp at N=2 (…); the fastest is …",
    per model and dataset where the two differ."""
    money = cost.currency(study.scaling)
    out = []
    for r in cost.cheapest_and_fastest(study.scaling).itertuples(index=False):
        if not r.differ:
            continue
        value = cheapest_value(r, money)
        out.append(
            f"{r.model} on {r.dataset}: the cheapest cell is {r.cheapest} ({value}); "
            f"the fastest is {r.fastest}"
        )
    return out


def context(study: Study) -> dict:
    """The template's `cost` section."""
    rows = cost_rows(study)
    return {
        "rows": rows[:MAX_CELLS],
        "more": max(0, len(rows) - MAX_CELLS),
        "currency": cost.currency(study.scaling),
        "priced": any(r["cost"] != "–" for r in rows),
        "energy": any(r["kwh"] != "–" for r in rows),
        "cheapest": cheapest_lines(study),
        "warnings": cost.price_warnings(study.scaling),
    }
