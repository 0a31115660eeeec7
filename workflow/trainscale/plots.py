"""A study's figures, drawn with seaborn on matplotlib (Figure objects, no pyplot state).

Every figure is drawn from the study's tables (`trainscale.aggregate.Study`: scaling.csv, one
row per cell, and the per-epoch convergence table), never from raw files, so a figure shows
exactly what the tables say. Error bars are 95% confidence intervals over repeats (Student's t,
defined in `trainscale.aggregate`). Lines are cells that differ only in the x-axis value: the
colour (hue) and the facet say which, and every other matrix value that varies in the study is
a line style ("variant") listed in the legend, so no two cells are ever averaged together.

Each kind has `_data_<name>(study)` (the table it plots, or a sentence saying why the study
has nothing to plot) and `_draw_<name>(table)`. A figure without data is still written, as a
small image that says "no data in this study for <figure>: <why>", never as an empty plot.
The kinds, their titles and categories are listed in reports/figures.yaml.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
import seaborn as sns
import yaml
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator
from seaborn.utils import relative_luminance

from trainscale import aggregate
from trainscale.aggregate import Study
from trainscale.matrix import FRAMEWORK

REPORTS = Path(__file__).resolve().parents[2] / "reports"
#: name -> {title, category}; the single list of figure kinds (also read by report.smk).
FIGURES: dict[str, dict] = yaml.safe_load((REPORTS / "figures.yaml").read_text())

#: Cell keys as figures see them (world_size stands for workers: workers = N / nodes).
KEYS = [
    "strategy",
    "model",
    "dataset",
    "scale",
    "batch_size",
    "batch_mode",
    "nodes",
    "precision",
    "world_size",
]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p"]
DASHES = ["-", "--", "-.", ":"]
PNG_DPI = 110
#: zlib level of the PNG files: 1 is several times faster than matplotlib's default 6 and the
#: files (embedded in report.html) only about a tenth larger.
PNG_COMPRESS = 1
#: At most this many y intervals per facet: readable on a 2.4-inch facet, and every tick is a
#: grid line, a tick mark and a label drawn twice (SVG and PNG).
Y_BINS = 5


def _theme() -> dict:
    rc = {**sns.axes_style("whitegrid"), **sns.plotting_context("paper")}
    rc.update(
        {
            "svg.fonttype": "none",
            # A fixed title position: with the default (None) matplotlib measures every axes'
            # tick labels on each draw to lift titles over them; ours have none above the axes,
            # and the measuring was a fifth of the drawing time.
            "axes.titley": 1.0,
            "axes.titlepad": 4.0,
            "svg.hashsalt": "trainscale",
            "axes.titlesize": 9,
            "legend.fontsize": 8,
            "legend.title_fontsize": 8,
        }
    )
    return rc


# --------------------------------------------------------------------------------------------
# labels and palettes


def _label(key: str, value) -> str:
    if key == "world_size":
        return f"N={value}"
    if key == "scale":
        return f"scale {value}"
    if key == "batch_size":
        return f"batch {value}"
    if key == "batch_mode":
        return "per-worker batch" if value == "per_worker" else "global batch"
    if key == "nodes":
        return f"{value} node" + ("s" if value != 1 else "")
    return str(value)


def _labels(df: pd.DataFrame, keys: Sequence[str], only_varying: bool = False) -> pd.Series:
    """One label per row from `keys` (only those that vary in `df` if `only_varying`)."""
    keys = [k for k in keys if not only_varying or df[k].nunique(dropna=False) > 1]
    if not keys:
        return pd.Series("", index=df.index)
    parts = [df[k].map(lambda v, k=k: _label(k, v)) for k in keys]
    out = parts[0]
    for p in parts[1:]:
        out = out + " · " + p
    return out


#: One colour per strategy, the same in every figure and study (trainscale.matrix order).
STRATEGY_COLOURS = dict(
    zip(
        FRAMEWORK,
        sns.color_palette("colorblind", 10) + sns.color_palette("dark", 10)[4:],
        strict=False,
    )
)


def _palette(values: pd.Series, key: str) -> dict:
    levels = sorted(values.dropna().unique())
    if key == "strategy":
        spare = iter(sns.color_palette("muted", max(len(levels), 1)))
        return {v: STRATEGY_COLOURS.get(v) or next(spare) for v in levels}
    return dict(zip(levels, sns.color_palette("viridis", max(len(levels), 1)), strict=False))


def _header(text: str) -> Line2D:
    return Line2D([], [], linestyle="none", marker="none", label=text)


# --------------------------------------------------------------------------------------------
# the generic facet of lines


#: Inches around the facets: left (y labels), top (titles), bottom (x labels), between rows.
LEFT, TOP, BOTTOM, HSPACE = 0.95, 0.62, 0.55, 0.75


def _grid(
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
    legend or colour bar (`_finish` places it)."""
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
    fig.ts_box = (width, height, left + grid_w, grid_h)  # for _finish
    return fig, axes


