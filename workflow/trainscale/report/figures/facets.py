"""The facet engine: a grid of axes laid out in fixed inches, and the generic figure of
error-bar lines every line figure is drawn with.

Lines are cells that differ only in the x-axis value: the colour (hue) and the facet say which,
and every other matrix value that varies in the study is a line style ("variant") listed in the
legend, so no two cells are ever averaged together. Error bars are the cells' 95% confidence
intervals as scaling.csv gives them (docs/methods.md defines them): from steps
and repeats for throughput, over repeats (Student's t) for the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.markers import MarkerStyle
from matplotlib.path import Path
from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator
from matplotlib.transforms import IdentityTransform

from trainscale.plan.runspec import MATRIX_KEYS
from trainscale.report.figures.registry import Kind
from trainscale.report.figures.style import (
    DASHES,
    MARKERS,
    header,
    hue_title,
    label,
    labels,
    palette,
)

#: Cell keys as figures see them (world_size stands for workers: workers = N / nodes).
KEYS = [*(k for k in MATRIX_KEYS if k != "workers"), "world_size"]
#: Inches around the facets: left (y labels), top (titles), bottom (x labels), between rows.
LEFT, TOP, BOTTOM, HSPACE = 0.95, 0.62, 0.55, 0.75
#: At most this many y intervals per facet: readable on a 2.4-inch facet, and every tick is a
#: grid line, a tick mark and a label to draw.
Y_BINS = 5
#: Legend rows: text size (points) and the distance between rows (inches).
LEGEND_FONT, LEGEND_ROW = 8, 0.17
#: What matplotlib accepts for "no line" and "no marker".
_NONE = ("None", "none", "", " ", None)
#: Marker size of the lines' points, in points (matplotlib's markersize).
MARKER_SIZE = 4


def grid(
    rows: list[str],
    cols: list[str],
    *,
    sharey: str | bool = "row",
    w: float = 3.2,
    h: float = 2.4,
    side: float = 2.0,
    legend_rows: int = 0,
    wspace: float | None = None,
    left: float = LEFT,
) -> tuple[Figure, np.ndarray]:
    """A figure of len(rows) × len(cols) axes of w × h inches, laid out in fixed inches (no
    layout engine: it would cost more than the drawing), with `side` inches on the right for the
    legend or colour bar (`finish` places it)."""
    nr, nc = len(rows), len(cols)
    ws = wspace if wspace is not None else (0.3 if sharey else 0.8)
    grid_w, grid_h = nc * w + (nc - 1) * ws, nr * h + (nr - 1) * HSPACE
    width = left + grid_w + side
    height = max(TOP + grid_h + BOTTOM, TOP + 0.17 * legend_rows + 0.3)
    fig = Figure(figsize=(width, height))
    axes = fig.subplots(
        nr,
        nc,
        squeeze=False,
        sharey=sharey,
        gridspec_kw={
            "left": left / width,
            "right": (left + grid_w) / width,
            "top": 1 - TOP / height,
            "bottom": 1 - (TOP + grid_h) / height,
            "wspace": ws / w,
            "hspace": HSPACE / h,
        },
    )
    for ax in axes.flat:
        ax.yaxis.set_major_locator(MaxNLocator(Y_BINS))
    fig.ts_box = (width, height, left + grid_w, grid_h)  # for finish
    return fig, axes


def side_width(texts: Sequence[str]) -> float:
    """Inches a legend with these labels needs (8 pt text, handle and padding)."""
    return 0.75 + 0.062 * max((len(t) for t in texts), default=0)


def finish(fig: Figure, title: str, handles: Sequence[Line2D] = ()) -> Figure:
    """The legend to the right of the facets, and the title above them."""
    width, height, right, _ = fig.ts_box
    if handles:
        legend(fig, handles, right + 0.2, height - TOP)
    fig.suptitle(title, y=1 - 0.08 / height, va="top", fontsize=11)
    return fig


def legend(fig: Figure, handles: Sequence[Line2D], left: float, top: float) -> None:
    """`handles` as legend rows LEGEND_ROW inches apart, from (left, top) in inches down: a
    handle's line and marker, then its label; a handle without either (`header`) is a title,
    flush left. Drawn as one collection of line samples, one of markers and a text per row,
    not as matplotlib's Legend, whose boxes are measured and laid out at every draw (a tenth
    of a second per figure, more than all its lines)."""
    fs, inch = LEGEND_FONT, fig.dpi_scale_trans
    sample = 2.0 * fs / 72  # matplotlib's handlelength and handletextpad, in inches
    pad = 0.8 * fs / 72
    segs, seg_colours, seg_styles, seg_widths = [], [], [], []
    offsets, paths, marker_colours, marker_sizes = [], [], [], []
    for i, h in enumerate(handles):
        y = top - (i + 0.5) * LEGEND_ROW
        drawn = h.get_linestyle() not in _NONE
        marker = h.get_marker()
        has_marker = marker not in _NONE
        if drawn:
            segs.append([(left, y), (left + sample, y)])
            seg_colours.append(h.get_color())
            seg_styles.append(h.get_linestyle())
            seg_widths.append(h.get_linewidth())
        if has_marker:
            offsets.append((left + sample / 2, y))
            paths.append(_marker_path(marker))
            marker_colours.append(h.get_color())
            marker_sizes.append(h.get_markersize() ** 2)
        x = left + sample + pad if drawn or has_marker else left
        fig.text(x, y, h.get_label(), transform=inch, fontsize=fs, va="center", ha="left")
    if segs:
        fig.add_artist(
            LineCollection(
                segs,
                colors=seg_colours,
                linestyles=seg_styles,
                linewidths=seg_widths,
                transform=inch,
            )
        )
    if offsets:
        fig.add_artist(
            PathCollection(
                paths,
                sizes=marker_sizes,
                offsets=offsets,
                offset_transform=inch,
                transform=IdentityTransform(),
                facecolors=marker_colours,
                edgecolors=marker_colours,
                linewidths=1.0,
            )
        )


def xaxis(ax, vals: Sequence[float], log2: bool) -> None:
    """Ticks at exactly the x values measured, `vals` (`_x_ticks`: distinct, in order); log 2
    when asked and positive."""
    if log2 and len(vals) > 1 and min(vals) > 0:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(vals))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{v:g}" for v in vals])
    if len(vals) == 1:
        ax.set_xlim(vals[0] * 0.5, vals[0] * 1.5) if vals[0] else ax.set_xlim(-1, 1)


def lines(
    data: pd.DataFrame,
    kind: Kind,
    *,
    x: str,
    y: str,
    err: str | None,
    hue: str,
    xlabel: str,
    ylabel: str,
    log2x: bool = False,
    ideal: str | None = None,
    ref: Callable[[Axes, pd.DataFrame], None] | None = None,
    legend_extra: Sequence[Line2D] = (),
    ylim: tuple[float | None, float | None] = (0, None),
    col_order: Sequence[str] | None = None,
) -> Figure:
    """Facets (the kind's row × col keys) of error-bar lines: colour = `hue`, style = every
    other varying key, so each line is one sequence of cells along `x`.

    `ideal` names the column of each line's N = 1 value: a dotted line of linear scaling from
    it (`linear_from`). `ref(ax, cells)` draws a reference into each facet; `cells` are the
    facet's rows with the cell keys, x and y only (a slice of every column, once per facet
    and line, cost more than the drawing)."""
    d = data.sort_values(x, kind="stable")  # a copy, in x order: every line's points in order
    row, col = kind.row, kind.col
    used = {x, hue, *row, *col}
    style_keys = [k for k in KEYS if k not in used and k in d]
    # a facet key with one value in the figure goes into its title, not into every facet's
    # (long facet titles ran into each other)
    const = [k for k in (*row, *col) if k in d and d[k].nunique(dropna=False) == 1]
    d["_row"] = labels(d, [k for k in row if k not in const])
    d["_col"] = labels(d, [k for k in col if k not in const])
    title = kind.title
    if const:
        title += " — " + " · ".join(label(k, d[k].iloc[0]) for k in const)
    d["_style"] = labels(d, style_keys, only_varying=True)
    rows, cols = sorted(d["_row"].unique()), sorted(d["_col"].unique())
    if col_order:
        cols = [c for c in col_order if c in cols]
    colours = palette(d[hue], hue)
    # variants in the order of their values (batch 64 before batch 128), not of their labels
    present = [k for k in style_keys if d[k].nunique(dropna=False) > 1]
    variants = list(d.sort_values(present, kind="stable")["_style"].drop_duplicates())
    styles = {
        v: (MARKERS[i % len(MARKERS)], DASHES[(i // len(MARKERS)) % len(DASHES)])
        for i, v in enumerate(variants)
    }
    if len(variants) == 1:
        styles = {variants[0]: ("o", "-")}
    handles = [header(hue_title(hue))]
    handles += [Line2D([], [], color=colours[v], marker="o", label=label(hue, v)) for v in colours]
    if len(variants) > 1:
        handles.append(header("variant"))
        handles += [
            Line2D([], [], color="0.35", marker=styles[v][0], linestyle=styles[v][1], label=v)
            for v in variants
        ]
    handles += list(legend_extra)
    texts = [hd.get_label() for hd in handles]
    fig, axes = grid(rows, cols, side=side_width(texts), legend_rows=len(handles))
    # Row positions of each facet's lines, found once (a DataFrame per line cost more than
    # drawing it): {(row, col): {(hue value, style): positions in x order}}.
    d = d.reset_index(drop=True)
    xv, yv = d[x].to_numpy(dtype=float), d[y].to_numpy(dtype=float)
    ev = d[err].to_numpy(dtype=float) if err else None
    if ideal is not None:
        base, nv = d[ideal].to_numpy(dtype=float), d["world_size"].to_numpy(dtype=float)
    cells = d[list(dict.fromkeys([*(k for k in KEYS if k in d), x, y]))]
    facets: dict[tuple, dict[tuple, np.ndarray]] = {}
    for (r, c, hv, sv), at in sorted(
        d.groupby(["_row", "_col", hue, "_style"], sort=False).indices.items(),
        key=lambda kv: kv[0][2:],
    ):
        facets.setdefault((r, c), {})[(hv, sv)] = at
    ticks = {key: _x_ticks(xv, series.values()) for key, series in facets.items()}
    for (ri, r), (ci, c) in ((a, b) for a in enumerate(rows) for b in enumerate(cols)):
        ax = axes[ri, ci]
        series = facets.get((r, c), {})
        ax.set_title(" · ".join(p for p in (r, c) if p))
        if not series:
            ax.text(0.5, 0.5, "no cells", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            continue
        # The facet's lines as one LineCollection and its markers as one PathCollection,
        # instead of a Line2D per line (about a millisecond each to create and draw; a 432-cell
        # study draws thousands) or a scatter per marker shape (about as costly).
        # the facet's hues side by side around the true x (multiplicative, so also even on log
        # axes), spread over the hues it draws, not over every hue of the figure
        here = [v for v in colours if any(hv == v for hv, _ in series)]
        dodge = {v: 1 + 0.025 * (i - (len(here) - 1) / 2) for i, v in enumerate(here)}
        segs, seg_colours, seg_dashes, ideal_segs, ideal_colours = [], [], [], [], []
        px, py, p_paths, p_colours = [], [], [], []  # every marker of the facet
        bars = []  # every error bar of the axes, drawn as one collection
        for (hv, sv), at in series.items():
            marker, dash = styles[sv]
            xs = xv[at] * dodge[hv]
            ys = yv[at]
            for seg in _finite_runs(xs, ys):  # a gap where a value is missing, as Line2D
                segs.append(seg)
                seg_colours.append(colours[hv])
                seg_dashes.append(dash)
            px.extend(xs)
            py.extend(ys)
            p_paths += [_marker_path(marker)] * len(xs)
            p_colours += [colours[hv]] * len(xs)
            if ev is not None:
                e = ev[at]
                keep = np.isfinite(e)
                bars += [
                    (xi, yi - ei, yi + ei, colours[hv])
                    for xi, yi, ei in zip(xs[keep], ys[keep], e[keep], strict=True)
                ]
            if ideal is not None and (line := linear_from(base[at], nv[at])) is not None:
                ideal_segs.append(line)
                ideal_colours.append(colours[hv])
        pts = np.column_stack([px, py])
        ax.update_datalim(pts[np.isfinite(pts).all(axis=1)])
        ax.add_collection(
            LineCollection(segs, colors=seg_colours, linestyles=seg_dashes, linewidths=1.3),
            autolim=False,
        )
        ax.add_collection(
            PathCollection(
                p_paths,
                sizes=[MARKER_SIZE**2],
                offsets=pts,
                offset_transform=ax.transData,
                transform=IdentityTransform(),  # marker paths in points, as scatter's
                facecolors=p_colours,
                edgecolors=p_colours,
                linewidths=1.0,
                zorder=2.1,  # above the lines
            ),
            autolim=False,
        )
        if ideal_segs:  # dotted, lighter: linear scaling from each line's baseline
            ax.add_collection(
                LineCollection(
                    ideal_segs, colors=ideal_colours, linestyles=":", linewidths=1.0, alpha=0.7
                )
            )
        if bars:  # capless, as seaborn draws error bars
            bx, lo, hi, cs = zip(*bars, strict=True)
            ax.vlines(bx, lo, hi, colors=cs, linewidth=1.0)
        facet = np.sort(np.concatenate(list(series.values())))
        if ref is not None:
            ref(ax, cells.iloc[facet])
        ax.autoscale_view()
        xaxis(ax, ticks[(r, c)], log2x)
        # axis labels once per row and column: the bottom facet of each column, the first of
        # each row (every label is text drawn at every report); x tick labels likewise where
        # the facet below has the same ticks
        below = ri + 1 < len(rows) and (rows[ri + 1], c) in facets
        ax.set_xlabel("" if below else xlabel)
        if below and ticks[(rows[ri + 1], c)] == ticks[(r, c)]:
            ax.tick_params(labelbottom=False)
        ax.set_ylabel(ylabel if ci == 0 else "")
    # Only now, with every facet drawn: a row shares its y axis, and a limit set earlier would
    # freeze the row's range before the later facets' data were in it (lines ran off the top).
    for ax in axes.flat:
        ax.set_ylim(*ylim)
    return finish(fig, title, handles)


def _x_ticks(xv: np.ndarray, positions) -> tuple[float, ...]:
    """The x values a facet's ticks stand at: every finite x of its lines, distinct and in
    order (computed once per facet: `xaxis` places them, and the facet above hides its tick
    labels where they are the same)."""
    x = xv[np.concatenate(list(positions))]
    return tuple(np.unique(x[np.isfinite(x)]).tolist())


@functools.cache
def _marker_path(marker: str) -> Path:
    """The path of a marker shape, as scatter draws it (one point wide, centred on 0)."""
    style = MarkerStyle(marker)
    return style.get_path().transformed(style.get_transform())


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


def reference_handle(label_text: str, linestyle: str = ":") -> Line2D:
    """A legend row for a grey reference line (ideal scaling, 100 %)."""
    colour, width = ("0.35", 1.0) if linestyle == ":" else ("0.2", 0.9)
    return Line2D([], [], color=colour, linestyle=linestyle, linewidth=width, label=label_text)
