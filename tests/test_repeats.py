"""Repeats a study buys (`trainscale.analysis.repeats.decide`, config `repeats: {min, max}`):
which cells get one more repeat, from a scaling table of synthetic records fitted by the
study's own model (`interval.fit`)."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pandas as pd
import pytest

from trainscale.analysis import interval, repeats

from conftest import ROOT, run_test_study, snakemake

#: Each run's within-run variance (about 1 %) and its batch means.
WITHIN, BLOCKS = 1e-4, 8


def panel(runs: dict[str, list[float]], workers: int = 1, taken: int | None = None):
    """A scaling table of one panel: each cell's runs as throughputs (samples/s)."""
    names = list(runs)
    width = max(len(v) for v in runs.values())
    y = np.full((len(names), width), np.nan)
    for i, values in enumerate(runs.values()):
        y[i, : len(values)] = np.log(values)
    fit = interval.fit(y, np.where(np.isfinite(y), WITHIN, np.nan), np.full(y.shape, BLOCKS))
    table = pd.DataFrame({k: np.asarray(v, float) for k, v in fit.columns().items()})
    return table.assign(
        throughput_log_mean=fit.ybar, throughput_mean=np.exp(fit.ybar),
        interval_method="model", stratum="s", prior_run_var=np.nan, model="m", dataset="d",
        world_size=workers, seq_len=0, logical=False, cell=[f"{c}/w{workers}" for c in names],
        repeats_taken=[len(v) if taken is None else taken for v in runs.values()],
    )  # fmt: skip


def decided(table: pd.DataFrame, low: int = 2, high: int = 6) -> dict[str, tuple[bool, str]]:
    out = repeats.decide(table, repeats.Repeats(low, high), equivalence=0.02)
    assert list(out.columns) == repeats.COLUMNS
    rows = zip(out["cell"], out["more"], out["repeats_reason"], strict=True)
    return {c: (m, why) for c, m, why in rows}


def test_a_cell_far_behind_is_resolved_at_min():
    got = decided(panel({"a": [100, 101], "b": [50, 50.5]}))
    assert got["a/w1"] == (False, "the only cell that could be the fastest: resolved")
    assert not got["b/w1"][0] and got["b/w1"][1].startswith("slower than the panel's fastest")


def test_a_near_tie_buys_one_more_repeat_each_and_stops_at_max():
    tie = {"a": [100, 112, 95], "b": [98, 90, 108], "c": [40, 41, 40]}
    got = decided(panel(tie))
    assert got["a/w1"][0] and got["b/w1"][0] and not got["c/w1"][0]
    assert "one more repeat" in got["a/w1"][1]
    at_max = decided(panel(tie, taken=6))
    assert not any(m for m, _ in at_max.values())
    assert "not resolved at repeats.max 6" in at_max["a/w1"][1]


def test_equivalent_cells_stop():
    quiet = {"a": [100.0, 100.1, 99.9, 100.0], "b": [100.0, 99.9, 100.1, 100.0]}
    got = decided(panel(quiet))
    assert got["a/w1"] == got["b/w1"]
    assert got["a/w1"][0] is False and "equivalent within ±2 %" in got["a/w1"][1]


def test_panels_decide_apart_and_the_looks_share_the_error():
    both = pd.concat([panel({"a": [100, 101], "b": [50, 50.5]}),
                      panel({"a": [100, 112, 95], "b": [98, 90, 108]}, workers=2)])  # fmt: skip
    got = decided(both)
    assert [got[c][0] for c in ("a/w1", "b/w1", "a/w2", "b/w2")] == [False, False, True, True]
    assert repeats.Repeats(2, 6).look_level() == pytest.approx(1 - 0.05 / 4)
    assert "98.75 % simultaneous" in got["b/w1"][1]
    assert math.isclose(repeats.Repeats(2, 3).look_level(), 0.95)


def test_the_report_says_per_panel_how_many_repeats_each_cell_took_and_why():
    table = panel({"a": [100, 101], "b": [50, 50.5]}).assign(strategy=["torch", "torch-ddp"])
    decided = repeats.decide(table, repeats.Repeats(2, 4), 0.02).set_index("cell")
    table = table.assign(repeats_reason=table["cell"].map(decided["repeats_reason"]))
    (line,) = repeats.panel_lines(table).values()
    assert line.startswith("torch 2: the only cell that could be the fastest: resolved; ")
    assert "torch-ddp 2: slower than the panel's fastest (97.5 % simultaneous)" in line
    assert repeats.panel_lines(table.drop(columns="repeats_taken")) == {}


def test_decide_names_missing_columns():
    with pytest.raises(ValueError, match="repeats_taken"):
        repeats.decide(panel({"a": [1.0, 1.0]}).drop(columns="repeats_taken"),
                       repeats.Repeats(2, 3), 0.02)  # fmt: skip


@pytest.mark.slow
def test_a_study_with_repeats_min_max_races_through_snakemake(tmp_path):
    """.test/tune.yaml as a study (repeats {min: 2, max: 3}; torch-ddp's repeat 1 fails by a
    planted fault): a dry-run plans the first look as a checkpoint; the study runs 2 repeats
    of both cells, the look asks a third of the cells it leaves open, and the tables read
    every repeat made, with each cell's repeats and why."""
    cfg = str(ROOT / ".test" / "tune.yaml")
    dry = snakemake(tmp_path, "-n", "--quiet", "host", "--configfile", cfg)
    assert dry.returncode == 0, dry.stderr
    assert "repeats_look" in dry.stdout and "checkpoint jobs" in dry.stdout + dry.stderr
    results, _ = run_test_study(tmp_path, "tune", "scaling.csv", "summary.txt")
    (look,) = [json.loads(p.read_text()) for p in (results / "repeats").glob("look~*.json")]
    assert look["look"] == 1 and look["level"] == pytest.approx(0.95)
    asked = {c["cell"]: c["more"] for c in look["cells"]}
    assert len(asked) == 2 and sorted(r.rsplit("/", 1)[1] for r in look["next"]) == sorted(
        "repeat~2" for more in asked.values() if more
    )
    made = {p.parent.relative_to(results / "runs").as_posix()
            for p in (results / "runs").glob("**/metrics.json")}  # fmt: skip
    assert made == {f"{c}/repeat~{i}" for c, more in asked.items() for i in range(2 + more)}
    rows = list(csv.DictReader((results / "scaling.csv").open()))
    for row in rows:
        assert int(row["repeats_taken"]) == int(row["runs"]) in (2, 3) and row["repeats_reason"]
    runs = list(csv.DictReader((results / "runs.csv").open()))
    assert len(runs) == len(made)
    summary = (results / "summary.txt").read_text()
    assert summary.count("    repeats taken: torch ") == 1 and f"{len(made)} runs in 2" in summary
