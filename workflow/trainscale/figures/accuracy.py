"""Accuracy figures: final test accuracy against batch size and workers, and the train loss
per epoch (the per-epoch convergence table)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from trainscale.aggregate import Study
from trainscale.figures.facets import lines
from trainscale.figures.registry import Kind, figure, ok_cells


def _accuracy(study: Study) -> pd.DataFrame | str:
    d = ok_cells(study, "test_accuracy_mean")
    return "no ok run measured test accuracy" if isinstance(d, str) and "recorded" in d else d


def _convergence(study: Study) -> pd.DataFrame | str:
    c = study.convergence
    if not len(c) or "train_loss_mean" not in c or c["train_loss_mean"].isna().all():
        return "no ok run recorded a train loss per epoch"
    return c[c["train_loss_mean"].notna()]


@figure("accuracy", data=_accuracy, row=("model", "dataset"), col=("strategy",))
def draw_accuracy(d: pd.DataFrame, kind: Kind) -> Figure:
    return lines(
        d,
        kind,
        x="batch_size",
        y="test_accuracy_mean",
        err="test_accuracy_ci95",
        hue="world_size",
        xlabel="batch size",
        ylabel="test accuracy (final epoch)",
        log2x=True,
        ylim=(None, 1.0),
    )


@figure("convergence", data=_convergence, row=("model", "dataset"), col=("strategy",))
def draw_convergence(d: pd.DataFrame, kind: Kind) -> Figure:
    return lines(
        d,
        kind,
        x="epoch",
        y="train_loss_mean",
        err="train_loss_ci95",
        hue="world_size",
        xlabel="epoch",
        ylabel="train loss (epoch mean)",
    )
