"""The figures of error-bar lines: the generic figure (`lines`, drawn in the facet engine's
grid, `trainscale.report.figures.facets`) and one draw function for every kind whose plot is
`lines` with the settings listed under `lines:` in reports/figures.yaml, so that a figure's
axes, columns and labels are data in one place and not a call written per figure.

Lines are cells that differ only in the x-axis value: the colour (hue) and the facet say which,
and every other matrix value that varies in the study is a line style ("variant") listed in the
legend, so no two cells are ever averaged together. Error bars are the cells' 95% confidence
intervals as scaling.csv gives them (docs/methods.md defines them): from steps
and repeats for throughput, over repeats (Student's t) for the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.path import Path
from matplotlib.transforms import IdentityTransform

from trainscale.report.figures.facets import (
    KEYS,
    finish,
    grid,
    marker_path,
    side_width,
    xaxis,
)
from trainscale.report.figures.registry import FIGURES, Kind, figure
from trainscale.report.figures.style import (
    DASHES,
    MARKERS,
    header,
    hue_title,
    label,
    labels,
    palette,
)

#: `log2x: wide` in figures.yaml: a log2 x axis when x spans this factor or more.
WIDE = 8
#: Marker size of the lines' points, in points (matplotlib's markersize).
MARKER_SIZE = 4


@dataclass(frozen=True)
class LineOptions:
    """How `lines` draws a figure: the settings under `lines:` in reports/figures.yaml
    (`lined.settings`), and what YAML cannot say."""

    x: str  # the column on the x axis
    y: str  # the column on the y axis
    err: str | None  # the column of the error bars' half-width (a 95 % CI); None: no bars
    hue: str  # the cell key a colour stands for
    xlabel: str
    ylabel: str
    log2x: bool = False  # a log 2 x axis (where every x is positive)
    ideal: str | None = None  # the column of each line's N = 1 value: linear scaling from it
    ref: Callable[[Axes, pd.DataFrame], None] | None = None  # draws a reference into a facet
    legend_extra: tuple[Line2D, ...] = ()  # legend rows after the lines' (reference lines)
    ylim: tuple[float | None, float | None] = (0, None)
    col_order: tuple[str, ...] | None = None  # the columns' order (default: sorted labels)


@dataclass(frozen=True)
class _Table:
    """A line figure's rows in x order, labelled with their facet (`_row`, `_col`) and line
    style (`_style`), with the facets' labels in order and the figure's title."""

    d: pd.DataFrame
    rows: list[str]
    cols: list[str]
    title: str
    style_keys: list[str]


@dataclass(frozen=True)
class _Look:
    """What tells the lines apart: a colour per hue value, (marker, dashes) per variant, and
    the legend's rows saying so."""

    colours: dict
    styles: dict[str, tuple[str, str]]
    handles: list[Line2D]


@dataclass(frozen=True)
class _Points:
    """The table's columns a facet draws from, as arrays (a DataFrame per line cost more than
    drawing it); `base` and `n` only with `LineOptions.ideal`."""

    x: np.ndarray
    y: np.ndarray
    err: np.ndarray | None
    base: np.ndarray | None
    n: np.ndarray | None
    cells: pd.DataFrame  # the cell keys, x and y: what `LineOptions.ref` is given


