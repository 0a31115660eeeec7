"""The report answers at a glance: the ranking (table and figure), no figure or panel without
something to show, and figures that stay readable with many strategies. Synthetic tables only:
every test here runs in well under a second or two."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.text import Text

from trainscale.analysis.interval import REPEATS
from trainscale.analysis.ranking import ranking
from trainscale.report import figures
from trainscale.report.figures import ranking as ranking_figure
from trainscale.report.figures import select
from trainscale.report.figures.registry import shown

STRATEGIES = [
    "torch", "torch-dp", "torch-ddp", "torch-fsdp", "torch-pipeline", "lightning-ddp", "tf",
    "tf-mirrored", "tf-multiworker", "tf-ps", "horovod-torch", "horovod-keras",
    "deepspeed-zero0", "deepspeed-zero1",
]  # fmt: skip


def scaling(rows: list[dict]) -> pd.DataFrame:
    """A scaling table with the columns the ranking reads; the rest take their defaults."""
    base = {
        "model": "m", "dataset": "d", "world_size": 2, "workers": 2, "nodes": 1, "scale": 1,
        "batch_size": 64, "batch_mode": "global", "precision": "fp32", "seq_len": 0,
        "throughput_ci95": 1.0, "mfu_mean": 0.1, "mfu_ci95": 0.01, "logical": False,
        "oversubscribed": False, "ok": 2, "runs": 2, "baseline_throughput": math.nan,
    }  # fmt: skip
    return pd.DataFrame([base | r for r in rows])


class Study:
    """What the figures read of a study: its scaling table and the ranking made from it."""

    def __init__(self, s: pd.DataFrame):
        self.scaling = s
        self.ranking = ranking(s)


def test_ranking_sorts_compares_with_the_fastest_and_marks_cells():
    s = scaling(
        [
            {"strategy": "torch-ddp", "throughput_mean": 100.0, "throughput_ci95": 5.0},
            {"strategy": "tf-ps", "throughput_mean": 97.0, "throughput_ci95": 3.0},  # overlaps
            {"strategy": "horovod-torch", "throughput_mean": 80.0, "throughput_ci95": 2.0},
            {"strategy": "tf-mirrored", "throughput_mean": 120.0, "logical": True},
            {"strategy": "torch-fsdp", "throughput_mean": 90.0, "throughput_ci95": math.nan},
            {"strategy": "deepspeed-zero0", "throughput_mean": math.nan, "ok": 0},  # no ok run
        ]
    )
    r = ranking(s).set_index("strategy")
    assert list(r.index) == ["tf-mirrored", "torch-ddp", "tf-ps", "torch-fsdp", "horovod-torch"]
    assert r.loc["tf-mirrored", "fastest"] is np.False_ and math.isnan(r.loc["tf-mirrored", "rank"])
    assert r["rank"].dropna().tolist() == [1, 2, 3, 4] and r.loc["torch-ddp", "fastest"]
    assert r.loc["tf-ps", "could_be_fastest"] and not r.loc["tf-ps", "slower"]  # 97 ± 3: a tie
    assert r.loc["horovod-torch", "slower"] and r.loc["horovod-torch", "distinguishable"]
    fsdp = r.loc["torch-fsdp"]  # no CI: could be the fastest, never slower
    assert fsdp["could_be_fastest"] and not fsdp["slower"] and math.isnan(fsdp["mcb_high"])
    assert not r.loc["torch-ddp", "slower"] and not r.loc["tf-mirrored", "could_be_fastest"]
    assert r.loc["tf-ps", "mark"] == "asynchronous" and r.loc["torch-ddp", "mark"] == ""
    assert r.loc["horovod-torch", "behind"] == pytest.approx(0.2)
    marks = {n: ranking_figure.marks(row, 3) for n, row in r.iterrows()}
    assert marks["torch-ddp"] == "fastest · 1 of 3 that could be"
    assert marks["tf-ps"] == "−3.0 % · could be the fastest · asynchronous"
    assert marks["torch-fsdp"] == "−10 % · no interval"
    assert marks["horovod-torch"] == "−20 % · slower"
    assert marks["tf-mirrored"] == "logical devices, not ranked"


def test_ranking_gives_token_cells_in_tokens_per_second():
    s = scaling(
        [
            {"strategy": "torch-ddp", "throughput_mean": 10.0, "seq_len": 256},
            {"strategy": "torch-fsdp", "throughput_mean": 8.0, "seq_len": 256},
        ]
    )
    r = ranking(s)
    assert r["unit"].tolist() == ["tokens/s"] * 2 and r["rate_mean"].tolist() == [2560.0, 2048.0]


def test_the_ranking_figure_has_a_panel_per_model_and_n_fastest_on_top(monkeypatch):
    monkeypatch.setattr(ranking_figure, "ROWS", 12)  # fewer rows than the 14 strategies
    rows = [
        {"strategy": st, "model": model, "world_size": n, "workers": n, "ok": 10, "runs": 10,
         "throughput_mean": 100.0 + 10 * i + n, "throughput_ci95": 8.0}
        for i, st in enumerate(STRATEGIES) for model in ("m1", "m2") for n in (1, 2)
    ]  # fmt: skip
    study = Study(scaling(rows))
    kind = figures.REGISTRY["ranking"]
    assert list(figures.REGISTRY)[0] == "ranking"  # the report's first figure
    d, left_out = shown(kind, study)
    assert left_out is None
    fig = kind.draw(d, kind)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert sorted(ax.get_title() for ax in panels) == [
        "m1 · d · N=1", "m1 · d · N=2", "m2 · d · N=1", "m2 · d · N=2",
    ]  # fmt: skip
    ax = panels[0]
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    # the last is the fastest: on top; ROWS of the 14 drawn, the other two counted
    assert ticks == STRATEGIES[::-1][: ranking_figure.ROWS]
    texts = [t.get_text() for t in ax.texts]
    assert texts[0] == "fastest · 1 of 3 that could be" and "could be the fastest" in texts[1]
    assert all(t.endswith("slower") for t in texts[-4:-1])  # far behind: slower
    assert texts[-1] == "… 2 more cells ranked below these (scaling.csv)"
    assert "this panel resolves differences of ≥ " in ax.get_xlabel()
    # legible with 14 strategies: rows a fixed height, panels wrapped two to a row
    width, height = fig.get_size_inches()
    assert width < 15 and ranking_figure.ROW_H * len(STRATEGIES) * 2 < height < 16
    assert any(isinstance(a, Text) and "MFU" in a.get_text() for a in fig.findobj(Text))


def test_a_panel_never_leaves_out_a_cell_that_could_be_the_fastest(monkeypatch):
    monkeypatch.setattr(ranking_figure, "ROWS", 12)  # fewer rows than the 14 strategies
    tied = {"ok": 10, "runs": 10, "throughput_ci95": 8.0}
    rows = [
        {"strategy": st, "throughput_mean": 100.0 + 0.01 * i, **tied}
        for i, st in enumerate(STRATEGIES)
    ]
    drawn, hidden, _ = ranking_figure._panel(ranking(scaling(rows)))
    assert len(drawn) == len(STRATEGIES) > ranking_figure.ROWS and hidden == 0


def test_a_tag_every_row_of_a_panel_has_is_said_once_under_it():
    rows = [
        {"strategy": st, "throughput_mean": x, "oversubscribed": True,
         "interval_method": REPEATS if x < 100 else ""}
        for st, x in (("torch-ddp", 100.0), ("tf-ps", 99.5), ("horovod-torch", 80.0))
    ]  # fmt: skip
    drawn, _, shared = ranking_figure._panel(ranking(scaling(rows)))
    assert shared == ["oversubscribed"]  # the fastest's interval is from steps: per row
    assert drawn["_marks"].str.replace(" ·\n", " · ").tolist() == [
        "fastest · 1 of 2 that could be",
        "−0.50 % · could be the fastest · equivalent (±2 %) · CI: repeats only · asynchronous",
        "−20 % · slower · CI: repeats only",
    ]
    fig = ranking_figure.draw_ranking(drawn, figures.REGISTRY["ranking"])
    (ax,) = [a for a in fig.axes if a.get_title()]
    assert ax.get_xlabel().endswith("\nevery cell shown: oversubscribed")
    marks = [t.get_text() for t in ax.texts]
    assert marks[:3] == drawn["_marks"].tolist() and not any("oversub" in m for m in marks)


def test_a_panel_with_one_x_value_is_left_out_and_an_empty_figure_is_not_drawn():
    kind = figures.REGISTRY["throughput_batch"]  # panels: model · dataset × strategy
    rows = [
        {"strategy": st, "batch_size": b, "world_size": 1, "workers": 1, "throughput_mean": 10.0}
        for st in ("torch", "torch-ddp", "tf")
        for b in ((64, 256) if st == "torch-ddp" else (256,))
    ]
    d, left_out = shown(kind, Study(scaling(rows)))
    assert set(d["strategy"]) == {"torch-ddp"}
    assert left_out == "2 panels with one batch size left out: torch, tf"
    one = [r for r in rows if r["batch_size"] == 256]
    assert shown(kind, Study(scaling(one))) == ("batch size was not varied: 256 only", None)


def test_beyond_8_strategies_a_panel_per_framework_family():
    kind = figures.REGISTRY["throughput"]  # hue: strategy; one panel per model and dataset
    rows = [
        {"strategy": st, "world_size": n, "workers": n, "throughput_mean": 10.0 * (i + 1) * n}
        for i, st in enumerate(STRATEGIES) for n in (1, 2)
    ]  # fmt: skip
    d = scaling(rows)
    assert select.lines_per_panel(d, kind) == 14
    speed = d.groupby(["model", "dataset", "strategy"])["throughput_mean"].max()
    (part,) = select.parts(d, kind, speed)
    assert part.kind.col == ("dataset", "family") and set(part.data["strategy"]) == set(STRATEGIES)
    assert select.lines_per_panel(part.data, part.kind) <= select.MAX_LINES
    assert "one panel per framework family (deepspeed, horovod, tensorflow, torch)" in part.note
    fig = kind.draw(part.data, part.kind)
    titles = sorted(ax.get_title() for ax in fig.axes)
    assert titles == ["deepspeed family", "horovod family", "tensorflow family", "torch family"]
    few = d[d["strategy"].isin(STRATEGIES[:8])]
    assert select.parts(few, kind, speed)[0].note is None  # 8 lines: one panel, as before


def test_the_heat_map_prints_every_cell_or_leaves_itself_out():
    kind = figures.REGISTRY["efficiency_heatmap"]
    rows = [
        {"strategy": st, "world_size": n, "workers": n, "throughput_mean": 10.0 * n,
         "speedup": 0.9 * n, "efficiency": 0.9 - 0.01 * i, "baseline_note": ""}
        for i, st in enumerate(STRATEGIES) for n in (2, 4, 8)
    ]  # fmt: skip
    d = scaling(rows)
    study = Study(pd.concat([d, d.assign(world_size=1, workers=1, efficiency=1.0)]))
    table, left_out = shown(kind, study)
    assert left_out is None and len(table) == 3 * len(STRATEGIES)
    fig = kind.draw(table, kind)
    (ax,) = [a for a in fig.axes if a.get_title(loc="left")]
    assert len(ax.texts) == 3 * len(STRATEGIES)  # the number in every cell
    assert {t.get_text() for t in ax.texts} >= {"90", "77"}
    assert fig.get_size_inches()[1] >= len(STRATEGIES) * 0.25  # cells stay a legible height
    many = pd.concat([d.assign(batch_size=b) for b in range(1, 5)])  # 56 rows: too many
    study = Study(pd.concat([many, many.assign(world_size=1, workers=1, efficiency=1.0)]))
    why, _ = shown(kind, study)
    assert isinstance(why, str) and "too small to read" in why and "scaling table" in why