def _side_width(labels: Sequence[str]) -> float:
    """Inches a legend with these labels needs (8 pt text, handle and padding)."""
    return 0.75 + 0.062 * max((len(t) for t in labels), default=0)


def _finish(fig: Figure, title: str, handles: Sequence[Line2D] = ()) -> Figure:
    width, height, right, _ = fig.ts_box
    if handles:
        fig.legend(
            handles=list(handles),
            loc="upper left",
            bbox_to_anchor=((right + 0.2) / width, 1 - TOP / height),
            frameon=False,
            borderaxespad=0,
        )
    fig.suptitle(title, y=1 - 0.08 / height, va="top", fontsize=11)
    return fig


def _xaxis(ax, values: Sequence, log2: bool) -> None:
    vals = sorted({float(v) for v in values if pd.notna(v)})
    if log2 and len(vals) > 1 and min(vals) > 0:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(vals))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{v:g}" for v in vals])
    if len(vals) == 1:
        ax.set_xlim(vals[0] * 0.5, vals[0] * 1.5) if vals[0] else ax.set_xlim(-1, 1)


def _lines(
    data: pd.DataFrame,
    *,
    x: str,
    y: str,
    err: str | None,
    row: Sequence[str],
    col: Sequence[str],
    hue: str,
    title: str,
    xlabel: str,
    ylabel: str,
    log2x: bool = False,
    ideal: Callable | None = None,
    ref: Callable | None = None,
    legend_extra: Sequence[Line2D] = (),
    ylim: tuple[float | None, float | None] = (0, None),
    col_order: Sequence[str] | None = None,
) -> Figure:
    """Facets (row × col keys) of error-bar lines: colour = `hue`, style = every other varying
    key, so each line is one sequence of cells along `x`."""
    d = data.copy()
    used = {x, hue, *row, *col}
    style_keys = [k for k in KEYS if k not in used and k in d]
    d["_row"] = _labels(d, row)
    d["_col"] = _labels(d, col)
    d["_style"] = _labels(d, style_keys, only_varying=True)
    rows, cols = sorted(d["_row"].unique()), sorted(d["_col"].unique())
    if col_order:
        cols = [c for c in col_order if c in cols]
    palette = _palette(d[hue], hue)
    # hues side by side around the true x (multiplicative, so also even on log axes)
    dodge = {v: 1 + 0.025 * (i - (len(palette) - 1) / 2) for i, v in enumerate(palette)}
    # variants in the order of their values (batch 64 before batch 128), not of their labels
    present = [k for k in style_keys if d[k].nunique(dropna=False) > 1]
    variants = list(d.sort_values(present, kind="stable")["_style"].drop_duplicates())
    styles = {
        v: (MARKERS[i % len(MARKERS)], DASHES[(i // len(MARKERS)) % len(DASHES)])
        for i, v in enumerate(variants)
    }
    if len(variants) == 1:
        styles = {variants[0]: ("o", "-")}
    handles = [_header(_hue_title(hue))]
    handles += [Line2D([], [], color=palette[v], marker="o", label=_label(hue, v)) for v in palette]
    if len(variants) > 1:
        handles.append(_header("variant"))
        handles += [
            Line2D([], [], color="0.35", marker=styles[v][0], linestyle=styles[v][1], label=v)
            for v in variants
        ]
    handles += list(legend_extra)
    labels = [hd.get_label() for hd in handles]
    fig, axes = _grid(rows, cols, side=_side_width(labels), legend_rows=len(handles))
    for (ri, r), (ci, c) in ((a, b) for a in enumerate(rows) for b in enumerate(cols)):
        ax = axes[ri, ci]
        sub = d[(d["_row"] == r) & (d["_col"] == c)]
        ax.set_title(" · ".join(p for p in (r, c) if p))
        if sub.empty:
            ax.text(0.5, 0.5, "no cells", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            continue
        bars = []  # every error bar of the axes, drawn as one collection (fast)
        for (hv, sv), s in sub.groupby([hue, "_style"], sort=True):
            s = s.sort_values(x)
            marker, dash = styles[sv]
            xs = s[x].to_numpy(dtype=float) * dodge[hv]
            ys = s[y].to_numpy(dtype=float)
            ax.plot(
                xs,
                ys,
                color=palette[hv],
                marker=marker,
                linestyle=dash,
                markersize=4,
                linewidth=1.3,
            )
            if err:
                e = s[err].to_numpy(dtype=float)
                keep = np.isfinite(e)
                bars += [
                    (xi, yi - ei, yi + ei, palette[hv])
                    for xi, yi, ei in zip(xs[keep], ys[keep], e[keep], strict=True)
                ]
            if ideal is not None:
                ideal(ax, s, palette[hv])
        if bars:  # capless, as seaborn draws error bars
            bx, lo, hi, colours = zip(*bars, strict=True)
            ax.vlines(bx, lo, hi, colors=colours, linewidth=1.0)
        if ref is not None:
            ref(ax, sub)
        _xaxis(ax, sub[x], log2x)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel if ci == 0 else "")
    # Only now, with every facet drawn: a row shares its y axis, and a limit set earlier would
    # freeze the row's range before the later facets' data were in it (lines ran off the top).
    for ax in axes.flat:
        ax.set_ylim(*ylim)
    return _finish(fig, title, handles)


def _hue_title(key: str) -> str:
    return {"world_size": "workers N", "scale": "dataset scale"}.get(key, key.replace("_", " "))


def _ideal_linear(ax, s: pd.DataFrame, colour) -> None:
    """Linear scaling from the series' N = 1 baseline: X(1) · N."""
    base = s["baseline_throughput"].dropna()
    if base.empty:
        return
    n = np.array(sorted({1.0, *s["world_size"].astype(float)}))
    ax.plot(n, base.iloc[0] * n, color=colour, linestyle=":", linewidth=1.0, alpha=0.7)


def _ideal_handle(label: str) -> Line2D:
    return Line2D([], [], color="0.35", linestyle=":", linewidth=1.0, label=label)


# --------------------------------------------------------------------------------------------
# figure kinds: data (or why none) and drawing


def _ok(study: Study, col: str) -> pd.DataFrame | str:
    s = study.scaling
    if not len(s) or not (s["ok"] > 0).any():
        return "the study has no ok run"
    d = s[s[col].notna()] if col in s else s.iloc[0:0]
    if d.empty:
        return f"no ok run recorded {col.removesuffix('_mean').replace('_', ' ')}"
    return d


def _data_throughput(study: Study) -> pd.DataFrame | str:
    return _ok(study, "throughput_mean")


def _draw_throughput(d: pd.DataFrame) -> Figure:
    return _lines(
        d,
        x="world_size",
        y="throughput_mean",
        err="throughput_ci95",
        row=["model"],
        col=["dataset"],
        hue="strategy",
        title=FIGURES["throughput"]["title"],
        xlabel="workers N (world size)",
        ylabel="samples/s (steady, all workers)",
        ideal=_ideal_linear,
        legend_extra=[_ideal_handle("ideal: N · X(1)")],
    )


def _scaled(study: Study) -> pd.DataFrame | str:
    d = _ok(study, "throughput_mean")
    if isinstance(d, str):
        return d
    if not (d["world_size"] > 1).any():
        return "every ok cell has N = 1; speedup and efficiency need runs on more workers"
    multi = d[d["world_size"] > 1]
    if multi["speedup"].isna().all():
        return (
            "no N > 1 cell has an N = 1 baseline of the same strategy and configuration ("
            + multi["baseline_note"].iloc[0]
            + ")"
        )
    return d[d["speedup"].notna()]


_data_speedup = _scaled
_data_efficiency = _scaled


def _draw_speedup(d: pd.DataFrame) -> Figure:
    def ref(ax, sub):
        n = np.array(sorted({1.0, *sub["world_size"].astype(float)}))
        ax.plot(n, n, color="0.2", linestyle="--", linewidth=0.9)

    return _lines(
        d,
        x="world_size",
        y="speedup",
        err=None,
        row=["model"],
        col=["dataset"],
        hue="strategy",
        title=FIGURES["speedup"]["title"],
        xlabel="workers N (world size)",
        ylabel="speedup X(N) / X(1)",
        ref=ref,
        legend_extra=[
            Line2D([], [], color="0.2", linestyle="--", linewidth=0.9, label="ideal: S(N) = N")
        ],
    )


def _draw_efficiency(d: pd.DataFrame) -> Figure:
    d = d.assign(efficiency_pct=100 * d["efficiency"])

    def ref(ax, sub):
        ax.axhline(100, color="0.2", linestyle="--", linewidth=0.9)

    return _lines(
        d,
        x="world_size",
        y="efficiency_pct",
        err=None,
        row=["model"],
        col=["dataset"],
        hue="strategy",
        title=FIGURES["efficiency"]["title"],
        xlabel="workers N (world size)",
        ylabel="efficiency %",
        ref=ref,
        legend_extra=[
            Line2D([], [], color="0.2", linestyle="--", linewidth=0.9, label="ideal: 100 %")
        ],
    )


def _data_efficiency_heatmap(study: Study) -> pd.DataFrame | str:
    d = _scaled(study)
    if isinstance(d, str):
        return d
    d = d[(d["world_size"] > 1) & d["efficiency"].notna()]
    return d if len(d) else "no N > 1 cell has an efficiency"


def _draw_efficiency_heatmap(d: pd.DataFrame) -> Figure:
    d = d.copy()
    # the row label is the y label of the first column, one short line per part
    d["_row"] = _labels(d, ["model", "dataset"]) + _labels(
        d, ["scale", "precision", "nodes"], only_varying=True
    ).map(lambda s: f"\n{s}" if s else "")
    mode = d["batch_mode"].nunique() > 1
    d["_batch"] = d["batch_size"].astype(str) + (
        " " + d["batch_mode"].str.replace("per_worker", "per-worker") if mode else ""
    )
    d["_order"] = d["batch_size"]
    d["efficiency_pct"] = 100 * d["efficiency"]
    rows, cols = sorted(d["_row"].unique()), sorted(d["strategy"].unique())
    nb, nn = d["_batch"].nunique(), d["world_size"].nunique()
    ticks = 0.065 * d["_batch"].str.len().max() + 0.15  # inches of the batch labels
    fig, axes = _grid(
        rows,
        cols,
        sharey=False,
        w=max(2.0, 0.5 * nn + 0.6),
        h=max(1.8, 0.3 * nb + 0.6),
        side=1.1,
        wspace=ticks + 0.15,
        left=ticks + 0.25 + 0.18 * (d["_row"].str.count("\n").max() + 2),
    )
    vmax = max(100.0, float(d["efficiency_pct"].max()))
    cmap = sns.color_palette("mako", as_cmap=True)
    norm = mpl.colors.Normalize(0, vmax)
    for (ri, r), (ci, c) in ((a, b) for a in enumerate(rows) for b in enumerate(cols)):
        ax = axes[ri, ci]
        sub = d[(d["_row"] == r) & (d["strategy"] == c)]
        ax.set_title(c)
        if sub.empty:
            ax.axis("off")
            ax.text(0.5, 0.5, "no N > 1 cells", ha="center", va="center", transform=ax.transAxes)
            continue
        order = sub.sort_values(["_order", "_batch"])["_batch"].unique()
        pivot = sub.pivot_table(
            index="_batch", columns="world_size", values="efficiency_pct", aggfunc="first"
        ).reindex(order)
        _heat(ax, pivot, cmap, norm, annotate=pivot.size <= 80)
        ax.set_xlabel("workers N")
        ax.set_ylabel(f"{r}\nbatch size" if ci == 0 else "")
    width, height, right, grid_h = fig.ts_box
    cax = fig.add_axes(
        [
            (right + 0.3) / width,
            1 - (TOP + min(grid_h, 3.0)) / height,
            0.14 / width,
            min(grid_h, 3.0) / height,
        ]
    )
    fig.colorbar(mpl.cm.ScalarMappable(norm=norm, cmap=cmap), cax=cax, label="efficiency %")
    return _finish(fig, FIGURES["efficiency_heatmap"]["title"])


def _heat(ax, pivot: pd.DataFrame, cmap, norm, annotate: bool) -> None:
    """A seaborn-style heat map drawn directly: sns.heatmap redraws the whole figure on every
    call (to check label overlap), which is quadratic in the number of panels."""
    z = pivot.to_numpy(dtype=float)
    ax.pcolormesh(np.ma.masked_invalid(z), cmap=cmap, norm=norm, edgecolors="white", linewidth=0.5)
    ax.set_xticks(np.arange(z.shape[1]) + 0.5, [f"{c:g}" for c in pivot.columns])
    ax.set_yticks(np.arange(z.shape[0]) + 0.5, list(pivot.index), rotation=0)
    ax.set_xlim(0, z.shape[1])
    ax.set_ylim(z.shape[0], 0)
    ax.grid(False)
    for sp in ax.spines.values():
        sp.set_visible(False)
    if annotate:
        for (i, j), v in np.ndenumerate(z):
            if np.isfinite(v):
                light = relative_luminance(cmap(norm(v))) > 0.408
                ax.text(
                    j + 0.5,
                    i + 0.5,
                    f"{v:.0f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color=".15" if light else "w",
                )


def _data_epoch_time(study: Study) -> pd.DataFrame | str:
    return _ok(study, "steady_epoch_seconds_mean")


def _draw_epoch_time(d: pd.DataFrame) -> Figure:
    return _lines(
        d,
        x="world_size",
        y="steady_epoch_seconds_mean",
        err="steady_epoch_seconds_ci95",
        row=["model", "dataset"],
        col=["strategy"],
        hue="scale",
        title=FIGURES["epoch_time"]["title"],
        xlabel="workers N (world size)",
        ylabel="steady epoch seconds",
    )


WARMUP_KINDS = {
    "epoch 1 (with warm-up)": "first_epoch_seconds",
    "steady epoch (2..E)": "steady_epoch_seconds",
    "overhead: epoch 1 − steady": "first_epoch_overhead_seconds",
}


def _data_warmup(study: Study) -> pd.DataFrame | str:
    d = _ok(study, "steady_epoch_seconds_mean")
    if isinstance(d, str):
        return d
    d = d[d["first_epoch_seconds_mean"].notna()]
    return pd.concat(
        [
            d.assign(kind=k, seconds=d[f"{c}_mean"], seconds_ci=d[f"{c}_ci95"])
            for k, c in WARMUP_KINDS.items()
        ],
        ignore_index=True,
    )


def _draw_warmup(d: pd.DataFrame) -> Figure:
    fig = _lines(
        d,
        x="world_size",
        y="seconds",
        err="seconds_ci",
        row=["model", "dataset"],
        col=["kind"],
        hue="strategy",
        title=FIGURES["warmup"]["title"],
        xlabel="workers N (world size)",
        ylabel="seconds",
        ylim=(None, None),
        col_order=list(WARMUP_KINDS),
    )
    for ax in fig.axes:
        if "overhead" in ax.get_title():
            ax.axhline(0, color="0.3", linewidth=0.8)
    return fig


def _varies_along(d: pd.DataFrame, x: str) -> bool:
    rest = [k for k in KEYS if k != x]
    return bool((d.groupby(rest, dropna=False)[x].nunique() > 1).any())


def _data_throughput_scale(study: Study) -> pd.DataFrame | str:
    d = _ok(study, "throughput_mean")
    if isinstance(d, str):
        return d
    if not _varies_along(d, "scale"):
        scales = ", ".join(map(str, sorted(d["scale"].unique())))
        return f"no cell was run at more than one dataset scale (scale: {scales})"
    return d


def _draw_throughput_scale(d: pd.DataFrame) -> Figure:
    return _lines(
        d,
        x="scale",
        y="throughput_mean",
        err="throughput_ci95",
        row=["model", "dataset"],
        col=["strategy"],
        hue="world_size",
        title=FIGURES["throughput_scale"]["title"],
        xlabel="dataset scale (training set repeated)",
        ylabel="samples/s",
        log2x=d["scale"].max() / max(d["scale"].min(), 1) >= 8,
    )


def _data_throughput_batch(study: Study) -> pd.DataFrame | str:
    d = _ok(study, "throughput_mean")
    if isinstance(d, str):
        return d
    if not _varies_along(d, "batch_size"):
        sizes = ", ".join(map(str, sorted(d["batch_size"].unique())))
        return f"no cell was run at more than one batch size (batch_size: {sizes})"
    return d


def _draw_throughput_batch(d: pd.DataFrame) -> Figure:
    return _lines(
        d,
        x="batch_size",
        y="throughput_mean",
        err="throughput_ci95",
        row=["model", "dataset"],
        col=["strategy"],
        hue="world_size",
        title=FIGURES["throughput_batch"]["title"],
        xlabel="batch size (see batch mode)",
        ylabel="samples/s",
        log2x=True,
    )


def _data_accuracy(study: Study) -> pd.DataFrame | str:
    d = _ok(study, "test_accuracy_mean")
    return "no ok run measured test accuracy" if isinstance(d, str) and "recorded" in d else d


def _draw_accuracy(d: pd.DataFrame) -> Figure:
    return _lines(
        d,
        x="batch_size",
        y="test_accuracy_mean",
        err="test_accuracy_ci95",
        row=["model", "dataset"],
        col=["strategy"],
        hue="world_size",
        title=FIGURES["accuracy"]["title"],
        xlabel="batch size",
        ylabel="test accuracy (final epoch)",
        log2x=True,
        ylim=(None, 1.0),
    )


def _data_convergence(study: Study) -> pd.DataFrame | str:
    c = study.convergence
    if not len(c) or "train_loss_mean" not in c or c["train_loss_mean"].isna().all():
        return "no ok run recorded a train loss per epoch"
    return c[c["train_loss_mean"].notna()]


def _draw_convergence(d: pd.DataFrame) -> Figure:
    return _lines(
        d,
        x="epoch",
        y="train_loss_mean",
        err="train_loss_ci95",
        row=["model", "dataset"],
        col=["strategy"],
        hue="world_size",
        title=FIGURES["convergence"]["title"],
        xlabel="epoch",
        ylabel="train loss (epoch mean)",
    )


def _data_memory(study: Study) -> pd.DataFrame | str:
    d = _ok(study, "peak_host_rss_bytes_mean")
    if isinstance(d, str):
        return d
    mib = 2.0**20
    host = d.assign(
        kind="host RSS",
        mib=d["peak_host_rss_bytes_mean"] / mib,
        mib_ci=d["peak_host_rss_bytes_ci95"] / mib,
    )
    parts = [host]
    dev = d[d["peak_device_bytes_mean"].notna()]
    if len(dev):
        parts.append(
            dev.assign(
                kind="device",
                mib=dev["peak_device_bytes_mean"] / mib,
                mib_ci=dev["peak_device_bytes_ci95"] / mib,
            )
        )
    return pd.concat(parts, ignore_index=True)


def _draw_memory(d: pd.DataFrame) -> Figure:
    d = d.copy()
    fig = _lines(
        d,
        x="world_size",
        y="mib",
        err="mib_ci",
        row=["model", "dataset"],
        col=["kind"],
        hue="strategy",
        title=FIGURES["memory"]["title"],
        xlabel="workers N (world size)",
        ylabel="peak MiB per worker process",
    )
    for ax in fig.axes:
        if ax.has_data():
            ax.set_ylim(bottom=0)
    return fig


def _data_busbw(study: Study) -> pd.DataFrame | str:
    c = study.collectives
    if c is None or not len(c):
        return (
            "no all-reduce benchmark ran (no run has more than one worker, or "
            "collectives.enabled is false)"
        )
    failed = aggregate.failed_collectives(c)
    c = aggregate.measured_collectives(c)
    if not len(c):
        first = str(failed["error"].iloc[0]).splitlines()[0]
        return f"the all-reduce benchmark could not run: {first}"
    d = c.assign(
        gbs=c["busbw_bytes_per_second"] / 1e9, gbs_p95=c["busbw_p95_bytes_per_second"] / 1e9
    )
    r = study.runs
    if "model.params" in r and r["model.params"].notna().any():
        d.attrs["gradients"] = (r.groupby("spec.model")["model.params"].max() * 4).to_dict()
    return d


def _size_label(b: float) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= f:
            return f"{b / f:g} {unit}"
    return f"{b:g} B"


def _draw_busbw(d: pd.DataFrame) -> Figure:
    """Bus bandwidth vs message size: one facet per backend, one colour per N."""
    backends = sorted(d["backend"].unique())
    shapes = d[["world_size", "workers", "nodes"]].drop_duplicates().sort_values("world_size")
    label = {
        (r.world_size, r.workers, r.nodes): f"N={r.world_size} ({r.workers}×{r.nodes} nodes)"
        if r.nodes > 1
        else f"N={r.world_size}"
        for r in shapes.itertuples()
    }
    colours = dict(zip(label, sns.color_palette("viridis", max(len(label), 1)), strict=False))
    grads = d.attrs.get("gradients", {})
    handles = [_header("workers N")]
    handles += [Line2D([], [], color=colours[k], marker="o", label=v) for k, v in label.items()]
    if grads:
        handles.append(Line2D([], [], color="0.35", linestyle=":", label="a model's gradient"))
    fig, axes = _grid(
        [""],
        backends,
        sharey=False,
        w=4.2,
        h=2.8,
        side=_side_width([h.get_label() for h in handles]),
    )
    for ax, backend in zip(axes[0], backends, strict=True):
        sub = d[d["backend"] == backend]
        for key, s in sub.groupby(["world_size", "workers", "nodes"], sort=True):
            s = s.sort_values("bytes")
            ax.plot(s["bytes"], s["gbs"], color=colours[key], marker="o", markersize=3)
            ax.fill_between(s["bytes"], s["gbs_p95"], s["gbs"], color=colours[key], alpha=0.2)
        ax.set_xscale("log", base=2)
        lo, hi = sub["bytes"].min(), sub["bytes"].max()
        ticks = [2.0**k for k in range(int(np.log2(lo)), int(np.log2(hi)) + 1, 2)]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([_size_label(t) for t in ticks])
        for model, size in sorted(grads.items()):
            if lo <= size <= hi:
                ax.axvline(size, color="0.35", linestyle=":", linewidth=1.0)
                ax.text(
                    size,
                    1.0,
                    f" {model}",
                    transform=ax.get_xaxis_transform(),
                    fontsize=7,
                    rotation=90,
                    va="top",
                    ha="left",
                    color="0.3",
                )
        ax.set_yscale("log")  # small messages are latency-bound: orders of magnitude apart
        ax.set_title(f"all_reduce, {backend}")
        ax.set_xlabel("message size S")
        ax.set_ylabel("bus bandwidth (GB/s)")
    return _finish(fig, FIGURES["busbw"]["title"], handles)


DATA: dict[str, Callable[[Study], pd.DataFrame | str]] = {
    name: globals()[f"_data_{name}"] for name in FIGURES
}
DRAW: dict[str, Callable[[pd.DataFrame], Figure]] = {
    name: globals()[f"_draw_{name}"] for name in FIGURES
}


# --------------------------------------------------------------------------------------------
# entry points


def why_absent(name: str, study: Study) -> str | None:
    """Why the study has no data for figure `name`, or None when it has."""
    d = DATA[name](study)
    return d if isinstance(d, str) else None


def note_figure(text: str) -> Figure:
    """A small image that says what is missing (written instead of an empty plot)."""
    lines = textwrap.wrap(text, 90)
    fig = Figure(figsize=(7.0, 0.45 + 0.22 * len(lines)))
    fig.text(0.02, 0.5, "\n".join(lines), ha="left", va="center", fontsize=10, color="0.25")
    return fig


def render(name: str, study: Study, svg: str | Path, png: str | Path) -> str | None:
    """Draw figure `name` into `svg` and `png`; return the note when there was nothing to draw."""
    with mpl.rc_context(_theme()):
        d = DATA[name](study)
        if isinstance(d, str):
            note = f"no data in this study for {FIGURES[name]['title'].lower()}: {d}"
            fig = note_figure(note)
        else:
            note = None
            fig = DRAW[name](d)
        for path in (svg, png):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(svg, format="svg", metadata={"Date": None})
        fig.savefig(
            png,
            format="png",
            dpi=PNG_DPI,
            metadata={"Software": None},
            pil_kwargs={"compress_level": PNG_COMPRESS},
        )
    return note


def render_all(
    study: Study,
    out: str | Path,
    names: Sequence[str] | None = None,
    jobs: int = 1,
    meanwhile: Callable[[], None] | None = None,
) -> dict[str, str | None]:
    """Every figure into out/<name>.svg and .png; {name: note or None}. Uses `jobs` processes;
    `meanwhile` (e.g. writing the CSV files) runs in this process while they draw."""
    names = list(names or FIGURES)
    out = Path(out)
    jobs = max(1, min(jobs, len(names)))
    if jobs == 1:
        if meanwhile:
            meanwhile()
        return {n: render(n, study, out / f"{n}.svg", out / f"{n}.png") for n in names}
    from concurrent.futures import ProcessPoolExecutor

    from trainscale.aggregate import _mp_context

    study.convergence  # noqa: B018 (computed once, before forking)
    global _STUDY
    _STUDY = study
    # heaviest first, so the processes finish together
    order = sorted(names, key=lambda n: n not in ("convergence", "efficiency_heatmap"))
    with ProcessPoolExecutor(jobs, mp_context=_mp_context()) as ex:
        futures = [ex.submit(_render_forked, n, str(out)) for n in order]
        if meanwhile:
            meanwhile()
        notes = {n: f.result() for n, f in zip(order, futures, strict=True)}
    return {n: notes[n] for n in names}


_STUDY: Study | None = None


def _render_forked(name: str, out: str) -> str | None:
    assert _STUDY is not None, "render_all forks with the study set"
    return render(name, _STUDY, Path(out) / f"{name}.svg", Path(out) / f"{name}.png")
