"""Scaling figures: throughput, speedup and efficiency against workers N, and efficiency by
batch size and N as heat maps."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from trainscale.analysis.aggregate import Study
from trainscale.report.figures.facets import TOP, finish, grid, reference_handle
from trainscale.report.figures.lined import draw_lines, lines_figure
from trainscale.report.figures.registry import Kind, figure, ok_cells
from trainscale.report.figures.style import MAKO, labels, relative_luminance


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


@figure(
    "efficiency_heatmap",
    data=_multi_efficiency,
    row=("model", "dataset", "scale", "precision", "nodes"),
    col=("strategy",),
)
def draw_efficiency_heatmap(d: pd.DataFrame, kind: Kind) -> Figure:
    d = d.copy()
    # the row label is the y label of the first column, one short line per part
    d["_row"] = labels(d, ["model", "dataset"]) + labels(
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
    fig, axes = grid(
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
    norm = Normalize(0, vmax)
    facets = dict(iter(d.groupby(["_row", "strategy"], sort=False)))
    for (ri, r), (ci, c) in ((a, b) for a in enumerate(rows) for b in enumerate(cols)):
        ax = axes[ri, ci]
        sub = facets.get((r, c), d.iloc[0:0])
        ax.set_title(c)
        if sub.empty:
            ax.axis("off")
            ax.text(0.5, 0.5, "no N > 1 cells", ha="center", va="center", transform=ax.transAxes)
            continue
        order = sub.sort_values(["_order", "_batch"])["_batch"].unique()
        pivot = sub.pivot_table(
            index="_batch", columns="world_size", values="efficiency_pct", aggfunc="first"
        ).reindex(order)
        heat(ax, pivot, norm, annotate=pivot.size <= 80)
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
    fig.colorbar(ScalarMappable(norm=norm, cmap=MAKO), cax=cax, label="efficiency %")
    return finish(fig, kind.title)


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
                    fontsize=7,
                    color=".15" if light else "w",
                )
