"""Accuracy figures: final test accuracy against batch size and workers, and the train loss
per epoch (the per-epoch convergence table)."""

from __future__ import annotations

import pandas as pd

from trainscale.analysis.aggregate import Study
from trainscale.report.figures.lined import lines_figure
from trainscale.report.figures.registry import ok_cells


def _accuracy(study: Study) -> pd.DataFrame | str:
    d = ok_cells(study, "test_accuracy_mean")
    return "no ok run measured test accuracy" if isinstance(d, str) and "recorded" in d else d


def _convergence(study: Study) -> pd.DataFrame | str:
    c = study.convergence
    if not len(c) or "train_loss_mean" not in c or c["train_loss_mean"].isna().all():
        return "no ok run recorded a train loss per epoch"
    return c[c["train_loss_mean"].notna()]


lines_figure("accuracy", data=_accuracy, row=("model", "dataset"), col=("strategy",))
lines_figure("convergence", data=_convergence, row=("model", "dataset"), col=("strategy",))
