"""The facet engine: a grid of axes laid out in fixed inches, its legend, title and x axis.
The generic figure of error-bar lines drawn in it is `trainscale.report.figures.lined.lines`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.markers import MarkerStyle
from matplotlib.path import Path
from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator
from matplotlib.transforms import IdentityTransform

from trainscale.plan.runspec import MATRIX_KEYS

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
            paths.append(marker_path(marker))
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


@functools.cache
def marker_path(marker: str) -> Path:
    """The path of a marker shape, as scatter draws it (one point wide, centred on 0)."""
    style = MarkerStyle(marker)
    return style.get_path().transformed(style.get_transform())


def reference_handle(label_text: str, linestyle: str = ":") -> Line2D:
    """A legend row for a grey reference line (ideal scaling, 100 %)."""
    colour, width = ("0.35", 1.0) if linestyle == ":" else ("0.2", 0.9)
    return Line2D([], [], color=colour, linestyle=linestyle, linewidth=width, label=label_text)
