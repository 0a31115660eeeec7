"""A tune's report.html: one self-contained page (the study report's style, its figure
embedded) with the winning set of every panel, what the tune spent beside what the whole
grid would have cost, the search drawn as cells against rounds, the failed runs, round 0's
dropped combinations, and the method (`trainscale.tune`'s docstring).
"""

from __future__ import annotations

import base64
import io
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trainscale
import trainscale.tune
from trainscale.report import html
from trainscale.tune import results
from trainscale.tune.race import BEST, STOPPED
from trainscale.tune.records import CellDecision, Round, RoundZero, Values, last_decisions
from trainscale.tune.space import MATRIX_KEYS

if TYPE_CHECKING:
    from matplotlib.axes import Axes

TEMPLATE = "tune.html.j2"
#: How the figure marks where each cell ended, by the start of its reason.
ENDS = {
    "best": ("*", "#029e73", "in the winning set"),
    "slower": ("X", "#d55e00", "stopped: slower than the best"),
    "cap": ("o", "#de8f05", "cut by the cap (could still be the best)"),
    "no run": ("s", "#949494", "stopped: no ok run, or never ranked"),
}


def how_ended(cell: CellDecision) -> str:
    if cell.won:
        return "best"
    if cell.reason.startswith("slower"):
        return "slower"
    if cell.reason.startswith("cut by the cap"):
        return "cap"
    return "no run"


def varying(space: RoundZero) -> list[str]:
    """The matrix keys whose values differ between the tune's cells, strategy first."""
    keys = [k for k in MATRIX_KEYS if len({str(c.values[k]) for c in space.cells}) > 1]
    return keys if "strategy" in keys else ["strategy", *keys]


def label(values: Values, keys: list[str]) -> str:
    """A cell as the page names it: its strategy and its other values that vary."""
    return " ".join(str(values[k]) if k == "strategy" else f"{k} {values[k]}" for k in keys)


def number(x: float | None, digits: int = 3) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:,.0f}" if abs(x) >= 10 ** (digits - 1) else f"{x:.{digits}g}"


@dataclass(frozen=True)
class Search:
    """The search as the figure draws it: each cell's rounds and last row, and the figure's
    rows, a header row above each panel's cells."""

    seen: dict[str, list[int]]  # cell -> the rounds it ran in
    last: dict[str, CellDecision]  # cell -> its row of the last round it appears in
    rows: list[tuple[float, str]]  # (y, cell)
    panels: list[tuple[float, str]]  # (y, panel label)

    @classmethod
    def of(cls, rounds: list[Round]) -> Search:
        seen: dict[str, list[int]] = {}
        for r in rounds:
            for c in r.cells:
                if c.ran or c.cell not in seen:  # a round it ran in
                    seen.setdefault(c.cell, []).append(r.round)
        last = last_decisions(rounds)
        order = sorted(
            last, key=lambda c: (last[c].panel, -len(seen[c]), -(last[c].score or -math.inf))
        )
        rows: list[tuple[float, str]] = []
        panels: list[tuple[float, str]] = []
        for cell in order:
            y = len(rows) + len(panels)
            if not panels or panels[-1][1] != last[cell].panel:
                panels.append((y, last[cell].panel))
                y += 1
            rows.append((y, cell))
        return cls(seen, last, rows, panels)


def figure(space: RoundZero, rounds: list[Round]) -> str:
    """The search as a PNG data URI: one row per cell, grouped by panel, a line over the
    rounds it ran in and a mark where it ended."""
    import matplotlib as mpl
    from matplotlib.figure import Figure

    from trainscale.report.figures.style import theme

    search = Search.of(rounds)
    n = len(search.rows) + len(search.panels)
    with mpl.rc_context(theme()):
        fig = Figure(figsize=(8.5, max(2.6, 0.2 * n + 1.3)))
        ax = fig.add_subplot()
        draw_search(ax, search, varying(space))
        ax.set_ylim(n - 0.5, -0.6)
        ax.set_xticks(
            [r.round for r in rounds],
            [f"{r.round}\n{r.steady_epochs} × {r.steps_per_epoch} steps" for r in rounds],
        )
        ax.set_xlim(0.5, len(rounds) + 0.5)
        ax.set_xlabel("round (steady epochs × steps of each run)")
        legend(ax)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=96)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def draw_search(ax: Axes, search: Search, keys: list[str]) -> None:
    """Each panel's header and each cell's line over its rounds, marked where it ended."""
    from trainscale.report.figures.style import STRATEGY_COLOURS

    for y, panel in search.panels:
        ax.axhline(y - 0.5, color=".6", lw=0.6)
        ax.text(0.55, y, panel, ha="left", va="center", fontsize=7, color=".3")
    for y, cell in search.rows:
        c, seen = search.last[cell], search.seen[cell]
        colour = STRATEGY_COLOURS.get(c.values["strategy"], (0.4, 0.4, 0.4))
        ax.plot(seen, [y] * len(seen), "-", color=colour, lw=2, alpha=0.8)
        marker, mark, _ = ENDS[how_ended(c)]
        ax.plot(seen[-1], y, marker, color=mark, ms=8 if marker == "*" else 6,
                mfc="none" if marker == "o" else mark)  # fmt: skip
    ax.set_yticks(
        [y for y, _ in search.rows],
        [label(search.last[c].values, keys) for _, c in search.rows]
        if len(search.rows) <= 150
        else [],
        fontsize=6.5,
    )


