"""The figures of error-bar lines: one draw function for every kind whose plot is
`facets.lines` with the settings listed under `lines:` in reports/figures.yaml, so that a
figure's axes, columns and labels are data in one place and not a call written per figure."""

from __future__ import annotations

from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from trainscale.report.figures.facets import lines
from trainscale.report.figures.registry import FIGURES, Kind, figure

#: `log2x: wide` in figures.yaml: a log2 x axis when x spans this factor or more.
WIDE = 8


def settings(d: pd.DataFrame, name: str) -> dict:
    """The keyword arguments of `facets.lines` for figure `name`, resolved against its table."""
    s = dict(FIGURES[name]["lines"])
    if s.get("log2x") == "wide":
        s["log2x"] = d[s["x"]].max() / max(d[s["x"]].min(), 1) >= WIDE
    if "ylim" in s:
        s["ylim"] = tuple(s["ylim"])
    return s


def draw_lines(d: pd.DataFrame, kind: Kind, **extra) -> Figure:
    """Figure `kind` as error-bar lines; `extra` adds what YAML cannot say (reference lines,
    legend rows, a column order)."""
    return lines(d, kind, **settings(d, kind.name), **extra)


def lines_figure(name: str, **where: Any) -> None:
    """Register figure `name` drawn by `draw_lines` alone; `where` is what `figure` takes (the
    table's function `data`, the facet keys `row` and `col`)."""
    figure(name, **where)(draw_lines)
