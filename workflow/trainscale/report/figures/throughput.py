"""Throughput against the dataset scale and against the batch size, one facet per strategy."""

from __future__ import annotations

import pandas as pd

from trainscale.analysis.aggregate import Study
from trainscale.report.figures.facets import KEYS
from trainscale.report.figures.lined import lines_figure
from trainscale.report.figures.registry import ok_cells


def varies_along(d: pd.DataFrame, x: str) -> bool:
    """Whether some cells differ only in `x` (a line along x has two or more points)."""
    rest = [k for k in KEYS if k != x]
    return bool((d.groupby(rest, dropna=False)[x].nunique() > 1).any())


def _along(study: Study, x: str, what: str) -> pd.DataFrame | str:
    d = ok_cells(study, "throughput_mean")
    if isinstance(d, str):
        return d
    if not varies_along(d, x):
        values = ", ".join(map(str, sorted(d[x].unique())))
        return f"no cell was run at more than one {what} ({x}: {values})"
    return d


def _throughput_scale(study: Study) -> pd.DataFrame | str:
    return _along(study, "scale", "dataset scale")


def _throughput_batch(study: Study) -> pd.DataFrame | str:
    return _along(study, "batch_size", "batch size")


lines_figure(
    "throughput_scale", data=_throughput_scale, row=("model", "dataset"), col=("strategy",)
)
lines_figure(
    "throughput_batch", data=_throughput_batch, row=("model", "dataset"), col=("strategy",)
)