def legend(ax: Axes) -> None:
    """What each end mark means, above the axes."""
    from matplotlib.lines import Line2D

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


def context(space: RoundZero, rounds: list[Round], config: dict) -> dict:
    """What tune.html.j2 shows, every value formatted."""
    dropped = Counter(d.reason for d in space.dropped)
    return {
        "study": space.study,
        "version": trainscale.__version__,
        "settings": space.settings.to_dict(),
        "first_runs": sum(len(r) for r in space.next.values()),
        "n_cells": len(space.cells),
        "n_dropped": len(space.dropped),
        "ended": rounds[-1].done,
        "figure": figure(space, rounds),
        "winners": winner_rows(space, rounds),
        "costs": cost_row(results.costs(space, rounds)),
        "rounds": [round_row(r) for r in rounds],
        "failed": [
            {
                "round": r.round,
                "run": f"{f.cell}/repeat~{f.repeat}",
                "status": f.status,
                "error": f.error,
            }
            for r in rounds
            for f in r.failed
        ],  # fmt: skip
        "dropped": sorted(dropped.items(), key=lambda kv: -kv[1]),
        "definitions": html.definitions(trainscale.tune.__doc__)[1],
    }


def winner_rows(space: RoundZero, rounds: list[Round]) -> list[dict[str, object]]:
    """The winning set's rows: each winner's estimate, interval and the round that decided."""
    keys = varying(space)
    decided = {c.cell: r.round for r in rounds for c in r.cells}
    return [
        {
            "panel": c.panel,
            "cell": label(c.values, keys),
            "estimate": number(c.estimate),
            "interval": f"{number(c.ci_low)} – {number(c.ci_high)}",
            "unit": c.unit,
            "round": decided[c.cell],
            "reason": c.reason,
        }
        for c in results.winners(rounds)
    ]


def cost_row(costs: results.Costs) -> dict[str, object]:
    """What the tune spent beside what the grid would have cost, formatted."""
    money = lambda x: "–" if x is None else f"{x:,.4g} {costs.currency}"  # noqa: E731
    share = costs.share
    return {
        "runs": costs.runs,
        "worker_hours": number(costs.worker_hours),
        "money": money(costs.money),
        "grid_runs": costs.grid_runs,
        "grid_worker_hours": number(costs.grid_worker_hours),
        "grid_money": money(costs.grid_money),
        "share": "–" if not math.isfinite(share) else f"{100 * share:.0f} %",
        "unpredicted": len(costs.unpredicted),
        "dearer": math.isfinite(share) and share > 1,
    }


def round_row(result: Round) -> dict[str, object]:
    """A round's row: its cells run, decisions, runs, failures and worker-hours."""
    return {
        "round": result.round,
        "cells": sum(c.ran > 0 for c in result.cells),
        "steady": f"{result.steady_epochs} × {result.steps_per_epoch}",
        **{
            d.replace(" ", "_"): sum(c.decision == d for c in result.cells)
            for d in ("go on", STOPPED, BEST)
        },
        "runs": result.runs,
        "failed": len(result.failed),
        "worker_hours": number(result.worker_seconds / 3600),
    }


def write_html(out: str | Path, space: RoundZero, rounds: list[Round], config: dict) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    page = html.templates().get_template(TEMPLATE)
    out.write_text(
        page.render(style=html.stylesheet(), **context(space, rounds, config)), encoding="utf-8"
    )
    return out
