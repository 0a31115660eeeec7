"""Resource figures: peak memory per worker process, the predicted peak per rank against the
measured one, and the all-reduce benchmark's bus bandwidth against message size."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator

from trainscale.analysis import aggregate
from trainscale.analysis.aggregate import Study
from trainscale.report import rows
from trainscale.report.figures.facets import finish, grid, side_width
from trainscale.report.figures.lined import draw_lines
from trainscale.report.figures.registry import Kind, figure, ok_cells
from trainscale.report.figures.style import STRATEGY_COLOURS, header, sequential

MIB = 2.0**20


def _memory(study: Study) -> pd.DataFrame | str:
    d = ok_cells(study, "peak_host_rss_bytes_mean")
    if isinstance(d, str):
        return d
    host = d.assign(
        kind="host RSS",
        mib=d["peak_host_rss_bytes_mean"] / MIB,
        mib_ci=d["peak_host_rss_bytes_ci95"] / MIB,
    )
    parts = [host]
    dev = d[d["peak_device_bytes_mean"].notna()]
    if len(dev):
        parts.append(
            dev.assign(
                kind="device",
                mib=dev["peak_device_bytes_mean"] / MIB,
                mib_ci=dev["peak_device_bytes_ci95"] / MIB,
            )
        )
    return pd.concat(parts, ignore_index=True)


def _busbw(study: Study) -> pd.DataFrame | str:
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


@figure("memory", data=_memory, row=("model", "dataset"), col=("kind",))
def draw_memory(d: pd.DataFrame, kind: Kind) -> Figure:
    fig = draw_lines(d, kind)
    for ax in fig.axes:
        if ax.has_data():
            ax.set_ylim(bottom=0)
    return fig


def _memory_predicted(study: Study) -> pd.DataFrame | str:
    s = study.scaling
    if "predicted_peak_bytes" not in s or not s["predicted_peak_bytes"].notna().any():
        return "nothing was predicted (memory.check is off: docs/memory.md)"
    d = s[s["predicted_peak_bytes"].notna() & s["peak_device_bytes_mean"].notna()]
    if d.empty:
        return "no cell with a prediction measured a device peak (a GPU run)"
    return d.assign(
        predicted_gib=d["predicted_peak_bytes"] / 2**30,
        measured_gib=d["peak_device_bytes_mean"] / 2**30,
    )


@figure("memory_predicted", data=_memory_predicted, col=("model",))
def draw_memory_predicted(d: pd.DataFrame, kind: Kind) -> Figure:
    """Measured against predicted peak per rank: a point per cell, coloured by strategy, on
    the line y = x with a ±10 % band (the bar)."""
    models = sorted(d["model"].unique())
    strategies = [s for s in STRATEGY_COLOURS if s in set(d["strategy"])]
    handles = [header("strategy")]
    handles += [Line2D([], [], color=STRATEGY_COLOURS[s], marker="o", linestyle="", label=s)
                for s in strategies]  # fmt: skip
    handles.append(Line2D([], [], color="0.3", linestyle="--", label="measured = predicted"))
    fig, axes = grid([""], models, sharey=False, w=3.2, h=3.0,
                     side=side_width([h.get_label() for h in handles]))  # fmt: skip
    for ax, model in zip(axes[0], models, strict=True):
        sub = d[d["model"] == model]
        for s in strategies:
            pts = sub[sub["strategy"] == s]
            ax.plot(pts["predicted_gib"], pts["measured_gib"], "o", color=STRATEGY_COLOURS[s])
        top = 1.1 * max(sub["predicted_gib"].max(), sub["measured_gib"].max())
        ax.plot([0, top], [0, top], "--", color="0.3", linewidth=0.9)
        ax.fill_between([0, top], [0, 0.9 * top], [0, 1.1 * top], color="0.5", alpha=0.12)
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_title(model)
        ax.set_xlabel("predicted peak per rank (GiB)")
        ax.set_ylabel("measured peak device (GiB)")
    return finish(fig, kind.title, handles)


#: the knob axes (trainscale.plan.knobs) and the marker of each combination's points
KNOBS = ("activation_checkpointing", "offload")
MARKERS = "osD^v<>Ppx*h"


def _memory_trade(study: Study) -> pd.DataFrame | str:
    d = ok_cells(study, "throughput_mean")
    if isinstance(d, str):
        return d
    d = aggregate.with_axes(d, prefix="")
    if not any(d[k].nunique() > 1 for k in KNOBS):
        return "the study varies neither activation_checkpointing nor offload"
    device = d["peak_device_bytes_mean"].notna()
    peak = d["peak_device_bytes_mean"].where(device, d["peak_host_rss_bytes_mean"])
    rate = d["throughput_mean"] * d["seq_len"].where(d["seq_len"] > 0, 1)  # tokens/s on tokens
    return d.assign(peak_mib=peak / MIB, rate=rate, knobs=[rows.knobs(r) for r in d.itertuples()],
                    peak_kind=device.map({True: "device", False: "host RSS"}))  # fmt: skip


@figure("memory_trade", data=_memory_trade, col=("model",))
def draw_memory_trade(d: pd.DataFrame, kind: Kind) -> Figure:
    """Throughput against peak memory per cell: a colour per strategy, a marker per
    combination of activation checkpointing and offload, one panel per model."""
    models = sorted(d["model"].unique())
    strategies = [s for s in STRATEGY_COLOURS if s in set(d["strategy"])]
    combos = sorted(d["knobs"].unique(), key=lambda k: (k != "–", k))
    marker = dict(zip(combos, MARKERS, strict=False))
    handles = [header("strategy")]
    handles += [Line2D([], [], color=STRATEGY_COLOURS[s], marker="o", linestyle="", label=s)
                for s in strategies]  # fmt: skip
    handles.append(header("memory knobs"))
    handles += [Line2D([], [], color="0.3", marker=marker[c], linestyle="",
                       label="none" if c == "–" else c) for c in combos]  # fmt: skip
    fig, axes = grid([""], models, sharey=False, w=3.4, h=3.0,
                     side=side_width([h.get_label() for h in handles]))  # fmt: skip
    for ax, model in zip(axes[0], models, strict=True):
        sub = d[d["model"] == model]
        for r in sub.itertuples():
            ax.plot(r.peak_mib, r.rate, marker[r.knobs], color=STRATEGY_COLOURS.get(r.strategy))
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.set_title(model)
        ax.set_xlabel(f"peak MiB per worker ({', '.join(sorted(set(sub['peak_kind'])))})")
        ax.set_ylabel("throughput (samples/s; tokens/s on tokens)")
    return finish(fig, kind.title, handles)


def size_label(b: float) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= f:
            return f"{b / f:g} {unit}"
    return f"{b:g} B"


@figure("busbw", data=_busbw, col=("backend",))
def draw_busbw(d: pd.DataFrame, kind: Kind) -> Figure:
    """Bus bandwidth vs message size: one facet per backend, one colour per N."""
    backends = sorted(d["backend"].unique())
    shapes = d[["world_size", "workers", "nodes"]].drop_duplicates().sort_values("world_size")
    label = {
        (r.world_size, r.workers, r.nodes): f"N={r.world_size} ({r.workers}×{r.nodes} nodes)"
        if r.nodes > 1
        else f"N={r.world_size}"
        for r in shapes.itertuples()
    }
    colours = dict(zip(label, sequential(len(label)), strict=False))
    grads = d.attrs.get("gradients", {})
    handles = [header("workers N")]
    handles += [Line2D([], [], color=colours[k], marker="o", label=v) for k, v in label.items()]
    if grads:
        handles.append(Line2D([], [], color="0.35", linestyle=":", label="a model's gradient"))
    fig, axes = grid(
        [""],
        backends,
        sharey=False,
        w=4.2,
        h=2.8,
        side=side_width([h.get_label() for h in handles]),
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
        ax.set_xticklabels([size_label(t) for t in ticks])
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
    return finish(fig, kind.title, handles)
