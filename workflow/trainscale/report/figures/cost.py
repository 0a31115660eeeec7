"""The cost figure: time against money per million tokens or samples, one point per cell, with
the Pareto front (the cells no other cell beats on both) marked: what a faster run costs, and
which cells are never worth choosing. Drawn only where config `cost` gives prices."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from trainscale.analysis import cost
from trainscale.analysis.aggregate import Study
from trainscale.report.figures.facets import finish, grid, side_width
from trainscale.report.figures.registry import Kind, figure, ok_cells
from trainscale.report.figures.style import STRATEGY_COLOURS, header


def _cost_time(study: Study) -> pd.DataFrame | str:
    d = ok_cells(study, "throughput_mean")
    if isinstance(d, str):
        return d
    if "cost_per_million_mean" not in d or not d["cost_per_million_mean"].notna().any():
        return "no prices (config cost.device_hour) apply to its cells"
    d = cost.cost_table(d)  # with each cell's hours per million
    d = d[d["cost_per_million_mean"].notna() & ~d["logical"].astype(bool)].copy()
    d["unit"] = d["seq_len"].map(cost.units)
    fronts = [
        cost.pareto(g, "hours_per_million", "cost_per_million_mean") for _, g in d.groupby("model")
    ]
    return d.assign(front=pd.concat(fronts))


@figure("cost_time", data=_cost_time, col=("model",))
def draw_cost_time(d: pd.DataFrame, kind: Kind) -> Figure:
    """Hours per million (x) against cost per million (y), a colour per strategy, N beside each
    point, the Pareto front joined by a line; one panel per model."""
    models = sorted(d["model"].unique())
    strategies = [s for s in STRATEGY_COLOURS if s in set(d["strategy"])]
    currency = str(d["currency"].dropna().iloc[0]) if d["currency"].notna().any() else ""
    handles = [header("strategy")]
    handles += [Line2D([], [], color=STRATEGY_COLOURS[s], marker="o", linestyle="", label=s)
                for s in strategies]  # fmt: skip
    handles.append(Line2D([], [], color="0.2", linestyle="--", label="Pareto front"))
    fig, axes = grid([""], models, sharey=False, w=3.4, h=3.0,
                     side=side_width([h.get_label() for h in handles]))  # fmt: skip
    for ax, model in zip(axes[0], models, strict=True):
        sub = d[d["model"] == model]
        front = sub[sub["front"]].sort_values("hours_per_million")
        x, y = front["hours_per_million"], front["cost_per_million_mean"]
        ax.plot(x, y, "--", color="0.2", lw=0.9)
        for r in sub.itertuples():
            at = (r.hours_per_million, r.cost_per_million_mean)
            ax.plot(*at, "o", color=STRATEGY_COLOURS.get(r.strategy),
                    markeredgecolor="0.1" if r.front else "none")  # fmt: skip
            ax.annotate(f"N={r.world_size}", at, fontsize=7, xytext=(4, 3),
                        textcoords="offset points", color="0.3")  # fmt: skip
        unit = sub["unit"].iloc[0]
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.set_title(model)
        ax.set_xlabel(f"hours per million {unit}")
        ax.set_ylabel(f"{currency} per million {unit}".strip())
    return finish(fig, kind.title, handles)
