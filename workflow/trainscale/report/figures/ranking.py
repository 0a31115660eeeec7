"""The report's first figure, "Strategies ranked by throughput": which strategy is fastest for
each model, dataset and N, and by how much, at a glance.

One panel per (model, dataset, N), wrapped two to a row: a horizontal dot plot of the cells
(`trainscale.analysis.ranking`) sorted by geometric mean throughput, fastest on top, with 95% CI
bars (from steps and repeats; over repeats only where the records lack step times, and marked)
and the fastest's CI as a grey band. The marks follow the comparison with the best (every cell
of the panel at once), not the bars' overlap: "could be the fastest" or "slower", and under the
panel what it resolves. MFU is a second, hollow dot per cell on the top axis. Rows are a fixed
height, so 12 strategies stay as legible as 3; a panel shows its ROWS best cells and every cell
that could be the best, and counts the others in a last row (scaling.csv lists them). Under
config `report.rank_by: cost` the dots are each cell's cost per million tokens or samples, the
cheapest on top, and the marks say how much dearer each cell is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import EngFormatter, FuncFormatter, MaxNLocator
from matplotlib.transforms import blended_transform_factory

from trainscale.analysis.aggregate import Study, human
from trainscale.analysis.flags import LOGICAL, cell_flags
from trainscale.analysis.interval import NO_INTERVAL, REPEATS
from trainscale.analysis.settle import pct, resolves
from trainscale.report.figures.registry import Kind, figure
from trainscale.report.figures.style import label, labels, palette

#: Inches: a cell's row, the plot's width, and the space around a panel.
ROW_H, PLOT_W = 0.26, 3.3
TITLE_H, XLABEL_H, MFU_H, GAP_W = 0.3, 0.66, 0.42, 0.35
#: Inches: the line under a panel's axis with the tags all its rows share.
SHARED_H = 0.14
#: Panels side by side at most: two 7-inch panels fill the report's width.
WRAP = 2
#: Characters of marks on one line at most (longer ones wrap).
MARKS_LINE = 30
#: Tick values on an axis at most: 5 stay apart at 3.3 inches, in engineering notation.
TICKS = 5
#: The figure's title under config `report.rank_by: cost` (figures.yaml has throughput's).
RANKED_BY_COST = "Strategies ranked by cost per million tokens or samples"
#: Rows a panel shows at most, besides every cell that could be the best (the rest are counted
#: in one row): a glance, and at 10,000 runs (432 cells, 27 a panel) the rows' text was most
#: of the report's drawing time.
ROWS = 16
#: Cell keys that may tell two rows of one strategy apart (the rest are the panel's).
CONFIG = ["batch_size", "batch_mode", "scale", "precision", "nodes", "seq_len",
          "activation_checkpointing", "offload"]  # fmt: skip
#: The ranking's columns the figure reads (itertuples over all of scaling.csv's, and copies
#: of them, were a fifth of the figure's time at 432 cells).
DRAWN = {"model", "dataset", "world_size", "strategy", *CONFIG, "value", "value_ci95",
         "value_unit", "ranked_by", "fastest", "could_be_fastest", "slower", "behind",
         "mcb_high", "equivalent", "equivalence", "interval_method", "mark", "logical",
         "oversubscribed", "mfu_mean", "mfu_ci95", "mdd_rel", "repeats_for_5pct"}  # fmt: skip


def _ranking(study: Study) -> pd.DataFrame | str:
    r = study.ranking
    if not len(study.scaling) or not (study.scaling["ok"] > 0).any():
        return "the study has no ok run"
    if not len(r):
        return "no ok run recorded a throughput"
    if not r["value"].notna().any():  # report.rank_by: cost, and no cell priced
        return "report.rank_by is cost, and no price of config cost.device_hour applies"
    return r


def marks(r, could: int = 1, shared: Sequence[str] = ()) -> str:
    """The words beside a row: its place against the best (of `could` cells that could be
    it), the comparison with the best's verdict, and the tags the tables give it but those in
    `shared` (said once under the panel)."""
    return " · ".join([*_verdict(r, could), *(t for t in tags(r) if t not in shared)])


def _verdict(r, could: int) -> list[str]:
    best = "cheapest" if r.ranked_by == "cost" else "fastest"
    if r.logical:
        return [f"{LOGICAL.label}, not ranked"]
    if r.fastest:
        return [best if could < 2 else f"{best} · 1 of {could} that could be"]
    if pd.isna(r.value):
        return ["no price"]
    sign = "+" if r.ranked_by == "cost" else "−"
    words = [f"{sign}{human(100 * r.behind, digits=2)} %"]
    if r.slower:
        words.append("dearer" if r.ranked_by == "cost" else "slower")
    elif pd.isna(r.mcb_high):
        words.append(NO_INTERVAL if r.interval_method == NO_INTERVAL else "no interval")
    else:
        words.append(f"could be the {best}")
    if r.equivalent:
        words.append(f"equivalent (±{pct(r.equivalence)})")
    return words


def tags(r) -> list[str]:
    """A row's tags after its verdict: how its interval was made where not from steps, the
    catalog's mark of its strategy, and its flags."""
    words = ["CI: repeats only"] if getattr(r, "interval_method", "") == REPEATS else []
    if r.mark:
        words.append(r.mark)
    return words + [f.label for f in cell_flags(r) if f is not LOGICAL]


