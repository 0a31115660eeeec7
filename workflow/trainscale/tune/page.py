"""A tune's report.html: one self-contained page (the study report's style, its figure
embedded) with the winning set of every panel, what the tune spent beside what the whole
grid would have cost, the search drawn as cells against rounds, the failed runs, round 0's
dropped combinations, and the method (`trainscale.tune`'s docstring).
"""

from __future__ import annotations

import base64
import io
import math
from pathlib import Path

import trainscale
import trainscale.tune
from trainscale.report import html
from trainscale.tune.rule import BEST, STOPPED
from trainscale.tune.space import MATRIX_KEYS

TEMPLATE = "tune.html.j2"
#: How the figure marks where each cell ended, by the start of its reason.
ENDS = {
    "best": ("*", "#029e73", "in the winning set"),
    "slower": ("X", "#d55e00", "stopped: slower than the best"),
    "cap": ("o", "#de8f05", "cut by the cap (could still be the best)"),
    "no run": ("s", "#949494", "stopped: no ok run, or never ranked"),
}


def how_ended(cell: dict) -> str:
    if cell["decision"] == BEST:
        return "best"
    if cell["reason"].startswith("slower"):
        return "slower"
    if cell["reason"].startswith("cut by the cap"):
        return "cap"
    return "no run"


def varying(space: dict) -> list[str]:
    """The matrix keys whose values differ between the tune's cells, strategy first."""
    keys = [k for k in MATRIX_KEYS if len({str(c["values"][k]) for c in space["cells"]}) > 1]
    return keys if "strategy" in keys else ["strategy", *keys]


def label(values: dict, keys: list[str]) -> str:
    """A cell as the page names it: its strategy and its other values that vary."""
    return " ".join(str(values[k]) if k == "strategy" else f"{k} {values[k]}" for k in keys)


def number(x: float | None, digits: int = 3) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:,.0f}" if abs(x) >= 10 ** (digits - 1) else f"{x:.{digits}g}"