def lines(data: pd.DataFrame, kind: Kind, opts: LineOptions) -> Figure:
    """Facets (the kind's row × col keys) of error-bar lines: colour = `opts.hue`, style =
    every other varying key, so each line is one sequence of cells along `opts.x`.

    `opts.ideal` names the column of each line's N = 1 value: a dotted line of linear scaling
    from it (`linear_from`). `opts.ref(ax, cells)` draws a reference into each facet; `cells`
    are the facet's rows with the cell keys, x and y only (a slice of every column, once per
    facet and line, cost more than the drawing)."""
    table = _table(data, kind, opts)
    look = _look(table, opts)
    texts = [hd.get_label() for hd in look.handles]
    fig, axes = grid(table.rows, table.cols, side=side_width(texts), legend_rows=len(texts))
    d = table.d.reset_index(drop=True)
    points = _points(d, opts)
    facets = _facets(d, opts.hue)
    ticks = {key: _x_ticks(points.x, series.values()) for key, series in facets.items()}
    for (ri, r), (ci, c) in ((a, b) for a in enumerate(table.rows) for b in enumerate(table.cols)):
        ax, series = axes[ri, ci], facets.get((r, c), {})
        ax.set_title(" · ".join(p for p in (r, c) if p))
        if not series:
            ax.text(0.5, 0.5, "no cells", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            continue
        _draw_facet(ax, series, points, look, opts)
        xaxis(ax, ticks[(r, c)], opts.log2x)
        # axis labels once per row and column: the bottom facet of each column, the first of
        # each row (every label is text drawn at every report); x tick labels likewise where
        # the facet below has the same ticks
        below = (table.rows[ri + 1], c) if ri + 1 < len(table.rows) else None
        ax.set_xlabel("" if below in facets else opts.xlabel)
        if below in facets and ticks[below] == ticks[(r, c)]:
            ax.tick_params(labelbottom=False)
        ax.set_ylabel(opts.ylabel if ci == 0 else "")
    # Only now, with every facet drawn: a row shares its y axis, and a limit set earlier would
    # freeze the row's range before the later facets' data were in it (lines ran off the top).
    for ax in axes.flat:
        ax.set_ylim(*opts.ylim)
    return finish(fig, table.title, look.handles)


def _table(data: pd.DataFrame, kind: Kind, opts: LineOptions) -> _Table:
    """`data` in x order with its facet and style labels; a facet key with one value in the
    figure goes into its title, not into every facet's (long facet titles ran into each
    other)."""
    d = data.sort_values(opts.x, kind="stable")  # a copy, in x order: every line's points in order
    row, col = kind.row, kind.col
    used = {opts.x, opts.hue, *row, *col}
    style_keys = [k for k in KEYS if k not in used and k in d]
    const = [k for k in (*row, *col) if k in d and d[k].nunique(dropna=False) == 1]
    d["_row"] = labels(d, [k for k in row if k not in const])
    d["_col"] = labels(d, [k for k in col if k not in const])
    title = kind.title
    if const:
        title += " — " + " · ".join(label(k, d[k].iloc[0]) for k in const)
    d["_style"] = labels(d, style_keys, only_varying=True)
    rows, cols = sorted(d["_row"].unique()), sorted(d["_col"].unique())
    if opts.col_order:
        cols = [c for c in opts.col_order if c in cols]
    return _Table(d, rows, cols, title, style_keys)


def _look(table: _Table, opts: LineOptions) -> _Look:
    """The colours, the variants' markers and dashes (in the order of their values: batch 64
    before batch 128, not of their labels) and the legend's rows."""
    d = table.d
    colours = palette(d[opts.hue], opts.hue)
    present = [k for k in table.style_keys if d[k].nunique(dropna=False) > 1]
    variants = list(d.sort_values(present, kind="stable")["_style"].drop_duplicates())
    styles = {
        v: (MARKERS[i % len(MARKERS)], DASHES[(i // len(MARKERS)) % len(DASHES)])
        for i, v in enumerate(variants)
    }
    if len(variants) == 1:
        styles = {variants[0]: ("o", "-")}
    handles = [header(hue_title(opts.hue))]
    handles += [
        Line2D([], [], color=colours[v], marker="o", label=label(opts.hue, v)) for v in colours
    ]
    if len(variants) > 1:
        handles.append(header("variant"))
        handles += [
            Line2D([], [], color="0.35", marker=styles[v][0], linestyle=styles[v][1], label=v)
            for v in variants
        ]
    return _Look(colours, styles, handles + list(opts.legend_extra))


def _points(d: pd.DataFrame, opts: LineOptions) -> _Points:
    """The columns the facets draw from, once for the figure."""
    ideal = opts.ideal is not None
    return _Points(
        x=d[opts.x].to_numpy(dtype=float),
        y=d[opts.y].to_numpy(dtype=float),
        err=d[opts.err].to_numpy(dtype=float) if opts.err else None,
        base=d[opts.ideal].to_numpy(dtype=float) if ideal else None,
        n=d["world_size"].to_numpy(dtype=float) if ideal else None,
        cells=d[list(dict.fromkeys([*(k for k in KEYS if k in d), opts.x, opts.y]))],
    )


def _facets(d: pd.DataFrame, hue: str) -> dict[tuple, dict[tuple, np.ndarray]]:
    """Row positions of each facet's lines, found once: {(row, col): {(hue value, style):
    positions in x order}}, the lines in the order of their hue and style."""
    facets: dict[tuple, dict[tuple, np.ndarray]] = {}
    for (r, c, hv, sv), at in sorted(
        d.groupby(["_row", "_col", hue, "_style"], sort=False).indices.items(),
        key=lambda kv: kv[0][2:],
    ):
        facets.setdefault((r, c), {})[(hv, sv)] = at
    return facets


def _draw_facet(
    ax: Axes, series: dict[tuple, np.ndarray], points: _Points, look: _Look, opts: LineOptions
) -> None:
    """A facet's lines as one LineCollection and its markers as one PathCollection, instead
    of a Line2D per line (about a millisecond each to create and draw; a 432-cell study draws
    thousands) or a scatter per marker shape (about as costly); its error bars as one
    collection, its ideal lines and its reference."""
    # the facet's hues side by side around the true x (multiplicative, so also even on log
    # axes), spread over the hues it draws, not over every hue of the figure
    here = [v for v in look.colours if any(hv == v for hv, _ in series)]
    dodge = {v: 1 + 0.025 * (i - (len(here) - 1) / 2) for i, v in enumerate(here)}
    segs, seg_colours, seg_dashes, ideal_segs, ideal_colours = [], [], [], [], []
    px, py, p_paths, p_colours = [], [], [], []  # every marker of the facet
    bars = []  # every error bar of the axes, drawn as one collection
    for (hv, sv), at in series.items():
        marker, dash = look.styles[sv]
        colour = look.colours[hv]
        xs, ys = points.x[at] * dodge[hv], points.y[at]
        for seg in _finite_runs(xs, ys):  # a gap where a value is missing, as Line2D
            segs.append(seg)
            seg_colours.append(colour)
            seg_dashes.append(dash)
        px.extend(xs)
        py.extend(ys)
        p_paths += [marker_path(marker)] * len(xs)
        p_colours += [colour] * len(xs)
        if points.err is not None:
            bars += _bars(xs, ys, points.err[at], colour)
        line = None if points.base is None else linear_from(points.base[at], points.n[at])
        if line is not None:
            ideal_segs.append(line)
            ideal_colours.append(colour)
    pts = np.column_stack([px, py])
    ax.update_datalim(pts[np.isfinite(pts).all(axis=1)])
    ax.add_collection(
        LineCollection(segs, colors=seg_colours, linestyles=seg_dashes, linewidths=1.3),
        autolim=False,
    )
    ax.add_collection(_markers(ax, p_paths, pts, p_colours), autolim=False)
    if ideal_segs:  # dotted, lighter: linear scaling from each line's baseline
        ax.add_collection(
            LineCollection(
                ideal_segs, colors=ideal_colours, linestyles=":", linewidths=1.0, alpha=0.7
            )
        )
    if bars:  # capless, as seaborn draws error bars
        bx, lo, hi, cs = zip(*bars, strict=True)
        ax.vlines(bx, lo, hi, colors=cs, linewidth=1.0)
    if opts.ref is not None:
        opts.ref(ax, points.cells.iloc[np.sort(np.concatenate(list(series.values())))])
    ax.autoscale_view()


def _bars(xs: np.ndarray, ys: np.ndarray, err: np.ndarray, colour) -> list[tuple]:
    """(x, low, high, colour) of each finite error bar of a line."""
    keep = np.isfinite(err)
    return [
        (xi, yi - ei, yi + ei, colour)
        for xi, yi, ei in zip(xs[keep], ys[keep], err[keep], strict=True)
    ]


def _markers(ax: Axes, paths: list[Path], pts: np.ndarray, colours: list) -> PathCollection:
    """A facet's markers, one path each, as scatter draws them."""
    return PathCollection(
        paths,
        sizes=[MARKER_SIZE**2],
        offsets=pts,
        offset_transform=ax.transData,
        transform=IdentityTransform(),  # marker paths in points, as scatter's
        facecolors=colours,
        edgecolors=colours,
        linewidths=1.0,
        zorder=2.1,  # above the lines
    )


def _x_ticks(xv: np.ndarray, positions) -> tuple[float, ...]:
    """The x values a facet's ticks stand at: every finite x of its lines, distinct and in
    order (computed once per facet: `xaxis` places them, and the facet above hides its tick
    labels where they are the same)."""
    x = xv[np.concatenate(list(positions))]
    return tuple(np.unique(x[np.isfinite(x)]).tolist())


def _finite_runs(xs: np.ndarray, ys: np.ndarray) -> list[np.ndarray]:
    """The (x, y) points of a line in runs of consecutive finite values."""
    ok = np.isfinite(xs) & np.isfinite(ys)
    if ok.all():
        return [np.column_stack([xs, ys])]
    cuts = np.flatnonzero(np.diff(ok.astype(np.int8))) + 1
    runs = np.split(np.column_stack([xs, ys]), cuts)
    return [r for r in runs if np.isfinite(r).all()]


def linear_from(base: np.ndarray, n: np.ndarray) -> np.ndarray | None:
    """Linear scaling from a line's N = 1 value X(1) (its first finite `base`): the points
    (N, X(1) · N) at N = 1 and every N of the line; None without a baseline."""
    finite = base[np.isfinite(base)]
    if not finite.size:
        return None
    ns = np.union1d([1.0], n[np.isfinite(n)])
    return np.column_stack([ns, finite[0] * ns])


def settings(d: pd.DataFrame, name: str, **extra: Any) -> LineOptions:
    """How figure `name` is drawn: its settings in figures.yaml, resolved against its table
    `d`, and `extra` (what YAML cannot say: reference lines, legend rows, a column order)."""
    s = dict(FIGURES[name]["lines"])
    if s.get("log2x") == "wide":
        s["log2x"] = d[s["x"]].max() / max(d[s["x"]].min(), 1) >= WIDE
    if "ylim" in s:
        s["ylim"] = tuple(s["ylim"])
    for key in ("legend_extra", "col_order"):
        if key in extra:
            extra[key] = tuple(extra[key])
    return LineOptions(**s, **extra)


def draw_lines(d: pd.DataFrame, kind: Kind, **extra: Any) -> Figure:
    """Figure `kind` as error-bar lines; `extra` adds what YAML cannot say (LineOptions' ref,
    ideal, legend_extra, col_order)."""
    return lines(d, kind, settings(d, kind.name, **extra))


def lines_figure(name: str, **where: Any) -> None:
    """Register figure `name` drawn by `draw_lines` alone; `where` is what `figure` takes (the
    table's function `data`, the facet keys `row` and `col`)."""
    figure(name, **where)(draw_lines)