def _panel(sub: pd.DataFrame) -> tuple[pd.DataFrame, int, list[str]]:
    """A panel's rows to draw, best first (as `trainscale.analysis.ranking` orders them), with
    their label and marks; how many rows below them are left out (ROWS); and the tags every
    drawn row has, said once under the panel instead of on each row."""
    could = int(sub["could_be_fastest"].sum())
    keep = (np.arange(len(sub)) < ROWS) | sub["could_be_fastest"].to_numpy(bool)
    keep |= sub["fastest"].to_numpy(bool)
    sub = sub[keep].copy()
    # what tells a strategy's cells apart, named only where it has several (batch 64, 256)
    config = labels(sub, [k for k in CONFIG if k in sub], only_varying=True)
    several = sub["strategy"].duplicated(keep=False)
    sub["_label"] = sub["strategy"] + config.where(several, "").map(
        lambda s: f" · {s}" if s else ""
    )
    rows = list(sub.itertuples(index=False))
    every = [tags(r) for r in rows]
    shared = [t for t in every[0] if all(t in e for e in every[1:])] if len(rows) > 1 else []
    sub["_marks"] = [_wrap(marks(r, could, shared)) for r in rows]
    return sub, int((~keep).sum()), shared


def _wrap(text: str) -> str:
    """Marks longer than MARKS_LINE characters on two lines, split between words, so a flagged
    cell does not widen every panel."""
    if len(text) <= MARKS_LINE or " · " not in text:
        return text
    parts = text.split(" · ")
    for i in range(len(parts) - 1, 0, -1):
        first = " · ".join(parts[:i])
        if len(first) <= MARKS_LINE:
            return f"{first} ·\n{' · '.join(parts[i:])}"
    return f"{parts[0]} ·\n{' · '.join(parts[1:])}"


