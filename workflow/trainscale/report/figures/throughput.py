"""Throughput against the dataset scale and against the batch size, one facet per strategy.

A panel is drawn only where its strategy ran at two scales (batch sizes) or more, and a figure
with no such panel not at all: the registry's `shown` decides, as for every figure."""

from __future__ import annotations

from functools import partial

from trainscale.report.figures.lined import lines_figure
from trainscale.report.figures.registry import ok_cells

_throughput = partial(ok_cells, col="throughput_mean")

lines_figure("throughput_scale", data=_throughput, row=("model", "dataset"), col=("strategy",))
lines_figure("throughput_batch", data=_throughput, row=("model", "dataset"), col=("strategy",))
