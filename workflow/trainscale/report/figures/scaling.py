"""Scaling figures: throughput, speedup and efficiency against workers N, and efficiency by
batch size and N as heat maps."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from trainscale.analysis.aggregate import Study
from trainscale.report.figures.facets import reference_handle
from trainscale.report.figures.lined import draw_lines, lines_figure
from trainscale.report.figures.registry import Kind, figure, ok_cells
from trainscale.report.figures.style import MAKO, labels, palette, relative_luminance


def scaled(study: Study) -> pd.DataFrame | str:
    """Cells with a speedup (an N = 1 baseline of the same configuration), or why none."""
    d = ok_cells(study, "throughput_mean")
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


def _multi_efficiency(study: Study) -> pd.DataFrame | str:
    d = scaled(study)
    if isinstance(d, str):
        return d
    d = d[(d["world_size"] > 1) & d["efficiency"].notna()]
    return d if len(d) else "no N > 1 cell has an efficiency"


def in_rate_units(study: Study) -> pd.DataFrame | str:
    """The ok cells' throughput in their data's unit: tokens/s (× seq_len) where a cell trains
    on token data, samples/s otherwise (panels are per data set, so one unit per panel)."""
    d = ok_cells(study, "throughput_mean")
    if isinstance(d, str) or "seq_len" not in d or not (d["seq_len"] > 0).any():
        return d
    per = d["seq_len"].where(d["seq_len"] > 0, 1)
    cols = [c for c in ("throughput_mean", "throughput_ci95", "baseline_throughput") if c in d]
    return d.assign(**{c: d[c] * per for c in cols})


@figure("throughput", data=in_rate_units, row=("model",), col=("dataset",))
def draw_throughput(d: pd.DataFrame, kind: Kind) -> Figure:
    return draw_lines(
        d, kind, ideal="baseline_throughput", legend_extra=[reference_handle("ideal: N · X(1)")]
    )


@figure("speedup", data=scaled, row=("model",), col=("dataset",))
def draw_speedup(d: pd.DataFrame, kind: Kind) -> Figure:
    def ref(ax, sub):
        n = np.array(sorted({1.0, *sub["world_size"].astype(float)}))
        ax.plot(n, n, color="0.2", linestyle="--", linewidth=0.9)

    return draw_lines(d, kind, ref=ref, legend_extra=[reference_handle("ideal: S(N) = N", "--")])


@figure("efficiency", data=scaled, row=("model",), col=("dataset",))
def draw_efficiency(d: pd.DataFrame, kind: Kind) -> Figure:
    def ref(ax, sub):
        ax.axhline(100, color="0.2", linestyle="--", linewidth=0.9)

    d = d.assign(efficiency_pct=100 * d["efficiency"])
    return draw_lines(d, kind, ref=ref, legend_extra=[reference_handle("ideal: 100 %", "--")])


def _mfu(study: Study) -> pd.DataFrame | str:
    d = ok_cells(study, "mfu_mean")
    if isinstance(d, str):
        return d
    return d.assign(mfu_pct=100 * d["mfu_mean"], mfu_ci_pct=100 * d["mfu_ci95"])


lines_figure("mfu", data=_mfu, row=("model",), col=("dataset",))


#: Inches of a heat-map cell: wide enough for "100" at 7.5 pt, tall enough for one line.
CELL_W, CELL_H = 0.55, 0.26
#: Rows (strategy × batch) and columns (N) of one heat map at most: beyond, it would be too
#: small to read at the report's width, and the scaling table says the same.
MAX_HEAT_ROWS, MAX_HEAT_COLS = 48, 16
HEAT_ROW = ["model", "dataset", "scale", "precision", "nodes"]


def _heatmap(study: Study) -> pd.DataFrame | str:
    d = _multi_efficiency(study)
    if isinstance(d, str):
        return d
    rows = d.groupby(HEAT_ROW)[["strategy", "batch_size", "batch_mode"]].apply(
        lambda g: len(g.drop_duplicates())
    )
    cols = d.groupby(HEAT_ROW)["world_size"].nunique()
    if rows.max() > MAX_HEAT_ROWS or cols.max() > MAX_HEAT_COLS:
        return (
            f"a heat map of {rows.max()} rows × {cols.max()} workers N would be too small to read "
            "(the scaling table lists every efficiency)"
        )
    return d


@figure("efficiency_heatmap", data=_heatmap, row=tuple(HEAT_ROW))
def draw_efficiency_heatmap(d: pd.DataFrame, kind: Kind) -> Figure:
    """One heat map per model, dataset (and scale, precision, nodes where they vary): a row per
    strategy (and batch where it varies), a column per N > 1, every cell of a fixed size with
    its efficiency printed in it."""
    d = d.copy()
    d["_panel"] = labels(d, ["model", "dataset"]) + labels(
        d, ["scale", "precision", "nodes"], only_varying=True
    ).map(lambda s: f" · {s}" if s else "")
    mode = d["batch_mode"].nunique() > 1
    batch = (
        "batch "
        + d["batch_size"].astype(str)
        + (" " + d["batch_mode"].str.replace("per_worker", "per-worker") if mode else "")
    )
    varied = d["batch_size"].nunique() > 1 or mode
    d["_row"] = d["strategy"] + (" · " + batch if varied else "")
    order = list(palette(d["strategy"], "strategy"))  # the catalog's order of strategies
    d["_order"] = d["strategy"].map(order.index)
    d["efficiency_pct"] = 100 * d["efficiency"]
    panels = sorted(d["_panel"].unique())
    label_w = 0.3 + 0.065 * d["_row"].str.len().max()
    ncol = d.groupby("_panel")["world_size"].nunique().max()
    nrow = {p: d.loc[d["_panel"] == p, "_row"].nunique() for p in panels}
    top, gap, bottom, side = 0.55, 0.75, 0.5, 1.2
    width = label_w + ncol * CELL_W + side
    height = top + sum(CELL_H * n for n in nrow.values()) + gap * (len(panels) - 1) + bottom
    fig = Figure(figsize=(width, height))
    vmax = max(100.0, float(d["efficiency_pct"].max()))
    norm = Normalize(0, vmax)
    y = height - top
    for p in panels:
        sub = d[d["_panel"] == p].sort_values(["_order", "batch_size", "_row"])
        # pivot_table(aggfunc="first") with its dropped all-NaN columns, a third of the time
        first = sub.groupby(["_row", "world_size"])["efficiency_pct"].first()
        pivot = first.unstack("world_size").dropna(axis=1, how="all")
        pivot = pivot.reindex(sub["_row"].unique())
        h, w = CELL_H * len(pivot), CELL_W * pivot.shape[1]
        y -= h
        ax = fig.add_axes((label_w / width, y / height, w / width, h / height))
        heat(ax, pivot, norm, annotate=True)
        ax.set_title(p, fontsize=9, loc="left")
        ax.set_xlabel("workers N")
        y -= gap
    bar_h = min(height - top - bottom, 2.5)
    cax = fig.add_axes(
        (
            (label_w + ncol * CELL_W + 0.35) / width,
            (height - top - bar_h) / height,
            0.14 / width,
            bar_h / height,
        )
    )
    fig.colorbar(ScalarMappable(norm=norm, cmap=MAKO), cax=cax, label="efficiency %")
    fig.suptitle(kind.title, y=1 - 0.08 / height, va="top", fontsize=11)
    return fig


def heat(ax, pivot: pd.DataFrame, norm: Normalize, annotate: bool) -> None:
    """A seaborn-style heat map drawn directly: sns.heatmap redraws the whole figure on every
    call (to check label overlap), which is quadratic in the number of panels."""
    z = pivot.to_numpy(dtype=float)
    ax.pcolormesh(np.ma.masked_invalid(z), cmap=MAKO, norm=norm, edgecolors="white", linewidth=0.5)
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
                light = relative_luminance(MAKO(norm(v))) > 0.408
                ax.text(
                    j + 0.5,
                    i + 0.5,
                    f"{v:.0f}",
                    ha="center",
                    va="center",
                    fontsize=7.5,
                    color=".15" if light else "w",
                )