@figure("ranking", data=_ranking, row=("model", "dataset"), col=("world_size",))
def draw_ranking(d: pd.DataFrame, kind: Kind) -> Figure:
    keys = ["model", "dataset", "world_size"]
    d = d[[c for c in d.columns if c in DRAWN]]  # the ranking carries scaling.csv's columns too
    panels = [(k, *_panel(g)) for k, g in d.groupby(keys, sort=True)]
    colours = palette(d["strategy"], "strategy")
    mfu = bool(d["mfu_mean"].notna().any())
    longest_label = max(p["_label"].str.len().max() for _, p, _, _ in panels)
    longest_marks = max(
        len(line) for _, p, _, _ in panels for m in p["_marks"] for line in m.split("\n")
    )
    label_w = 0.3 + 0.066 * longest_label  # the fastest's label is bold: wider
    marks_w = 0.25 + 0.056 * longest_marks
    panel_w = label_w + PLOT_W + marks_w
    ncols = min(WRAP, len(panels))
    nrows = -(-len(panels) // ncols)
    n_max = max(len(p) + int(hidden > 0) for _, p, hidden, _ in panels)
    plot_h = ROW_H * (n_max + 0.6)
    top_h = TITLE_H + (MFU_H if mfu else 0.0)
    cell_h = top_h + plot_h + XLABEL_H + (SHARED_H if any(sh for *_, sh in panels) else 0.0)
    head = 0.5  # the figure's title and its legend
    width = ncols * panel_w + (ncols - 1) * GAP_W + 0.2
    height = head + nrows * cell_h
    fig = Figure(figsize=(width, height))
    for i, (key, p, hidden, shared) in enumerate(panels):
        r, c = divmod(i, ncols)
        left = 0.1 + c * (panel_w + GAP_W) + label_w
        bottom = height - head - r * cell_h - top_h - plot_h
        ax = fig.add_axes((left / width, bottom / height, PLOT_W / width, plot_h / height))
        _draw_panel(ax, p, colours, mfu, shared)
        if hidden:
            _left_out(ax, len(p), hidden)
        model, dataset, n = key
        pad = 22 if mfu else 6
        ax.set_title(f"{model} · {dataset} · {label('world_size', n)}", pad=pad, fontsize=9.5)
    title = RANKED_BY_COST if d["ranked_by"].iloc[0] == "cost" else kind.title
    fig.suptitle(title, x=0.1 / width, ha="left", y=1 - 0.08 / height, va="top", fontsize=11)
    _legend(fig, d, mfu, width, height)
    return fig


def _legend(fig: Figure, d: pd.DataFrame, mfu: bool, width: float, height: float) -> None:
    """The legend under the title, on one row: the dots and bars, the best's band, MFU's
    diamonds and logical devices' hollow dots where the figure has them."""
    what, best = ("geometric mean throughput", "fastest")
    if d["ranked_by"].iloc[0] == "cost":
        what, best = "cost per million", "cheapest"
    handles = [
        Line2D(
            [],
            [],
            color="0.3",
            marker="o",
            linestyle="-",
            label=f"{what}, 95% CI (steps and repeats)",
        ),  # fmt: skip
        Patch(facecolor="0.88", edgecolor="none", label=f"the {best}'s 95% CI"),
    ]
    if mfu:
        handles.append(_dot("D", "none", "MFU (top axis)"))
    if d["logical"].any():
        handles.append(_dot("o", "white", f"{LOGICAL.label} (not ranked)"))
    fig.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(0.1 / width, 1 - 0.32 / height),
        ncol=len(handles),
        frameon=False,
        fontsize=8,
        handlelength=1.6,
        columnspacing=1.6,
        borderaxespad=0,
    )


def _left_out(ax, row: int, hidden: int) -> None:
    """Row `row` of the panel: how many of its cells are not drawn, and where they are."""
    ax.set_ylim(row + 0.6, -0.6)
    ax.text(
        0.01,
        row,
        f"… {hidden} more cell{'s' if hidden > 1 else ''} ranked below these (scaling.csv)",
        transform=blended_transform_factory(ax.transAxes, ax.transData),
        ha="left",
        va="center",
        fontsize=7.5,
        color="0.35",
        fontstyle="italic",
    )


def _dot(marker: str, face: str, text: str) -> Line2D:
    return Line2D(
        [], [], color="0.3", marker=marker, markerfacecolor=face, linestyle="none", label=text
    )