def figure(space: dict, rounds: list[dict]) -> str:
    """The search as a PNG data URI: one row per cell, grouped by panel, a line over the
    rounds it ran in and a mark where it ended."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from trainscale.report.figures.style import STRATEGY_COLOURS, theme

    keys = varying(space)
    seen: dict[str, list[int]] = {}
    last: dict[str, dict] = {}
    for r in rounds:
        for c in r["cells"]:
            if c.get("ran", 1) or c["cell"] not in seen:  # a round it ran in
                seen.setdefault(c["cell"], []).append(r["round"])
            last[c["cell"]] = c
    order = sorted(
        last, key=lambda c: (last[c]["panel"], -len(seen[c]), -(last[c]["score"] or -math.inf))
    )
    rows: list[tuple[float, str]] = []  # (y, cell), a header row above each panel's cells
    panels: list[tuple[float, str]] = []
    for cell in order:
        y = len(rows) + len(panels)
        if not panels or panels[-1][1] != last[cell]["panel"]:
            panels.append((y, last[cell]["panel"]))
            y += 1
        rows.append((y, cell))
    n = len(rows) + len(panels)
    import matplotlib as mpl

    with mpl.rc_context(theme()):
        fig = Figure(figsize=(8.5, max(2.6, 0.2 * n + 1.3)))
        ax = fig.add_subplot()
        for y, panel in panels:
            ax.axhline(y - 0.5, color=".6", lw=0.6)
            ax.text(0.55, y, panel, ha="left", va="center", fontsize=7, color=".3")
        for y, cell in rows:
            c = last[cell]
            colour = STRATEGY_COLOURS.get(c["values"]["strategy"], (0.4, 0.4, 0.4))
            ax.plot(seen[cell], [y] * len(seen[cell]), "-", color=colour, lw=2, alpha=0.8)
            marker, mark, _ = ENDS[how_ended(c)]
            ax.plot(
                seen[cell][-1],
                y,
                marker,
                color=mark,
                ms=8 if marker == "*" else 6,
                mfc="none" if marker == "o" else mark,
            )
        ax.set_yticks(
            [y for y, _ in rows],
            [label(last[c]["values"], keys) for _, c in rows] if len(rows) <= 150 else [],
            fontsize=6.5,
        )
        ax.set_ylim(n - 0.5, -0.6)
        ax.set_xticks(
            [r["round"] for r in rounds],
            [f"{r['round']}\n{r['steady_epochs']} × {r['steps_per_epoch']} steps" for r in rounds],
        )
        ax.set_xlim(0.5, len(rounds) + 0.5)
        ax.set_xlabel("round (steady epochs × steps of each run)")
        ax.legend(
            handles=[
                Line2D([], [], ls="", marker=m, color=c, mfc="none" if m == "o" else c, label=t)
                for m, c, t in ENDS.values()
            ],
            fontsize=7,
            loc="lower left",
            bbox_to_anchor=(0, 1.01),
            ncol=2,
            frameon=False,
        )
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=96)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def context(space: dict, rounds: list[dict], config: dict) -> dict:
    """What tune.html.j2 shows, every value formatted."""
    from trainscale.tune import results

    keys = varying(space)
    costs = results.costs(space, rounds)
    winners = results.winners(rounds)
    decided = {c["cell"]: r["round"] for r in rounds for c in r["cells"]}
    money = lambda x: "–" if x is None else f"{x:,.4g} {costs['currency']}"  # noqa: E731
    dropped: dict[str, int] = {}
    for d in space["dropped"]:
        dropped[d["reason"]] = dropped.get(d["reason"], 0) + 1
    return {
        "study": space["study"],
        "version": trainscale.__version__,
        "settings": space["settings"],
        "first_runs": sum(len(r) for r in space["next"].values()),
        "n_cells": len(space["cells"]),
        "n_dropped": len(space["dropped"]),
        "ended": rounds[-1]["done"],
        "figure": figure(space, rounds),
        "winners": [
            {
                "panel": c["panel"],
                "cell": label(c["values"], keys),
                "estimate": number(c["estimate"]),
                "interval": f"{number(c['ci_low'])} – {number(c['ci_high'])}",
                "unit": c["unit"],
                "round": decided[c["cell"]],
                "reason": c["reason"],
            }
            for c in winners
        ],
        "costs": {
            "runs": costs["runs"],
            "worker_hours": number(costs["worker_hours"]),
            "money": money(costs["money"]),
            "grid_runs": costs["grid_runs"],
            "grid_worker_hours": number(costs["grid_worker_hours"]),
            "grid_money": money(costs["grid_money"]),
            "share": "–" if not math.isfinite(costs["share"]) else f"{100 * costs['share']:.0f} %",
            "unpredicted": len(costs["unpredicted"]),
            "dearer": math.isfinite(costs["share"]) and costs["share"] > 1,
        },
        "rounds": [
            {
                "round": r["round"],
                "cells": sum(c.get("ran", 1) > 0 for c in r["cells"]),
                "steady": f"{r['steady_epochs']} × {r['steps_per_epoch']}",
                **{
                    d.replace(" ", "_"): sum(c["decision"] == d for c in r["cells"])
                    for d in ("go on", STOPPED, BEST)
                },
                "runs": r["runs"],
                "failed": len(r["failed"]),
                "worker_hours": number(r["worker_seconds"] / 3600),
            }
            for r in rounds
        ],
        "failed": [
            {
                "round": r["round"],
                "run": f"{f['cell']}/repeat~{f['repeat']}",
                "status": f["status"],
                "error": f["error"],
            }
            for r in rounds
            for f in r["failed"]
        ],
        "dropped": sorted(dropped.items(), key=lambda kv: -kv[1]),
        "definitions": html.definitions(trainscale.tune.__doc__)[1],
    }


def write_html(out: str | Path, space: dict, rounds: list[dict], config: dict) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    page = html.templates().get_template(TEMPLATE)
    out.write_text(
        page.render(style=html.stylesheet(), **context(space, rounds, config)), encoding="utf-8"
    )
    return out
