"""Time figures: the steady epoch against workers by dataset scale, epoch 1 (with warm-up)
against the steady epoch, and the share of the steady epoch spent waiting for data against
workers (above datawait.INPUT_BOUND_SHARE a cell is input-bound)."""

from __future__ import annotations

from functools import partial

import pandas as pd
from matplotlib.figure import Figure

from trainscale.analysis.aggregate import Study
from trainscale.measure.datawait import INPUT_BOUND_SHARE
from trainscale.report.figures.facets import reference_handle
from trainscale.report.figures.lined import LineOptions, draw_lines, lines, lines_figure
from trainscale.report.figures.registry import Kind, figure, ok_cells

WARMUP_KINDS = {
    "epoch 1 (with warm-up)": "first_epoch_seconds",
    "steady epoch (2..E)": "steady_epoch_seconds",
    "overhead: epoch 1 − steady": "first_epoch_overhead_seconds",
}


def _warmup(study: Study) -> pd.DataFrame | str:
    d = ok_cells(study, "steady_epoch_seconds_mean")
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


lines_figure(
    "epoch_time",
    data=partial(ok_cells, col="steady_epoch_seconds_mean"),
    row=("model", "dataset"),
    col=("strategy",),
)


@figure("warmup", data=_warmup, row=("model", "dataset"), col=("kind",))
def draw_warmup(d: pd.DataFrame, kind: Kind) -> Figure:
    fig = draw_lines(d, kind, col_order=list(WARMUP_KINDS))
    for ax in fig.axes:
        if "overhead" in ax.get_title():
            ax.axhline(0, color="0.3", linewidth=0.8)
    return fig


def _data_wait(study: Study) -> pd.DataFrame | str:
    return ok_cells(study, "data_wait_share_mean")


@figure("data_wait", data=_data_wait, row=("model",), col=("dataset",))
def draw_data_wait(d: pd.DataFrame, kind: Kind) -> Figure:
    d = d.assign(
        data_wait_pct=100 * d["data_wait_share_mean"], data_wait_ci=100 * d["data_wait_share_ci95"]
    )

    def ref(ax, sub):
        ax.axhline(100 * INPUT_BOUND_SHARE, color="0.2", linestyle="--", linewidth=0.9)

    opts = LineOptions(
        x="world_size",
        y="data_wait_pct",
        err="data_wait_ci",
        hue="strategy",
        xlabel="workers N (world size)",
        ylabel="data wait, % of steady epoch",
        ref=ref,
        legend_extra=(
            reference_handle(f"input-bound above {100 * INPUT_BOUND_SHARE:.0f} %", "--"),
        ),
    )
    return lines(d, kind, opts)