def _draw_panel(ax, p: pd.DataFrame, colours: dict, mfu: bool, shared: list[str]) -> None:
    """One panel: dots with CI bars, the fastest's band, labels on the left, marks on the right,
    the tags every row shares under the axis, and MFU on a twin top axis."""
    y = np.arange(len(p))
    x, ci = p["value"].to_numpy(float), p["value_ci95"].to_numpy(float)
    ci = np.where(np.isfinite(ci), ci, 0.0)
    cols = np.array([colours[s] for s in p["strategy"]])
    top = p[p["fastest"]]
    if len(top) and np.isfinite(top["value_ci95"].iloc[0]):  # the band a tie would reach
        f = top.iloc[0]
        ax.axvspan(f.value - f.value_ci95, f.value + f.value_ci95, color="0.88", lw=0)
    ax.hlines(y, x - ci, x + ci, colors=cols, linewidth=1.6, zorder=2)
    logical = p["logical"].to_numpy(bool)
    ax.scatter(x, y, s=34, c=cols, edgecolors=cols, linewidths=1.2, zorder=3)
    if logical.any():
        ax.scatter(
            x[logical],
            y[logical],
            s=34,
            facecolors="white",
            edgecolors=cols[logical],
            linewidths=1.2,
            zorder=3.1,
        )
    ax.set_ylim(len(p) - 0.4, -0.6)
    ax.set_yticks(y, list(p["_label"]))
    for tick, fastest in zip(ax.get_yticklabels(), p["fastest"], strict=True):
        if fastest:
            tick.set_fontweight("bold")
    ax.set_xlim(0, float(np.nanmax(x + ci)) * 1.06 or 1.0)
    by_cost = p["ranked_by"].iloc[0] == "cost"
    unit = p["value_unit"].iloc[0] + ("" if by_cost else " (steady, all workers)")
    told = resolves(p["mdd_rel"].iloc[0], p["repeats_for_5pct"].iloc[0])
    lines = [unit, told.replace("this study", "this panel")]
    if shared:
        lines.append(f"every cell shown: {' · '.join(shared)}")
    ax.set_xlabel("\n".join(lines), fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(TICKS))
    # money in plain digits: engineering notation's "m" (milli) reads as million beside a price
    ax.xaxis.set_major_formatter(
        FuncFormatter(lambda v, _: human(v)) if by_cost else EngFormatter(sep=" ")
    )
    ax.grid(axis="y", visible=False)
    beside = blended_transform_factory(ax.transAxes, ax.transData)
    for yi, text, fastest in zip(y, p["_marks"], p["fastest"], strict=True):
        ax.text(
            1.02,
            yi,
            text,
            transform=beside,
            ha="left",
            va="center",
            fontsize=8 if "\n" not in text else 7.2,
            linespacing=1.0,
            color="0.15" if fastest else "0.35",
            fontweight="bold" if fastest else "normal",
        )
    if not mfu:
        return
    m = 100 * p["mfu_mean"].to_numpy(float)
    mci = 100 * p["mfu_ci95"].to_numpy(float)
    mci = np.where(np.isfinite(mci), mci, 0.0)
    twin = ax.twiny()
    twin.grid(False)
    have = np.isfinite(m)
    ym = y + 0.3
    twin.hlines(
        ym[have],
        (m - mci)[have],
        (m + mci)[have],
        colors=cols[have],
        linewidth=0.8,
        alpha=0.8,
    )
    twin.scatter(
        m[have],
        ym[have],
        s=18,
        marker="D",
        facecolors="none",
        edgecolors=cols[have],
        linewidths=1.0,
        zorder=3,
    )
    twin.set_xlim(0, float(np.nanmax(m + mci)) * 1.1 if have.any() else 1.0)
    twin.set_xlabel("MFU % (model FLOPs / peak)", fontsize=8, labelpad=2)
    twin.tick_params(axis="x", labelsize=7.5, pad=1)
    twin.xaxis.set_major_locator(MaxNLocator(TICKS))
    ax.set_ylim(len(p) - 0.4, -0.6)
